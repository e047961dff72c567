"""Plain weights in vLLM's CPU linear layers, for small models: a new version loads in place, ~15x faster.

On CPU, vLLM's linear layers repack their weights for oneDNN once loaded (``dispatch_cpu_unquantized_gemm``
in ``vllm.model_executor.layers.utils``) and drop the loaded tensor, so a new version goes through
``reload_weights``: every layer is rebuilt, loaded and repacked. For a small model that costs more than the
matmuls it speeds up. With plain weights a layer multiplies with ``torch.nn.functional.linear`` on the
weight as loaded, and a version is copied into the parameters by the model's own ``load_weights``, the
in-place path vLLM takes on GPUs (from the second version on, by replaying the copies the first one made:
:mod:`forge_nb.actors.engine.replay`).

Measured here (2 cores, float32, the same engine in one process, 16 completions of 4 tokens):

============================  =============================  =======================
model                         load a version (plain/packed)  generate (plain/packed)
============================  =============================  =======================
tiny Qwen3, 0.3M parameters   0.7 / 11.3 ms                  12.7 / 14.4 ms
7M parameters (hidden 384)    3.8 / 24 ms                    45 / 37 ms
62M parameters (hidden 896)   24 / 212 ms                    249 / 138 ms
============================  =============================  =======================

So ``"auto"`` keeps plain weights up to :data:`PLAIN_MAX_BYTES` of checkpoint, and oneDNN's packed ones
above (where the matmuls are worth the repack). Large batches shift it: with 256 sequences in flight and no
loads (``bench/generator_throughput.py``) the tiny model generated ~11k tokens/s plain against ~13k packed,
so a generator that rarely loads weights may prefer ``cpu_linear="packed"``; the RL loop loads every step.
The greedy completions and their logprobs were the same either way after loading a new version.

vLLM has no setting for this: the one switch is swapping the module's ``dispatch_cpu_unquantized_gemm``
(which ``process_weights_after_loading`` looks up at each call) for one that keeps the weight, before the
engine loads the model. Two-dimensional weights only; anything else (a convolution's) goes to vLLM's own.
The worker process of vLLM's multiprocess executor learns it from :data:`ENV` (it imports this module
through the worker extension before it loads the model). ``tests/actors/test_generator*.py`` load versions
both ways and check what the model then generates.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

CHOICES = ("auto", "plain", "packed")
#: Checkpoints up to this size keep plain weights under ``"auto"`` (the tiny model is 1.3 MB).
PLAIN_MAX_BYTES = 8 * 2**20
#: Set to "1" in a process whose vLLM engine keeps plain weights, for the worker process it starts.
ENV = "FORGE_NB_VLLM_PLAIN_LINEAR"

_active = False


def choose(model_path: str, requested: str) -> str:
    """``"plain"`` or ``"packed"`` for the model in ``model_path`` (``requested`` is one of CHOICES)."""
    if requested not in CHOICES:
        raise ValueError(f"cpu_linear={requested!r}: use 'auto' (plain weights for checkpoints up to "
                         f"{PLAIN_MAX_BYTES // 2**20} MiB), 'plain' or 'packed' (vLLM's oneDNN layout)")
    if requested != "auto":
        return requested
    size = sum(f.stat().st_size for f in Path(model_path).iterdir() if f.suffix in (".safetensors", ".bin"))
    return "plain" if 0 < size <= PLAIN_MAX_BYTES else "packed"


def active() -> bool:
    """Whether this process's vLLM keeps plain weights (so a version loads with ``model.load_weights``)."""
    return _active


def configure(mode: str) -> None:
    """Before the engine is built: its model (and that of vLLM's worker process) keeps ``mode`` weights."""
    if mode == "plain":
        use_plain_weights()
    elif _active:
        raise RuntimeError("this process already built a vLLM engine with plain CPU weights; start the "
                           "generator with cpu_linear='packed' in a process of its own")
    else:
        os.environ[ENV] = "0"


def use_plain_weights() -> None:
    """From now on, vLLM models loaded in this process (and its vLLM workers) keep plain CPU weights."""
    global _active
    os.environ[ENV] = "1"
    if _active:
        return
    import vllm.model_executor.layers.utils as layer_utils

    packed = layer_utils.dispatch_cpu_unquantized_gemm

    def dispatch(layer: torch.nn.Module, remove_weight: bool) -> None:
        if layer.weight.ndim != 2:
            return packed(layer, remove_weight)
        layer.cpu_linear = _linear  # what vLLM itself uses for a layer it leaves unpacked, less a detour
        return None

    layer_utils.dispatch_cpu_unquantized_gemm = dispatch
    _active = True


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``torch.nn.functional.linear`` on a vLLM parameter as on the plain tensor it is. vLLM's parameters
    subclass ``Parameter`` with a ``__torch_function__`` that only calls ``Parameter``'s, yet every call
    through it is Python: 22 against 14 us a matmul of the tiny model here, 7.7% of the generator's CPU in
    the quickstart (py-spy). With subclass dispatch off the same kernel runs on the same storage, so a
    version loaded into the parameter is what the next step multiplies with. The engine's CPU for the
    quickstart's batches (groups of 4 x 4 tokens), alternated rounds in one process: 4% less."""
    with torch._C.DisableTorchFunctionSubclass():
        return torch.nn.functional.linear(x, weight, bias)


def apply_from_env() -> None:
    """In vLLM's worker process: keep plain weights if the Generator's process chose them."""
    if os.environ.get(ENV) == "1":
        use_plain_weights()
