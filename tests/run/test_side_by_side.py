"""Two real quickstart runs (vLLM generators, the real trainer) train at once in one kernel; one shuts
down and the other trains on, its weights, versions and ledger untouched. The light-actor twin of this
test, with more cases, is tests/controller/test_controller.py."""

from __future__ import annotations

import asyncio

import pytest

import forge_nb
from forge_nb import weights
from forge_nb.system.runtime import registry
from tests.waiting import waiter

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(900), pytest.mark.asyncio]

_until = waiter(timeout=400.0, interval=0.2)


async def test_two_quickstart_runs_train_together_and_one_shuts_down_alone(tmp_path):
    one = {"generator.num_replicas": 1}
    a, b = await asyncio.gather(
        forge_nb.spawn(forge_nb.quickstart(name="side-a", run_dir=str(tmp_path / "a")), overrides=one, progress=False),
        forge_nb.spawn(forge_nb.quickstart(name="side-b", run_dir=str(tmp_path / "b")), overrides=one, progress=False))
    try:
        assert a.weights_namespace != b.weights_namespace
        a.start()
        b.start()
        assert await _until(lambda: a.current_step >= 3 and b.current_step >= 3)
        assert a.state == b.state == "running" and a.error is None and b.error is None
        await b.shutdown()
        assert await weights.stored_versions(namespace=b.weights_namespace) == []
        assert not [m for m in registry.meshes() if m.name.startswith("side-b")]
        step = a.current_step
        assert await _until(lambda: a.current_step >= step + 3)  # a trains on, through the shared store
        await a.stop()
        assert a.error is None and a.ledger()["balanced"] and a.ledger()["in_step"] == 0, a.ledger()
        assert b.ledger()["balanced"], b.ledger()
        assert await a.policy.get_version.fanout() == [a.version]
        assert await weights.stored_versions(namespace=a.weights_namespace) == [a.version]
        rows = [r["step"] for r in a.metrics.rows]
        assert rows == list(range(1, a.current_step + 1))  # b's steps never landed in a's metrics
    finally:
        await a.shutdown()
        await b.shutdown()
    assert registry.meshes() == [] and not weights.store_running(), "both runs shut down: nothing may be left"
