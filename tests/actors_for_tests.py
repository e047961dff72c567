"""Small actors the tests spawn in real monarch procs (importable there by module path)."""

from __future__ import annotations

import os

from monarch.actor import Actor, endpoint

from forge_nb._monarch_compat import async_endpoints


@async_endpoints
class Mixed(Actor):
    """A sync and an async endpoint side by side: monarch alone refuses this class."""

    @endpoint
    def add(self, a: int, b: int) -> int:
        return a + b

    @endpoint
    async def add_later(self, a: int, b: int) -> int:
        return a + b


class StoreUser(Actor):
    @endpoint
    async def pid(self) -> int:
        return os.getpid()

    @endpoint
    async def checksum(self, key: str) -> float:
        from forge_nb._torchstore import ts

        sd = await ts.get_state_dict(key)
        return float(sum(v.sum() for v in sd.values()))

    @endpoint
    async def write(self, key: str, value: float) -> None:
        import torch

        from forge_nb._torchstore import ts

        await ts.put_state_dict({"w": torch.full((5, 5), value)}, key)


class Sleeper(Actor):
    @endpoint
    async def sleep(self, seconds: float) -> float:
        import asyncio

        await asyncio.sleep(seconds)
        return seconds


# -- service tests -------------------------------------------------------------------------------

from forge_nb.service import ForgeActor  # noqa: E402


class Worker(ForgeActor):
    """Sleeps, then records the request in a separate Ledger actor, so retries can be audited."""

    def __init__(self, ledger=None, crash_marker: str | None = None):
        self.ledger = ledger
        self.crash_marker = crash_marker
        self.setups = 0

    @endpoint
    async def setup(self) -> None:
        if self.crash_marker and os.path.exists(self.crash_marker):
            os._exit(3)  # a replica that cannot come back
        self.setups += 1

    @endpoint
    def pid(self) -> int:  # a sync endpoint beside async ones
        return os.getpid()

    @endpoint
    async def work(self, request_id: int, delay: float = 0.0) -> int:
        import asyncio

        await asyncio.sleep(delay)
        if self.ledger is not None:
            await self.ledger.record.call_one(request_id, os.getpid())
        return os.getpid()

    @endpoint
    async def fail(self, message: str) -> None:
        raise ValueError(message)

    @endpoint
    async def get_setups(self) -> int:
        return self.setups

    @endpoint
    async def load(self, version: int) -> int:
        self.version = version
        return version

    @endpoint
    async def get_loaded(self) -> int:
        return getattr(self, "version", -1)


class Ledger(ForgeActor):
    def __init__(self):
        self.records: list[tuple[int, int]] = []

    @endpoint
    async def record(self, request_id: int, pid: int) -> None:
        self.records.append((request_id, pid))

    @endpoint
    async def all(self) -> list[tuple[int, int]]:
        return list(self.records)


class WeightsReader(Actor):
    @endpoint
    async def checksums(self, version: int) -> dict[str, float]:
        from forge_nb import weights

        return {k: float(v.float().sum()) for k, v in (await weights.load_state_dict(version)).items()}

    @endpoint
    async def checksums_open(self, version: int) -> tuple[dict[str, float], int]:
        """Checksums through ``open_version`` (the generators' path), and how many files it keeps mapped."""
        from forge_nb import weights

        with await weights.open_version(version) as state_dict:
            sums = {k: float(v.float().sum()) for k, v in state_dict.items()}
        return sums, len(weights._reader_maps)

    @endpoint
    async def checksums_on_gpu(self, version: int) -> tuple[dict[str, float], int]:
        """Copy ``version`` into GPU tensors as a GPU generator does; the checksums, and how many of this
        process's mappings are page-locked for CUDA."""
        import torch

        from forge_nb import weights

        torch.cuda.init()
        with await weights.open_version(version) as state_dict:
            on_gpu = {k: v.to("cuda") for k, v in state_dict.items()}
        return {k: float(v.float().sum()) for k, v in on_gpu.items()}, len(weights._pinned)

    @endpoint
    async def hold(self, version: int) -> None:
        """Load ``version`` and keep its views alive, as a slow consumer would."""
        from forge_nb import weights

        self.held = await weights.load_state_dict(version)

    @endpoint
    async def held_checksums(self) -> dict[str, float]:
        return {k: float(v.float().sum()) for k, v in self.held.items()}

    @endpoint
    async def release(self) -> None:
        del self.held


class Parent(Actor):
    """Starts a child process of its own, as a vLLM generator starts its engine and workers."""

    @endpoint
    async def start_child(self) -> int:
        import subprocess

        self.child = subprocess.Popen(["sleep", "600"])
        return self.child.pid
