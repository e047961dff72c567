"""A generator's process imports vLLM without the optional packages a CPU generator never uses, and answers
transformers' ``packages_distributions()`` from the machine's cache (forge_nb.actors.engine.preimport,
forge_nb.system.dist_cache).

The import itself runs in fresh interpreters, as a generator's process does; the Generator tests run the real
engine after it (tests/actors/test_generator.py)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from forge_nb.actors.engine import preimport
from forge_nb.system import dist_cache

pytestmark = pytest.mark.timeout(300)

IMPORT = """
import json, sys, importlib.metadata
from forge_nb.actors.engine import preimport
preimport.start({**json.loads(sys.argv[1])}).join()
import vllm.v1.engine.llm_engine  # setup()'s own import: an error from the thread shows here
from vllm.triton_utils import HAS_TRITON
from vllm.tracing import is_otel_available
WATCHED = ("triton", "grpc", "opentelemetry.exporter.otlp", "vllm.v1.worker.cpu_worker")
print(json.dumps({"modules": sorted(m for m in WATCHED if m in sys.modules),
                  "has_triton": HAS_TRITON, "otel": is_otel_available(),
                  "standard_again": importlib.metadata.packages_distributions.__module__ == "importlib.metadata"}))
"""


def import_engine(tmp_path: Path, engine_args: dict, **env: str) -> tuple[dict, str]:
    """What a generator's process has imported once its vLLM import is done, and what it logged."""
    run_env = {**os.environ, "FORGE_NB_CACHE_DIR": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1", **env}
    out = subprocess.run([sys.executable, "-c", IMPORT, json.dumps(engine_args)], capture_output=True, text=True,
                         timeout=280, env=run_env, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM")
def test_a_cpu_generator_imports_vllm_without_triton_and_the_trace_exporters(tmp_path):
    if preimport._triton_has_cpu_backend() or importlib.util.find_spec("triton") is None:
        pytest.skip("this triton has a CPU backend (vLLM uses it) or is not installed: nothing to hide")
    found, log = import_engine(tmp_path, {})
    # vLLM decided as it does with triton installed: no CPU backend, no triton; and no tracing without an endpoint
    assert found == {"modules": ["vllm.v1.worker.cpu_worker"], "has_triton": False, "otel": False,
                     "standard_again": True}
    assert "Triton not available" not in log  # torch's note for each op vLLM registers, filtered
    cached = list((tmp_path / "cache" / "packages-distributions").glob("*.json"))
    assert len(cached) == 1  # transformers' packages_distributions() went through the cache

    # FORGE_NB_VLLM_LEAN=0 hides nothing and caches nothing: vLLM then imports both (which arguments keep which
    # package is the next test's; a fresh vLLM import costs ~13 s of this machine's CPU, so one control only)
    found, _ = import_engine(tmp_path / "plain", {}, FORGE_NB_VLLM_LEAN="0")
    assert {"triton", "grpc"} <= set(found["modules"]) and found["has_triton"] is False
    assert not (tmp_path / "plain" / "cache" / "packages-distributions").exists()


def test_what_is_hidden_follows_the_engine_arguments_and_the_device(monkeypatch):
    monkeypatch.delenv("FORGE_NB_VLLM_LEAN", raising=False)
    for name in ("triton", "opentelemetry.exporter.otlp"):
        monkeypatch.delitem(sys.modules, name, raising=False)  # as in a fresh generator's process
    monkeypatch.setattr(preimport, "_triton_has_cpu_backend", lambda: False)
    assert preimport.unused_optional({}, cuda=False) == ["opentelemetry.exporter.otlp", "triton"]
    assert preimport.unused_optional(None, cuda=True) == ["opentelemetry.exporter.otlp"]
    assert preimport.unused_optional({"otlp_traces_endpoint": "http://collector:4318"}, cuda=False) == ["triton"]
    monkeypatch.setattr(preimport, "_triton_has_cpu_backend", lambda: True)
    assert preimport.unused_optional({}, cuda=False) == ["opentelemetry.exporter.otlp"]
    monkeypatch.setenv("FORGE_NB_VLLM_LEAN", "0")
    assert preimport.unused_optional({}, cuda=False) == []


def test_a_hidden_package_imports_as_not_installed_inside_the_block_only():
    name = "forge_nb_test_hidden_pkg"
    assert importlib.util.find_spec("json") is not None
    with preimport.hidden([name, "json.tool"]):
        with pytest.raises(ModuleNotFoundError):
            __import__("json.tool")
        assert importlib.util.find_spec("json.tool") is None
    assert name not in sys.modules and sys.modules.get("json.tool", True) is not None
    __import__("json.tool")  # found as usual again


def test_packages_distributions_answers_from_the_cache_file_keyed_on_where_python_looks(tmp_path, monkeypatch):
    monkeypatch.setenv("FORGE_NB_CACHE_DIR", str(tmp_path))
    standard = importlib.metadata.packages_distributions
    with dist_cache.cached_packages_distributions():
        first = importlib.metadata.packages_distributions()
    assert importlib.metadata.packages_distributions is standard
    assert first == standard()
    (written,) = (tmp_path / "packages-distributions").glob("*.json")

    written.write_text(json.dumps({"only_in_the_cache": ["a-dist"]}))  # proves the file is what answers
    with dist_cache.cached_packages_distributions():
        answer = importlib.metadata.packages_distributions()
        answer["only_in_the_cache"].append("changed by a caller")
        assert importlib.metadata.packages_distributions() == {"only_in_the_cache": ["a-dist"]}  # a copy each

    (tmp_path / "site").mkdir()
    monkeypatch.syspath_prepend(str(tmp_path / "site"))  # somewhere else to look: another key, computed again
    with dist_cache.cached_packages_distributions():
        assert importlib.metadata.packages_distributions() == standard()
    assert len(list((tmp_path / "packages-distributions").glob("*.json"))) == 2

    key = dist_cache._key()
    (tmp_path / "site" / "notes.txt").write_text("a run's file")  # not a distribution: the same key
    (tmp_path / "site" / "runs").mkdir()
    assert dist_cache._key() == key
    (tmp_path / "site" / "a_dist-1.0.dist-info").mkdir()  # a distribution installed there: another key
    assert dist_cache._key() != key

    monkeypatch.undo()  # sys.path as it was: the first key again
    monkeypatch.setenv("FORGE_NB_CACHE_DIR", str(tmp_path))
    written.write_text("{not json")  # a damaged file is computed again and written whole
    with dist_cache.cached_packages_distributions():
        assert importlib.metadata.packages_distributions() == standard()
    assert json.loads(written.read_text()) == standard()

    monkeypatch.setenv("FORGE_NB_CACHE_DIR", "")  # caching turned off: the standard function
    with dist_cache.cached_packages_distributions():
        assert importlib.metadata.packages_distributions is standard


def test_the_cache_keeps_its_newest_files(tmp_path, monkeypatch):
    monkeypatch.setenv("FORGE_NB_CACHE_DIR", str(tmp_path))
    folder = tmp_path / "packages-distributions"
    folder.mkdir()
    for i in range(dist_cache.KEEP + 3):  # other environments' files, oldest first
        old = folder / f"other{i:02d}.json"
        old.write_text("{}")
        os.utime(old, ns=(i * 10**9, i * 10**9))
    with dist_cache.cached_packages_distributions():
        importlib.metadata.packages_distributions()  # a miss: computed and written
    kept = {p.name for p in folder.glob("*.json")}
    # the one just written, and the newest others
    assert kept == {f"{dist_cache._key()}.json"} | {f"other{i:02d}.json" for i in range(4, dist_cache.KEEP + 3)}
