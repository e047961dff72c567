"""torchtitan's Qwen3, loaded from the HF tiny model through Qwen3StateDictAdapter, matches transformers.

In-process and CPU-only: torchtitan's forward runs on CPU (its backward does not, see
``forge_nb/actors/training/titan.py``), which is enough to check the architecture mapping, the weight names both
ways, and the padding-aware forward the trainer's torchtitan path uses on CUDA.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import pytest
import torch

from forge_nb.models import build_tiny_model

pytestmark = pytest.mark.timeout(180)

# ImportError too: on an older torch (the lent GPU's 2.11) torchtitan is there but its qwen3 does not import.
pytest.importorskip("torchtitan.models.qwen3", reason="torchtitan 0.3 needs torch >= 2.13", exc_type=ImportError)

SHAPE = (3, 16)


@pytest.fixture(scope="module", autouse=True)
def eager_flex_attention() -> Iterator[None]:
    """Swap torchtitan's torch.compile'd FlexAttention and mask builder for the eager ones they wrap.

    Compiling them costs 30-90 s on two cores per run with a cold cache; the eager kernel is the
    reference the compiled one is tested against upstream, and parity here is about the model's math and
    weight names. The patched names are torchtitan internals: if they move, this fails loudly.
    """
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    from torchtitan.models.common import attention

    with pytest.MonkeyPatch.context() as patch, warnings.catch_warnings():
        patch.setattr(attention.FlexAttention, "_compiled_flex_attn", flex_attention)
        patch.setattr(attention, "_compiled_create_block_mask", create_block_mask)
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        yield


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, object]:
    from forge_nb.actors.training.policy_model import PolicyModel

    path = str(build_tiny_model(tmp_path_factory.mktemp("titan") / "tiny"))
    cpu = torch.device("cpu")
    titan = PolicyModel(path, "torchtitan", cpu, pad_id=0)
    hf = PolicyModel(path, "transformers", cpu, pad_id=0)
    titan.module.eval()
    hf.module.eval()
    return titan, hf


def test_titan_logprobs_match_transformers(models: tuple) -> None:
    from forge_nb.actors.training.policy_model import response_logprobs

    titan, hf = models
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(2, 10, SHAPE, generator=g)
    with torch.no_grad():
        lp_titan = response_logprobs(titan.logits(tokens, 8), tokens, 8)
        lp_hf = response_logprobs(hf.logits(tokens, 8), tokens, 8)
    assert lp_titan.shape == (SHAPE[0], SHAPE[1] - 8)
    torch.testing.assert_close(lp_titan, lp_hf, atol=1e-4, rtol=0)


def test_titan_masks_left_padding_like_transformers(models: tuple) -> None:
    from forge_nb.actors.training.policy_model import response_logprobs

    titan, hf = models
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(2, 10, SHAPE, generator=g)
    tokens[0, :5] = 0  # left padding of a shorter prompt
    with torch.no_grad():
        lp_titan = response_logprobs(titan.logits(tokens, 8), tokens, 8)
        lp_hf = response_logprobs(hf.logits(tokens, 8), tokens, 8)
        alone = response_logprobs(hf.logits(tokens[:1, 5:], 3), tokens[:1, 5:], 3)
    torch.testing.assert_close(lp_titan, lp_hf, atol=1e-4, rtol=0)
    torch.testing.assert_close(lp_titan[:1], alone, atol=1e-4, rtol=0)


def test_titan_batches_keep_their_width(models: tuple) -> None:
    """Padding every row shares is dropped for transformers only: FlexAttention compiles for each length."""
    titan, hf = models
    tokens = torch.randint(2, 10, SHAPE, generator=torch.Generator().manual_seed(2))
    tokens[:, :3] = 0
    kept, request_len = titan.without_shared_padding(tokens, 8)
    assert kept is tokens and request_len == 8
    assert hf.without_shared_padding(tokens, 8)[1] == 5


def test_titan_weights_map_back_to_hf_names(models: tuple) -> None:
    titan, hf = models
    assert titan.engine == "torchtitan" and "layers.0.attention.qkv_linear.wq.weight" in titan.module.state_dict()
    back = titan.hf_state_dict()
    reference = hf.hf_state_dict()
    assert back.keys() == reference.keys()
    for name, value in reference.items():
        assert torch.equal(back[name], value), name


def test_torchtitan_cannot_train_on_cpu_and_auto_falls_back() -> None:
    from forge_nb.actors.training.policy_model import choose_engine

    engine, reason = choose_engine("auto", torch.device("cpu"), "qwen3")
    assert engine == "transformers" and "FlexAttention" in reason
    with pytest.raises(RuntimeError, match="cannot run here"):
        choose_engine("torchtitan", torch.device("cpu"), "qwen3")
