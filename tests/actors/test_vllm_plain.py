"""Which layout vLLM's CPU linear layers get (``forge_nb.actors._vllm_plain``): plain weights for small
checkpoints, oneDNN's packed ones above; the load paths themselves run in tests/actors/test_generator*.py
(the tiny model in-process, plain; vLLM's own processes with ``cpu_linear="packed"``)."""

from __future__ import annotations

import pytest

from forge_nb.actors import _vllm_plain
from forge_nb.models import build_tiny_model


def test_auto_keeps_plain_weights_for_small_checkpoints_only(tmp_path):
    tiny = build_tiny_model(tmp_path / "tiny")
    assert _vllm_plain.choose(str(tiny), "auto") == "plain"
    big = tmp_path / "big"
    big.mkdir()
    (big / "config.json").write_text("{}")
    with open(big / "model-00001-of-00002.safetensors", "wb") as f:  # sparse: no bytes written
        f.truncate(_vllm_plain.PLAIN_MAX_BYTES + 1)
    assert _vllm_plain.choose(str(big), "auto") == "packed"
    assert _vllm_plain.choose(str(big), "plain") == "plain"
    assert _vllm_plain.choose(str(tiny), "packed") == "packed"


def test_an_unknown_layout_is_refused_with_the_choices(tmp_path):
    with pytest.raises(ValueError, match="cpu_linear='fast': use 'auto'.*'plain' or 'packed'"):
        _vllm_plain.choose(str(tmp_path), "fast")
