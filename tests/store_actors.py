"""Actors for the torchstore namespace and lease tests (importable by module path in spawned procs)."""

from __future__ import annotations

from monarch.actor import Actor, endpoint

from forge_nb.service import ForgeActor


class NamespaceReader(Actor):
    """Reads weight versions of any namespace in its own process."""

    @endpoint
    async def checksums(self, version: int, namespace: str) -> dict[str, float]:
        from forge_nb import weights

        with await weights.open_version(version, namespace=namespace) as state_dict:
            return {k: float(v.float().sum()) for k, v in state_dict.items()}


class WeightsUser(ForgeActor):
    """A tiny actor that moves weights: spawning it as a service leases the kernel's torchstore."""

    needs_store = True

    def __init__(self, namespace: str = "policy", fail_setup: bool = False):
        super().__init__()
        self.namespace, self.fail_setup = namespace, fail_setup

    @endpoint
    async def setup(self) -> None:
        if self.fail_setup:
            raise RuntimeError("setup failed on purpose")

    @endpoint
    async def push(self, version: int, value: float) -> list[int]:
        """Push a one-tensor state dict as ``version`` from this process; the namespace's versions."""
        import torch

        from forge_nb import weights

        await weights.push_state_dict({"w": torch.full((4,), value)}, version, namespace=self.namespace)
        return await weights.stored_versions(namespace=self.namespace)

    @endpoint
    async def value(self, version: int) -> float:
        from forge_nb import weights

        with await weights.open_version(version, namespace=self.namespace) as state_dict:
            return float(state_dict["w"][0])
