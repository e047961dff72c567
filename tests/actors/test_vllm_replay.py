"""Replaying a recorded ``load_weights``: what it copies and fills, and when it refuses to record.

The models here are torch modules whose ``load_weights`` does what vLLM's do for a Qwen3 (q, k and v into
one fused parameter by narrow + copy_, the vocabulary padded with fill_); the real engine's loads go
through the same code in ``tests/actors/test_generator.py`` (versions 2 to 4 are replays there, each
checked by what the model then generates).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from forge_nb.actors.engine import replay as engine_replay


class Fused(torch.nn.Module):
    """q, k and v in one parameter; an embedding padded to 8 rows."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Parameter(torch.zeros(6, 4))
        self.embed = torch.nn.Parameter(torch.ones(8, 4))
        self.loads = 0

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.loads += 1
        for name, tensor in weights:
            if name == "embed":
                self.embed[: tensor.shape[0]].data.copy_(tensor)
                self.embed[tensor.shape[0]:].data.fill_(0)
            else:
                shard = "qkv".index(name)
                self.qkv.data.narrow(0, 2 * shard, 2).copy_(tensor.narrow(0, 0, 2))


class Scaled(Fused):
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.loads += 1
        for name, tensor in weights:
            if name == "embed":
                self.embed[: tensor.shape[0]].data.copy_(tensor * 2)  # arithmetic: not a view of the version's


def version(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    flat = torch.randn(3 * 8 + 20, generator=g)  # views of one buffer, as a mapped version's are
    out = {name: flat[8 * i: 8 * (i + 1)].view(2, 4) for i, name in enumerate("qkv")}
    return out | {"embed": flat[24:].view(5, 4)}


def loaded_by_the_model(model_cls: type[Fused], state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    model = model_cls()
    model.load_weights(iter(state_dict.items()))
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_later_versions_are_replayed_and_land_as_the_models_own_load() -> None:
    model = Fused()
    replay = engine_replay.load(model, version(1), None)
    assert replay is not None and model.loads == 1
    model.embed.data[6:].fill_(5.0)  # the padding is written again by the replay, too
    for seed in (2, 3):
        assert engine_replay.load(model, version(seed), replay) is replay
        assert model.loads == 1  # replayed: the model's load_weights did not run
        expected = loaded_by_the_model(Fused, version(seed))
        assert all(torch.equal(model.state_dict()[k], v) for k, v in expected.items())


def test_a_version_of_another_shape_or_a_swapped_parameter_is_loaded_by_the_model_again() -> None:
    model = Fused()
    replay = engine_replay.load(model, version(1), None)
    other = version(2) | {"embed": torch.randn(3, 4)}  # fewer vocabulary rows
    again = engine_replay.load(model, other, replay)
    assert model.loads == 2 and again is not None and again is not replay
    assert torch.equal(model.embed.data[:3], other["embed"]) and (model.embed.data[3:] == 0).all()
    model.qkv.data = torch.zeros(6, 4)  # new storage: the recorded destinations no longer reach it
    third = engine_replay.load(model, version(3), again)
    assert model.loads == 3 and third is not again
    assert torch.equal(model.qkv.data[:2], version(3)["q"])


def test_a_load_that_computes_is_never_replayed() -> None:
    model = Scaled()
    assert engine_replay.load(model, version(1), None) is None
    assert engine_replay.load(model, version(2), None) is None and model.loads == 2
    assert torch.equal(model.embed.data[:5], version(2)["embed"] * 2)
