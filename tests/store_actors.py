"""Actors for the torchstore namespace, lease and cross-host weights tests (importable by module path in
spawned procs)."""

from __future__ import annotations

import torch
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


# -- weights across the hosts of a job (tests/test_cluster.py) -------------------------------------------


def stream_state(seed: int, mb: int = 1) -> dict[str, torch.Tensor]:
    """A state dict of several dtypes and odd shapes, the same for the same ``seed``; ``mb`` MiB in its
    first tensor (constant: cheap to make at any size), random bytes in the others."""
    generator = torch.Generator().manual_seed(seed)
    return {"model.big.weight": torch.full((mb * 2**19,), float(seed), dtype=torch.bfloat16).reshape(-1, 512),
            "model.odd.weight": torch.randn(333, 77, generator=generator),
            "model.half.weight": torch.randn(5, 3, generator=generator).half(),
            "model.ids": torch.randint(0, 2**40, (1001,), generator=generator),
            "model.mask": torch.rand(17, generator=generator) > 0.5}


def digests(state_dict: dict[str, torch.Tensor]) -> dict[str, str]:
    """Each tensor's dtype, shape and sha256 of its bytes: equal only for bit-identical tensors."""
    import hashlib

    return {k: f"{v.dtype} {tuple(v.shape)} "
               f"{hashlib.sha256(v.contiguous().reshape(-1).view(torch.uint8).numpy()).hexdigest()}"
            for k, v in state_dict.items()}


class StreamWriter(Actor):
    """Pushes versions for readers on other hosts (``transport="shm+stream"``) from its own process."""

    @endpoint
    async def push(self, version: int, seed: int, mb: int = 1) -> dict:
        from forge_nb import weights

        manifest = await weights.push_state_dict(stream_state(seed, mb), version, transport="shm+stream")
        return {"stream": manifest.get("stream"), "publisher": "publisher" in manifest, "path": manifest["path"]}

    @endpoint
    async def stop_serving(self) -> None:
        """Close this process's stream server: readers are refused, as by a firewall."""
        from forge_nb.weights import stream

        stream.stop_serving()


class HostReader(Actor):
    """Reads versions pushed on another host, and says how they came and what they left."""

    @endpoint
    async def digests(self, version: int) -> tuple[dict[str, str], str]:
        """The version's digests (see ``digests``), and how this host's copy came (its ``via``)."""
        import json
        import re

        from forge_nb import weights
        from forge_nb.weights.shm import host_id

        with await weights.open_version(version) as state_dict:
            got = digests(state_dict)
        host = re.sub(r"[^A-Za-z0-9_.-]", "_", host_id())
        (copy,) = weights.shm_root().glob(f"*-policy.v{version}@{host}.json")
        return got, json.loads(copy.read_text())["via"]

    @endpoint
    async def leftovers(self, version: int) -> tuple[list[str], list[str]]:
        """This process's files of ``version`` in shared memory, and its mappings of any file of it."""
        import os

        from forge_nb import weights

        files = sorted(p.name for p in weights.shm_root().glob(f"{os.getpid()}-policy.v{version}@*"))
        with open("/proc/self/maps") as maps:
            mapped = sorted({line.split()[-1] for line in maps if f"policy.v{version}@" in line})
        return files, mapped
