"""torchtitan's Qwen3 built from a Hugging Face folder: config, weights through Qwen3StateDictAdapter, forward.

torchtitan ships Qwen3 only as named flavors ("0.6B", "1.7B", ...); a local model (the tests' tiny one, a
fine-tuned folder) has no flavor, so :func:`titan_config` rebuilds the same architecture from the folder's
``config.json`` with torchtitan's own layer builder. Weights are read from the folder's safetensors and
renamed by ``Qwen3StateDictAdapter.from_hf``; ``to_hf`` maps them back for torchstore and vLLM.

Where this runs (torchtitan 0.3.0, measured):

* forward works on CPU and CUDA, and matches transformers' Qwen3 to ~1e-7 (``tests/actors/test_titan_parity.py``);
* training needs CUDA: torchtitan 0.3 language models attend with FlexAttention or varlen attention only,
  and FlexAttention has no backward on CPU;
* ``torchtitan.models.qwen3`` needs torch >= 2.13 (on torch 2.11 it fails to import
  ``DataParallelMeshDims`` from ``torch.distributed.fsdp``).

:func:`why_not_trainable` says which of these applies, so the trainer can fall back to transformers.
We use torchtitan's model definitions, not its ``ForgeEngine``: the engine builds models from named
flavors and owns the optimizer, checkpointer and device choice ("cuda" unconditionally), which would leave
two training loops to keep in step; the rest of the trainer (FSDP2, optimizer, checkpoints) is shared
with the transformers path and tested on CPU.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

__all__ = ["TitanQwen3", "titan_config", "why_not_trainable"]


def why_not_trainable(device: torch.device, model_type: str) -> str | None:
    """Why torchtitan cannot train this model on ``device``, or None when it can (as far as we know)."""
    if model_type != "qwen3":
        return f"forge_nb's torchtitan path covers Qwen3 only (this model is {model_type!r})"
    if device.type != "cuda":
        return (
            "torchtitan 0.3 language models attend with FlexAttention/varlen only, and FlexAttention "
            "has no backward on CPU"
        )
    try:
        import torchtitan.models.qwen3  # noqa: F401
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] in ("torchtitan", "triton"):
            return f"{e.name} is not installed (pip install torchtitan==0.3.0 triton)"
        return f"torchtitan.models.qwen3 does not import (ModuleNotFoundError: {e})"
    except Exception as e:  # ImportError, or an AttributeError deep in torch: any means "cannot"
        return (
            f"torchtitan.models.qwen3 does not import ({type(e).__name__}: {e}); torchtitan 0.3 needs "
            f"torch >= 2.13, this is torch {torch.__version__}"
        )
    return None


def titan_config(hf_config: dict[str, Any], attn_backend: str = "flex") -> Any:
    """A ``Qwen3Model.Config`` with the architecture of a Hugging Face Qwen3 ``config.json``."""
    # torchtitan's layer builder and init tables are module-private; they are what its own flavors use,
    # so the model we build is the one a named flavor of the same shape would be.
    import torchtitan.models.qwen3 as q3
    from torchtitan.models.common import CosSinRoPE, Embedding, Linear

    c = hf_config
    eps = c.get("rms_norm_eps", 1e-6)
    if abs(eps - q3._EPS) > 1e-12:
        raise ValueError(
            f"config.json has rms_norm_eps={eps}, but torchtitan's Qwen3 fixes it at {q3._EPS}; "
            "train this model with training={'engine': 'transformers'}"
        )
    rope = c.get("rope_parameters") or {}
    if rope.get("rope_type", "default") != "default":
        raise ValueError(
            f"config.json asks for rope_type={rope['rope_type']!r}; forge_nb maps only default RoPE to "
            "torchtitan. Use training={'engine': 'transformers'}"
        )
    theta = rope.get("rope_theta", c.get("rope_theta", 10000.0))
    dim, vocab, head_dim = c["hidden_size"], c["vocab_size"], c.get("head_dim") or (
        c["hidden_size"] // c["num_attention_heads"]
    )
    tied = bool(c.get("tie_word_embeddings", False))
    return q3.Qwen3Model.Config(
        vocab_size=vocab,
        dim=dim,
        norm=q3._qwen3_norm(dim),
        enable_weight_tying=tied,
        tok_embeddings=Embedding.Config(
            num_embeddings=vocab,
            embedding_dim=dim,
            param_init=q3._EMBEDDING_SKIP_INIT if tied else q3._EMBEDDING_INIT,
        ),
        lm_head=Linear.Config(in_features=dim, out_features=vocab, param_init=q3._LINEAR_INIT),
        layers=q3._build_qwen3_layers(
            n_layers=c["num_hidden_layers"],
            dim=dim,
            n_heads=c["num_attention_heads"],
            n_kv_heads=c.get("num_key_value_heads") or c["num_attention_heads"],
            head_dim=head_dim,
            hidden_dim=c["intermediate_size"],
            attn_backend=attn_backend,
            rope=CosSinRoPE.Config(dim=head_dim, max_seq_len=c["max_position_embeddings"], theta=theta),
        ),
    )


class TitanQwen3:
    """A torchtitan Qwen3 loaded from a Hugging Face folder, plus its name adapter.

    ``module`` is the plain ``Qwen3Model`` (FSDP shards it like any module); :meth:`logits` supplies the
    position ids and the document mask torchtitan's attention needs.
    """

    def __init__(self, path: str | Path, device: torch.device, attn_backend: str = "flex"):
        from torchtitan.models.qwen3 import Qwen3StateDictAdapter

        path = Path(path)
        self.hf_config: dict[str, Any] = json.loads((path / "config.json").read_text())
        self.config = titan_config(self.hf_config, attn_backend)
        with torch.device("meta"):
            module = self.config.build()
        module.to_empty(device=device)
        with torch.no_grad():
            module.init_states(buffer_device=device)  # RoPE cache; weights come next
        self.adapter = Qwen3StateDictAdapter(self.config, str(path))
        native = self.adapter.from_hf(_read_safetensors(path))
        missing, unexpected = module.load_state_dict(native, strict=False)
        tied_ok = {"tok_embeddings.weight"} if self.config.enable_weight_tying else set()
        if set(missing) - tied_ok or unexpected:
            raise ValueError(
                f"weights in {str(path)!r} do not fit torchtitan's Qwen3: missing {sorted(missing)[:5]}, "
                f"unexpected {sorted(unexpected)[:5]}"
            )
        self.module: torch.nn.Module = module

    def blocks(self) -> list[torch.nn.Module]:
        return list(self.module.layers.values())  # type: ignore[union-attr, operator]

    def logits(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Logits [B, L, V]. Positions restart at 0 where a row's real tokens begin, which torchtitan's
        packed-document mask reads as a document start: left padding is never attended."""
        masks = self.module.get_attention_masks(positions)  # type: ignore[operator]
        return self.module(tokens, positions=positions, attention_masks=masks)

    def to_hf(self, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return self.adapter.to_hf(state_dict)


def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {str(path)!r}; torchtitan loads only safetensors weights")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(str(file)))
    return state
