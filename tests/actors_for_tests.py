"""Small actors the tests spawn in real monarch procs (importable there by module path)."""

from __future__ import annotations

import os

from monarch.actor import Actor, endpoint

from forge_nb.runtime import async_endpoints


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
