"""A tiny model is built once per machine and copied into each run directory from the cache after that.

Each case runs ``build_tiny_model`` in a fresh interpreter (as a spawn's kernel does), with the cache in a
folder of its own, and says whether that process imported transformers: a copy from the cache does not.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from forge_nb.models import STAMP, TinyModelConfig

pytestmark = pytest.mark.timeout(300)

BUILD = """
import json, sys
from forge_nb.models import TinyModelConfig, build_tiny_model
build_tiny_model(sys.argv[1], TinyModelConfig(**json.loads(sys.argv[2])))
print(json.dumps({"transformers": "transformers" in sys.modules}))
"""


def build(path: Path, cache: str, **config) -> bool:
    """Build the tiny model of ``config`` into ``path`` in a new process; whether it imported transformers."""
    env = {"FORGE_NB_CACHE_DIR": cache, "PATH": "/usr/bin:/bin", "HOME": str(path.parent)}
    out = subprocess.run([sys.executable, "-c", BUILD, str(path), json.dumps(config)], capture_output=True,
                         text=True, timeout=240, env=env, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])["transformers"]


def files(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


def test_the_second_build_is_a_copy_of_the_first_without_transformers(tmp_path):
    cache = tmp_path / "cache"
    assert build(tmp_path / "a", str(cache)) is True  # built: into the cache, then copied
    entries = list((cache / "tiny-models").iterdir())
    assert len(entries) == 1 and (entries[0] / STAMP).exists(), entries  # no scratch folder left beside it
    assert build(tmp_path / "b", str(cache)) is False  # copied: transformers never imported
    assert files(tmp_path / "a") == files(tmp_path / "b")
    assert {"config.json", "model.safetensors", "tokenizer.json", STAMP} <= set(files(tmp_path / "b"))

    # another config is another entry
    assert build(tmp_path / "c", str(cache), alphabet="xyz") is True
    assert len(list((cache / "tiny-models").iterdir())) == 2
    assert json.loads((tmp_path / "c" / STAMP).read_text())["alphabet"] == "xyz"


def test_a_damaged_cache_entry_is_built_again(tmp_path):
    cache = tmp_path / "cache"
    build(tmp_path / "a", str(cache))
    (entry,) = (cache / "tiny-models").iterdir()
    (entry / STAMP).unlink()  # as a copy cut short would leave it
    (entry / "model.safetensors").write_bytes(b"not a model")
    assert build(tmp_path / "b", str(cache)) is True
    assert files(tmp_path / "a") == files(tmp_path / "b")


def test_without_a_usable_cache_the_model_is_built_in_place(tmp_path):
    blocked = tmp_path / "a-file"
    blocked.write_text("the cache folder's parent is a file: nothing can be written under it")
    assert build(tmp_path / "a", str(blocked)) is True
    assert build(tmp_path / "b", "") is True  # turned off
    assert files(tmp_path / "a") == files(tmp_path / "b")
    assert blocked.is_file() and not (tmp_path / "b" / "tiny-models").exists()
    assert json.loads((tmp_path / "b" / STAMP).read_text()) == json.loads(
        json.dumps({f: getattr(TinyModelConfig(), f) for f in TinyModelConfig.__slots__}))
