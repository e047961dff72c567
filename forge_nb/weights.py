"""Versioned policy weights in TorchStore: the trainer pushes version v, generators load it.

Layout: the whole HF-named state dict of version ``v`` lives under the key ``policy.v{v}``
(torchstore's state-dict path, which flattens it to ``policy.v{v}/<param>`` plus a mapping entry).
torchstore's key index is a trie split on ".", so we list by the ``policy`` component and filter.
Parameter names are Hugging Face's (what vLLM loads); a torchtitan trainer converts before pushing.
Old versions are dropped by the kernel once every generator has moved past them.

Every function works in any process (kernel or actor): torchstore is reached through
``forge_nb._torchstore``, which carries the monarch-0.7 compatibility binding.
"""

from __future__ import annotations

from typing import Any

import torch

from forge_nb import runtime

PREFIX = "policy"


def weights_key(version: int) -> str:
    return f"{PREFIX}.v{version}"


def _ts() -> Any:
    runtime.ensure_started()
    from forge_nb._torchstore import ts

    return ts


async def initialize_store() -> None:
    """Start the kernel's torchstore (a controller and one storage volume). Kernel only; idempotent."""
    ts = _ts()
    try:
        await ts.keys(PREFIX)
        return  # already running
    except Exception:
        pass
    await ts.initialize()


async def shutdown_store() -> None:
    ts = _ts()
    try:
        await ts.shutdown()
    finally:
        ts.reset_client()


async def push_state_dict(state_dict: dict[str, torch.Tensor], version: int) -> None:
    """Store ``state_dict`` (HF parameter names, full tensors) as policy version ``version``."""
    await _ts().put_state_dict({k: v.detach() for k, v in state_dict.items()}, weights_key(version))


async def load_state_dict(version: int) -> dict[str, torch.Tensor]:
    """Fetch policy version ``version``; a KeyError names the versions that exist."""
    ts = _ts()
    try:
        return await ts.get_state_dict(weights_key(version))
    except Exception as e:
        have = await stored_versions()
        raise KeyError(f"policy version {version} is not in torchstore (stored: {have or 'none'})") from e


async def stored_versions() -> list[int]:
    keys = await _ts().keys(PREFIX)
    return sorted({int(k.split("/", 1)[0].split(".v", 1)[1]) for k in keys if "/" in k})


async def drop_version(version: int) -> int:
    """Delete every key of ``version``; returns how many were deleted."""
    ts = _ts()
    keys = [k for k in await ts.keys(PREFIX) if k.startswith(weights_key(version) + "/")]
    for key in keys:
        await ts.delete(key)
    return len(keys)
