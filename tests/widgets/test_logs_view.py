"""The dashboard's process logs view over a real run (light actors on monarch meshes, no vLLM).

The generators are ChattyGenerators (tests/light_actors_noisy.py): their processes write INFO, WARNING
and ERROR lines (one with a traceback) and a line per weight version, into the run's log files, as
vLLM's engines do. The view must show those lines, per replica, filtered by level, and read only
while its section is open.
"""

from __future__ import annotations

import pytest
import pytest_asyncio

import forge_nb
from forge_nb.config import GeneratorConfig, LoopConfig
from forge_nb.widgets import Dashboard
from tests.light_actors import LightTrainer
from tests.light_actors_noisy import ChattyGenerator
from tests.waiting import waiter

pytestmark = [pytest.mark.timeout(300), pytest.mark.asyncio(loop_scope="module")]

_until = waiter(timeout=30.0, interval=0.1)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def run(tmp_path_factory):
    cfg = forge_nb.quickstart(run_dir=str(tmp_path_factory.mktemp("logs")), name="logsview", max_res_tokens=4,
                              group_size=4, batch_size=8, loop=LoopConfig(rollout_loops=2),
                              generator=GeneratorConfig(num_replicas=2))
    run = await forge_nb.spawn(cfg, progress=False, actors={"policy": ChattyGenerator, "trainer": LightTrainer})
    yield run
    await run.shutdown()


def _mesh(line: str) -> str:
    return line.split("]", 1)[0].lstrip("[")


async def test_the_view_reads_only_while_open_and_shows_what_each_process_wrote(run) -> None:
    d = Dashboard(run, start=False)
    try:
        assert [label for label, _ in d.logs.source.options] == ["all", "policy", "policy[0]", "policy[1]",
                                                                  "trainer", "kernel"]
        d.tick()
        assert d.logs.reads == 0 and d.logs.text == ""  # closed: nothing read
        d._logs_box.selected_index = 0  # the user opens "process logs"
        assert d.logs_open and d.logs.reads == 1
        for replica in run.policy.replicas:  # each generator process's own line, under its mesh's name
            pid = replica.mesh.pids[0]
            assert f"[logsview-policy-r{replica.index}] LightGenerator: ready in process {pid}" in d.logs.text
        assert "WARNING chatty: RotaryEmbedding" in d.logs.text and "ERROR chatty" in d.logs.text
        assert "color:#b00020" in d.logs.html.value and "color:#a15c00" in d.logs.html.value

        await run.step(2)  # the generators write a line per version they load; the open view follows
        assert await _until(lambda: (d.tick(), f"loaded version {run.version}" in d.logs.text)[1])

        d.logs.min_interval = 3600.0  # a tick within the interval reads nothing, although the logs grew
        reads = d.logs.reads
        await run.step(1)
        d.tick()
        assert d.logs.reads == reads and f"loaded version {run.version}" not in d.logs.text
        d.logs.refresh_button.click()  # the button reads at once
        assert d.logs.reads == reads + 1 and f"loaded version {run.version}" in d.logs.text

        d.logs.min_interval = 0.0
        d._logs_box.selected_index = None  # closed again: the poll reads nothing
        await run.step(1)
        d.tick()
        assert d.logs.reads == reads + 1
        assert not d.errors.messages
    finally:
        d.close()


async def test_a_replica_and_a_level_keep_only_their_lines(run) -> None:
    d = Dashboard(run, start=False)
    try:
        d.show_logs("policy", 1, level="warning")
        lines = d.logs.shown
        assert lines and {_mesh(line) for line in lines} == {"logsview-policy-r1"}
        assert any("WARNING chatty: RotaryEmbedding" in line for line in lines)
        assert any("ERROR chatty: engine step failed" in line for line in lines)  # error is above warning
        assert not any("INFO chatty" in line or "ready in process" in line for line in lines)

        d.logs.level.value = "error"  # the toggle reads at once
        errors = d.logs.text
        assert "ERROR chatty: engine step failed" in errors and "WARNING" not in errors
        assert "Traceback (most recent call last)" in errors  # an error keeps its traceback
        assert "ValueError: chatty: a recoverable engine failure" in errors
        assert "light_actors_noisy.py" in errors

        d.logs.source.value = ("trainer", None)  # the trainer's process wrote nothing
        assert d.logs.shown == [] and "nothing logged yet" in d.logs.html.value
        d.logs.source.value = ("policy", 0)
        d.logs.level.value = None  # every line of policy[0]
        assert {_mesh(line) for line in d.logs.shown} == {"logsview-policy-r0"}
        assert any("INFO chatty: engine up" in line for line in d.logs.shown)
        assert not d.errors.messages
    finally:
        d.close()


async def test_show_logs_names_the_choices_on_a_wrong_one(run) -> None:
    d = Dashboard(run, start=False)
    try:
        with pytest.raises(ValueError, match=r"critic.*'all', 'policy', 'policy\[0\]', 'policy\[1\]', 'trainer'"):
            d.show_logs("critic")
        with pytest.raises(ValueError, match="level='debug'.*'warning' or 'error'"):
            d.show_logs("policy", level="debug")
    finally:
        d.close()
