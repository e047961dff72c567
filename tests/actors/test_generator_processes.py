"""The Generator on vLLM's own processes (``AsyncLLM``: an EngineCore and a worker below the actor), the
path GPUs take, run here on CPU with ``distributed_executor_backend="mp"``: it generates, loads a version
from torchstore in the worker, keeps its sockets in its own folder, and ends its process when the
EngineCore dies (the service then respawns it; tests/run covers that part for a failing engine). Its
linear layers keep vLLM's packed CPU weights, so a version goes through vLLM's ``reload_weights``.
"""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import pytest
import pytest_asyncio

from forge_nb import weights
from forge_nb.actors.generator import Generator
from forge_nb.models import build_tiny_model
from forge_nb.system.processes.procs import SOCKETS_ROOT
from forge_nb.system.runtime import lifecycle, spawning
from tests.actors.test_generator import DOMINANT, SAMPLING, dominant_state_dict, running
from tests.procs import descendants

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.heavy, pytest.mark.timeout(300)]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gen(tmp_path_factory: pytest.TempPathFactory) -> Any:
    model = build_tiny_model(tmp_path_factory.mktemp("generator-mp") / "tiny")
    lifecycle.ensure_started()
    await weights.initialize_store()
    mesh = await spawning.spawn_mesh("gen-mp", 1)
    try:
        # vLLM's packed (oneDNN) CPU weights here, reloaded by reload_weights; in-process tests load plain ones
        actor = mesh.spawn("gen", Generator, engine_args={"model": str(model), "distributed_executor_backend": "mp"},
                           sampling_params=SAMPLING, cpu_linear="packed")
        await actor.setup.call_one()
        yield actor, mesh, model
    finally:
        await mesh.stop()
        await weights.shutdown_store()


async def test_vllm_processes_generate_and_load_a_version(gen: Any) -> None:
    actor, mesh, model = gen
    names = " ".join(descendants(mesh.pids[0]).values())
    assert "EngineCore" in names and "Worker" in names, names
    own = SOCKETS_ROOT / str(mesh.pids[0])
    assert [p for p in own.iterdir() if p.is_socket()], f"no vLLM socket in {own}"
    assert len(await actor.generate.call_one("abc")) == SAMPLING["n"]
    await weights.push_state_dict(dominant_state_dict(model), version=1)
    assert await actor.update_weights.call_one(1) == 1
    (c,) = await actor.generate.call_one("abc", n=1)
    assert c.generator_version == 1 and c.text == DOMINANT * SAMPLING["max_tokens"]


async def test_a_killed_engine_core_ends_the_generator_process(gen: Any) -> None:
    actor, mesh, _ = gen
    (engine,) = [p for p, cmd in descendants(mesh.pids[0]).items() if "EngineCore" in cmd]
    os.kill(engine, signal.SIGKILL)
    with pytest.raises(Exception):  # noqa: B017 (the process ends mid-call: monarch's error, whatever its type)
        await asyncio.wait_for(actor.generate.call_one("abc"), timeout=60)
    for _ in range(100):
        if not running(mesh.pids[0]):
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError("the generator's process outlived its dead engine")
