"""Actors for bench/weight_sync.py: a pusher holding a state dict, and loaders copying it into their own."""

from __future__ import annotations

import time

import torch
from monarch.actor import Actor, endpoint


def _shapes(mb: int, dtype: torch.dtype) -> dict[str, tuple[int, int]]:
    """Transformer-shaped tensors (2048x2048 and 2048x6144 blocks) adding up to about ``mb`` MiB."""
    out, total, i = {}, 0, 0
    shapes = [(2048, 2048), (2048, 6144), (6144, 2048)]
    elt = torch.tensor([], dtype=dtype).element_size()
    while total < mb * 2**20:
        shape = shapes[i % len(shapes)]
        out[f"model.layers.{i // 3}.w{i % 3}.weight"] = shape
        total += shape[0] * shape[1] * elt
        i += 1
    return out


def make_state_dict(mb: int, dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
    """Random transformer-shaped tensors adding up to about ``mb`` MiB (see ``_shapes``)."""
    return {name: torch.randn(shape).to(dtype) for name, shape in _shapes(mb, dtype).items()}


def state_dict_bytes(mb: int, dtype: torch.dtype = torch.bfloat16) -> int:
    """How many bytes ``make_state_dict(mb, dtype)`` holds, without making it."""
    return sum(a * b for a, b in _shapes(mb, dtype).values()) * torch.tensor([], dtype=dtype).element_size()


def sync_device(device: str) -> None:
    """Wait for the copies queued on ``device`` (a no-op on the CPU, whose copies are synchronous)."""
    if device != "cpu":
        torch.cuda.synchronize(device)


class Pusher(Actor):
    def __init__(self, mb: int, device: str = "cpu"):
        self.device = device
        self.state = {k: v.to(device) for k, v in make_state_dict(mb).items()}

    @endpoint
    async def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.state.values())

    @endpoint
    async def push(self, version: int, transport: str) -> float:
        from forge_nb import weights

        start = time.perf_counter()
        await weights.push_state_dict(self.state, version, transport=transport)
        sync_device(self.device)
        return time.perf_counter() - start


class Loader(Actor):
    """Loads a version and copies it into its own parameters, as a generator's weight reload does.

    ``threads``: the loaders split the host's cores, as vLLM's CPU workers do (one core each here).
    ``device``: where its parameters live ("cuda:0" for a GPU generator)."""

    def __init__(self, threads: int, device: str = "cpu") -> None:
        torch.set_num_threads(threads)
        self.device = device
        if device != "cpu":
            torch.cuda.init()  # as a GPU generator has: the weights path pins its mappings only then
        self.params: dict[str, torch.Tensor] = {}

    @endpoint
    async def load(self, version: int) -> tuple[float, float]:
        """(seconds, CPU seconds of this process, every thread) to load ``version`` into the parameters."""
        from forge_nb import weights

        start, cpu = time.perf_counter(), time.process_time()
        with await weights.open_version(version) as incoming:  # the generator's path
            for name, tensor in incoming.items():
                if name not in self.params:
                    self.params[name] = torch.empty_like(tensor, device=self.device)
                self.params[name].copy_(tensor)
            sync_device(self.device)
        return time.perf_counter() - start, time.process_time() - cpu
