"""vLLM's CPU C kernels for RMS norm offered to the eager CPU engine (``forge_nb.actors.engine.cpu_norm``):
they agree with vLLM's native norms where they are chosen (strided heads too), and a priority the user set
is kept. The engine that uses them generates in tests/actors/test_generator*.py."""

from __future__ import annotations

import pytest
import torch

from forge_nb.actors.engine import cpu_norm
from forge_nb.models import build_tiny_model


@pytest.fixture(scope="module")
def ops():
    assert cpu_norm.register(), "this vLLM's CPU build should have the rms_norm kernels"
    from vllm import ir

    yield ir.ops
    for op in (ir.ops.rms_norm, ir.ops.fused_add_rms_norm):
        op.set_default(["native"])


def _use(ops, priority):
    for op in (ops.rms_norm, ops.fused_add_rms_norm):
        op.set_default(priority)


def test_the_kernels_agree_with_vllms_native_norms(ops):
    torch.manual_seed(0)
    x, residual, weight = torch.randn(7, 64), torch.randn(7, 64), torch.randn(64)
    _use(ops, ["native"])
    want = ops.rms_norm(x, weight, 1e-6, None)
    want_norm, want_sum = ops.fused_add_rms_norm(x.clone(), residual.clone(), weight, 1e-6, None)
    _use(ops, [cpu_norm.PROVIDER, "native"])
    assert ops.rms_norm.dispatch(x, weight, 1e-6, None).provider == cpu_norm.PROVIDER
    torch.testing.assert_close(ops.rms_norm(x, weight, 1e-6, None), want)
    norm, total = ops.fused_add_rms_norm(x.clone(), residual.clone(), weight, 1e-6, None)
    torch.testing.assert_close(norm, want_norm)
    torch.testing.assert_close(total, want_sum)
    torch.testing.assert_close(total, x + residual)


def test_strided_heads_are_normed_right_and_other_cases_stay_native(ops):
    _use(ops, [cpu_norm.PROVIDER, "native"])
    qkv = torch.randn(5, 3 * 64)
    heads = qkv[:, :64].view(5, 4, 16)  # Qwen3's per-head q norm reads a strided view like this
    weight = torch.randn(16)
    assert not heads.is_contiguous()
    assert ops.rms_norm.dispatch(heads, weight, 1e-6, None).provider == cpu_norm.PROVIDER
    torch.testing.assert_close(ops.rms_norm(heads, weight, 1e-6, None),
                               heads * torch.rsqrt(heads.pow(2).mean(-1, keepdim=True) + 1e-6) * weight)
    assert ops.rms_norm.dispatch(heads, weight.double(), 1e-6, None).provider == "native"
    assert ops.rms_norm.dispatch(heads, weight, 1e-6, 8).provider == "native"
    rows = qkv[:, :64]  # the in-place add-and-norm writes its inputs: strided ones stay native
    assert ops.fused_add_rms_norm.dispatch(rows, torch.randn(5, 64), torch.randn(64), 1e-6, None).provider == "native"


def test_the_engine_prefers_them_unless_the_user_chose_a_priority(ops, tmp_path):
    from vllm.engine.arg_utils import AsyncEngineArgs

    tiny = str(build_tiny_model(tmp_path / "tiny"))
    args = AsyncEngineArgs(model=tiny)
    cpu_norm.prefer(args)
    assert args.ir_op_priority.rms_norm == [cpu_norm.PROVIDER]
    assert args.ir_op_priority.fused_add_rms_norm == [cpu_norm.PROVIDER]

    for chosen in (AsyncEngineArgs(model=tiny, ir_op_priority={"rms_norm": ["native"]}),
                   AsyncEngineArgs(model=tiny, kernel_config={"ir_op_priority": {"fused_add_rms_norm": ["native"]}})):
        before = repr(chosen.ir_op_priority)
        cpu_norm.prefer(chosen)
        assert repr(chosen.ir_op_priority) == before
