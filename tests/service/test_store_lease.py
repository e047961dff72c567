"""Services of a class that moves weights (``needs_store``) lease the kernel's torchstore until they shut down."""

from __future__ import annotations

import pytest

from forge_nb import weights
from forge_nb.service.errors import ActorStartFailed
from forge_nb.system.runtime import lifecycle, registry
from tests.store_actors import WeightsUser

pytestmark = pytest.mark.timeout(180)


async def test_a_service_starts_the_store_and_its_shutdown_stops_it(no_store, runtime):
    assert not weights.store_running()
    svc = await WeightsUser.options(num_replicas=2).as_service(namespace="policy-svc")
    assert weights.store_running() and weights.store_holders() == {svc.holder}
    assert svc.holder in lifecycle.lease_holders()
    assert {m.owner for m in registry.meshes() if m.name.startswith("weightsuser")} == {svc.holder}
    assert await svc.push.route(1, 2.5) == [1]
    assert await svc.value.fanout(1) == [2.5, 2.5]
    await svc.shutdown()
    assert not weights.store_running() and weights.store_holders() == frozenset()
    assert svc.holder not in lifecycle.lease_holders()
    assert [m for m in registry.meshes() if m.owner in ("torchstore", svc.holder)] == []


async def test_two_services_share_the_store_until_the_last_one_shuts_down(no_store):
    first = await WeightsUser.options(num_replicas=1).as_service(namespace="policy-a")
    second = await WeightsUser.as_actor(namespace="policy-b")
    assert weights.store_holders() == {first.holder, second.holder} and first.holder != second.holder
    await first.push.route(1, 1.0)
    await second.push.call_one(1, 7.0)
    await first.shutdown()
    assert weights.store_running()  # the second one still uses it, and its weights are still there
    assert await second.value.call_one(1) == 7.0
    assert await second.push.call_one(2, 8.0) == [1, 2]
    await second.shutdown()
    await second.shutdown()  # a second shutdown releases nothing more
    assert not weights.store_running()


async def test_a_service_that_fails_to_start_gives_its_store_lease_back(no_store, runtime):
    with pytest.raises(ActorStartFailed, match="setup failed on purpose"):
        await WeightsUser.options(num_replicas=1).as_service(fail_setup=True)
    assert not weights.store_running() and weights.store_holders() == frozenset()
    assert not [h for h in lifecycle.lease_holders() if h.startswith("WeightsUser#")]


async def test_a_service_leaves_a_store_started_directly_running(no_store):
    assert await weights.initialize_store() is True
    svc = await WeightsUser.as_actor()
    await svc.push.call_one(3, 1.0)
    await svc.shutdown()
    assert weights.store_running() and await weights.stored_versions() == [3]
