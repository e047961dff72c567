"""vLLM's own CPU kernels for RMS norm, in the Generator's eager CPU engine.

vLLM routes RMSNorm through its IR ops (``vllm.ir.ops.rms_norm`` and ``fused_add_rms_norm``) and on CPU
picks their ``native`` implementation: five to eight torch calls written for torch.compile to fuse. The
CPU engine runs eager (``enforce_eager``: inductor's first compile is seconds of g++ at start, see
:mod:`forge_nb.actors.engine.inproc`), so each norm is that many small ops, 6.4% of the generator's CPU in
the quickstart (py-spy). vLLM's CPU build ships a C kernel for each (``torch.ops._C.rms_norm`` and
``fused_add_rms_norm``): through vLLM's op dispatch 11 against 46 us a norm of the tiny model's size here,
15 against 61 with the residual add. :func:`register` offers them through vLLM's extension point for such
kernels (``IrOp.register_impl``, as its own ``vllm_c`` provider and the AITER one do), for inputs whose
dtype is the weight's; :func:`prefer` puts that provider first in the engine's ``ir_op_priority``, and vLLM
appends ``native`` after it for everything else. The kernel reads whole rows, so a strided input (Qwen3's
per-head q and k norms read views of the fused qkv) is copied to one block first: one copy instead of the
native norm's ops; the in-place add-and-norm takes contiguous tensors only. The engine's CPU for the
quickstart's batches fell 7% (median ratio of 20 alternated pairs of rounds in one process; 3% while the
strided q and k norms stayed native).

Considered: naming vLLM's ``vllm_c`` provider, which calls the same kernels but is registered as supported
only on CUDA-like devices and XPU (naming it on CPU raises); torch.compile of the native ops (the start
cost above).
"""

from __future__ import annotations

from typing import Any

import torch

PROVIDER = "forge_nb_cpu"
_OPS = ("rms_norm", "fused_add_rms_norm")


def register() -> bool:
    """Offer the C kernels as provider :data:`PROVIDER` in this process (once). False where this vLLM has
    no such IR ops or its CPU build lacks the kernels: the engine then keeps vLLM's choice."""
    try:
        from vllm import ir
        from vllm.platforms import current_platform

        current_platform.import_kernels()
        ops = [getattr(ir.ops, name) for name in _OPS]
        if not all(hasattr(torch.ops._C, name) for name in _OPS):
            return False
    except (ImportError, AttributeError, RuntimeError):
        return False
    rms_norm, fused_add_rms_norm = ops
    if PROVIDER in rms_norm.impls:
        return True

    @rms_norm.register_impl(PROVIDER, supports_args=_rms_norm_args)
    def _rms_norm(x: torch.Tensor, weight: torch.Tensor | None, epsilon: float,
                  variance_size: int | None = None) -> torch.Tensor:
        x = x.contiguous()  # the kernel reads whole rows: a strided view (Qwen3's per-head q, k) is copied
        out = torch.empty_like(x)
        torch.ops._C.rms_norm(out, x, weight, epsilon)
        return out

    @fused_add_rms_norm.register_impl(PROVIDER, supports_args=_fused_add_rms_norm_args, inplace=True)
    def _fused_add_rms_norm(x: torch.Tensor, x_residual: torch.Tensor, weight: torch.Tensor | None,
                            epsilon: float, variance_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        torch.ops._C.fused_add_rms_norm(x, x_residual, weight, epsilon)  # x: the norm; x_residual: the sum
        return x, x_residual

    return True


def _rms_norm_args(x: torch.Tensor, weight: torch.Tensor | None, epsilon: float,
                   variance_size: int | None = None) -> bool:
    return variance_size is None and (weight is None or weight.dtype == x.dtype)


def _fused_add_rms_norm_args(x: torch.Tensor, x_residual: torch.Tensor, weight: torch.Tensor | None,
                             epsilon: float, variance_size: int | None = None) -> bool:
    """In place, so both must be one contiguous block already."""
    return _rms_norm_args(x, weight, epsilon, variance_size) and x.is_contiguous() and x_residual.is_contiguous()


def prefer(engine_args: Any) -> None:
    """Put :data:`PROVIDER` first for both norms in ``engine_args`` (vLLM's ``EngineArgs``, whose
    ``__post_init__`` made configs of any dicts given), unless the user chose a priority for either, at the
    top level or in ``kernel_config``; call after :func:`register` returned True."""
    chosen = (engine_args.ir_op_priority, getattr(engine_args.kernel_config, "ir_op_priority", None))
    if any(getattr(priority, name, None) for priority in chosen for name in _OPS):
        return
    from vllm.config.kernel import IrOpPriorityConfig

    engine_args.ir_op_priority = IrOpPriorityConfig(**{name: [PROVIDER] for name in _OPS})
