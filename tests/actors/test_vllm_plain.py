"""Which layout vLLM's CPU linear layers get (``forge_nb.actors.engine.plain``): plain weights for small
checkpoints, oneDNN's packed ones above; the load paths themselves run in tests/actors/test_generator*.py
(the tiny model in-process, plain; vLLM's own processes with ``cpu_linear="packed"``)."""

from __future__ import annotations

import pytest
import torch

from forge_nb.actors.engine import plain
from forge_nb.models import build_tiny_model


def test_auto_keeps_plain_weights_for_small_checkpoints_only(tmp_path):
    tiny = build_tiny_model(tmp_path / "tiny")
    assert plain.choose(str(tiny), "auto") == "plain"
    big = tmp_path / "big"
    big.mkdir()
    (big / "config.json").write_text("{}")
    with open(big / "model-00001-of-00002.safetensors", "wb") as f:  # sparse: no bytes written
        f.truncate(plain.PLAIN_MAX_BYTES + 1)
    assert plain.choose(str(big), "auto") == "packed"
    assert plain.choose(str(big), "plain") == "plain"
    assert plain.choose(str(tiny), "packed") == "packed"


def test_an_unknown_layout_is_refused_with_the_choices(tmp_path):
    with pytest.raises(ValueError, match="cpu_linear='fast': use 'auto'.*'plain' or 'packed'"):
        plain.choose(str(tmp_path), "fast")


class _CountingParameter(torch.nn.Parameter):
    """A Parameter subclass with a Python ``__torch_function__``, as vLLM's parameters have."""

    calls = 0

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.calls += 1
        return super().__torch_function__(func, types, args, kwargs or {})


def test_plain_linear_multiplies_with_the_parameter_as_loaded_without_its_python_detour():
    weight = _CountingParameter(torch.randn(6, 4), requires_grad=False)
    x, bias = torch.randn(3, 4), torch.randn(6)
    expected = x @ weight.detach().clone().T + bias
    _CountingParameter.calls = 0
    assert torch.allclose(plain._linear(x, weight, bias), expected)
    assert _CountingParameter.calls == 0
    with torch.no_grad():  # a new version copied in place, as a load does
        weight.copy_(torch.ones(6, 4))
    assert torch.allclose(plain._linear(x, weight), x.sum(dim=1, keepdim=True).expand(3, 6))
