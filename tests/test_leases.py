"""Leased kernel-wide resources: the Shared rules, and the kernel's torchstore on real monarch processes."""

from __future__ import annotations

import asyncio

import pytest
import torch

from forge_nb import weights
from forge_nb.system.leases import Shared
from forge_nb.system.runtime import lifecycle, registry

pytestmark = pytest.mark.timeout(120)


class Resource:
    """A resource whose start and stop are counted (and can be made to fail or die)."""

    def __init__(self) -> None:
        self.starts = self.stops = 0
        self.up = False
        self.fail_start = False

    async def start(self) -> None:
        await asyncio.sleep(0.01)  # let a concurrent acquire try to slip in
        if self.fail_start:
            raise RuntimeError("cannot start")
        self.starts += 1
        self.up = True

    async def stop(self) -> None:
        self.stops += 1
        self.up = False


async def test_first_lease_starts_and_last_release_stops():
    res = Resource()
    shared = Shared("thing", res.start, res.stop)
    await asyncio.gather(shared.acquire("a"), shared.acquire("b"), shared.acquire("a"))
    assert (res.starts, shared.holders) == (1, {"a", "b"})
    await shared.release("a")
    await shared.release("a")  # twice: still one lease ended
    await shared.release("nobody")
    assert (res.stops, res.up, shared.holders) == (0, True, {"b"})
    await shared.release("b")
    assert (res.stops, res.up, shared.holders) == (1, False, frozenset())
    await shared.acquire("c")
    assert (res.starts, res.up) == (2, True)


async def test_a_failed_start_leases_nothing_and_a_dead_resource_is_started_again():
    res = Resource()
    shared = Shared("thing", res.start, res.stop, alive=lambda: res.up)
    res.fail_start = True
    with pytest.raises(RuntimeError, match="cannot start"):
        await shared.acquire("a")
    assert shared.holders == frozenset()
    res.fail_start = False
    await shared.acquire("a")
    res.up = False  # it died under its holder
    await shared.acquire("b")
    assert (res.starts, res.up, shared.holders) == (2, True, {"a", "b"})
    shared.forget_all()  # stopped directly: the leases end with it
    await shared.release("a")
    assert res.stops == 0
    with pytest.raises(TypeError, match="holder="):
        await shared.acquire("")


# -- the kernel's torchstore ----------------------------------------------------------------------------


async def _store_is_down() -> None:
    assert not weights.store_running()
    with pytest.raises(Exception):  # noqa: B017 - torchstore says "not initialized" in its own words
        await weights.stored_versions()


def _store_processes() -> list[registry.Mesh]:
    return [m for m in registry.meshes() if m.owner == "torchstore"]


async def test_the_store_lives_from_the_first_lease_to_the_last_release(no_store, runtime):
    await weights.lease_store("run-a")
    await weights.lease_store("run-b")
    assert weights.store_running() and weights.store_holders() == {"run-a", "run-b"}
    assert _store_processes() == []  # controller and volume live in this process: no mesh of their own
    assert "weights.store" in lifecycle.lease_holders()  # the store holds the runtime while leased
    await weights.push_state_dict({"w": torch.ones(3)}, 1, namespace="policy-b")
    await weights.release_store("run-a")
    assert weights.store_running()  # run-b still uses it
    assert float((await weights.load_state_dict(1, namespace="policy-b"))["w"].sum()) == 3.0
    await weights.release_store("run-b")
    await _store_is_down()
    assert "weights.store" not in lifecycle.lease_holders()
    assert await weights.initialize_store() is True  # and it starts again, empty
    assert await weights.stored_versions(namespace="policy-b") == []


async def test_a_store_started_directly_outlives_every_lease(no_store):
    assert await weights.initialize_store() is True
    assert await weights.initialize_store() is False  # already up
    await weights.lease_store("run-a")
    await weights.release_store("run-a")
    assert weights.store_running()
    await weights.push_state_dict({"w": torch.ones(2)}, 1)
    assert await weights.stored_versions() == [1]
    await weights.shutdown_store()
    await _store_is_down()


async def test_a_direct_shutdown_ends_the_leases_and_the_next_lease_starts_a_new_store(no_store):
    await weights.lease_store("run-a")
    await weights.push_state_dict({"w": torch.ones(2)}, 1)
    await weights.shutdown_store()
    await _store_is_down()
    assert weights.store_holders() == frozenset()
    await weights.release_store("run-a")  # its lease ended with the store: nothing happens
    await weights.lease_store("run-b")
    assert weights.store_running() and await weights.stored_versions() == []  # a new, empty store
    await weights.release_store("run-b")
    assert not weights.store_running()


async def test_stopping_every_mesh_leaves_the_leased_store_up(no_store, runtime):
    await weights.lease_store("run-a")
    await weights.push_state_dict({"w": torch.ones(2)}, 1)
    await registry.stop_all()  # as a notebook's own cells may do under a run's feet
    assert weights.store_running() and await weights.stored_versions() == [1]
    await weights.release_store("run-a")
    assert not weights.store_running()
