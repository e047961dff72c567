"""The magics with several live runs in one real IPython shell: --name, which run, -o and service names.

The runs are real (monarch processes, services, torchstore namespaces) with the light actors of
tests/light_actors.py, so each spawns in seconds. Two are made with ``forge_nb.spawn`` in cells (they
count as live runs because the namespace holds them), a third through ``%forge_spawn --actor``.
"""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError

from forge_nb.system.runtime import registry

pytestmark = pytest.mark.timeout(300)

SETUP = """\
import forge_nb
from forge_nb.config import GeneratorConfig, LoopConfig
from tests.light_actors import LightGenerator, LightTrainer

def light_config(name):
    return forge_nb.quickstart(run_dir={root!r} + "/" + name, name=name, max_res_tokens=4, group_size=4,
                               batch_size=8, loop=LoopConfig(rollout_loops=1),
                               generator=GeneratorConfig(num_replicas=2))

LIGHT = {{"policy": LightGenerator, "trainer": LightTrainer}}
run_a = await forge_nb.spawn(light_config("a"), actors=LIGHT, progress=False)
run_b = await forge_nb.spawn(light_config("b"), actors=LIGHT, progress=False)
"""
LIGHT_ACTORS = "--actor policy=tests.light_actors:LightGenerator trainer=LightTrainer"


def ok(ip, cell: str) -> None:
    result = ip.run_cell(cell)
    assert result.success, f"{cell!r} raised {result.error_before_exec or result.error_in_exec!r}"


def usage_error(ip, cell: str) -> str:
    result = ip.run_cell(cell)
    error = result.error_in_exec or result.error_before_exec
    assert isinstance(error, UsageError), f"{cell!r} gave {error!r}, not a UsageError"
    return str(error)


@pytest.fixture(scope="module")
def runs(ip, tmp_path_factory):
    ok(ip, SETUP.format(root=str(tmp_path_factory.mktemp("several"))))
    yield ip.user_ns["run_a"], ip.user_ns["run_b"]
    ok(ip, "%forge_shutdown --all")
    for name in ("run_a", "run_b", "run_c", "run_d", "run", "policy", "trainer", "light_config", "LIGHT"):
        ip.user_ns.pop(name, None)


@pytest.mark.parametrize("cell", ["%forge_run", "%forge_run --steps 2", "%forge_pause", "%forge_resume",
                                  "%forge_step 1", "%forge_stop", "%forge_set lr=0.1", "%forge_episodes -n 2",
                                  "%forge_dashboard", "%forge_logs", "%forge_shutdown"])
def test_without_name_a_run_magic_names_the_live_runs_and_does_nothing(ip, runs, cell):
    run_a, run_b = runs
    before = [(r.state, r.current_step, dict(r.pending)) for r in runs]
    says = usage_error(ip, cell)
    assert "2 runs are live: 'a' (run_a), 'b' (run_b); say which with --name NAME" in says, says
    if cell == "%forge_shutdown":
        assert "--all" in says
    assert [(r.state, r.current_step, dict(r.pending)) for r in runs] == before


def test_status_without_name_shows_one_line_per_run(ip, runs, capsys):
    ok(ip, "%forge_status")
    out = capsys.readouterr().out
    assert "2 live runs" in out
    rows = {line.split()[0]: line.split() for line in out.splitlines()[2:]}
    assert rows["a"][1:3] == ["run_a", "ready"] and rows["b"][1:3] == ["run_b", "ready"], out
    ok(ip, "%forge_status --name b")
    assert "run 'b': ready" in capsys.readouterr().out


def test_name_picks_one_run_by_its_name_or_its_variable(ip, runs, capsys):
    run_a, run_b = runs
    a0, b0 = run_a.current_step, run_b.current_step
    ok(ip, "%forge_step 1 --name a")
    assert (run_a.current_step, run_b.current_step) == (a0 + 1, b0)
    assert "run 'a': 1 step(s), now paused" in capsys.readouterr().out
    ok(ip, "%forge_step 2 --name run_b")
    assert (run_a.current_step, run_b.current_step) == (a0 + 1, b0 + 2)
    lr_a = run_a.hparams["lr"]
    ok(ip, "%forge_set lr=0.25 --name b")
    assert "run 'b': lr=0.25 applies" in capsys.readouterr().out
    ok(ip, "%forge_step 1 --name b")
    assert run_b.hparams["lr"] == 0.25 and run_a.hparams["lr"] == lr_a != 0.25


def test_spawn_refuses_a_variable_or_name_of_a_live_run_before_spawning(ip, runs):
    run_a, _ = runs
    meshes = len(registry.meshes())
    ip.user_ns["run"] = run_a  # the default -o
    ip.user_ns["policy"] = run_a.policy
    checks = {
        f"%forge_spawn quickstart --name c {LIGHT_ACTORS}": "`run` holds run 'a', which is still up; pick another "
                                                            "variable with -o VAR",
        "%forge_spawn quickstart --name c -o run_b": "`run_b` holds run 'b', which is still up",
        "%forge_spawn quickstart --name c -o policy": "`policy` holds the policy of run 'a'",
        "%forge_spawn --procs 1 -o run_b": "`run_b` holds run 'b'",
        "%forge_spawn quickstart --name a -o run_c": "a run named 'a' is already up",
        f"%forge_attach {run_a.dir.path} -o run_c": "a run named 'a' is already up",
        "%forge_spawn quickstart --name c --actor policy=nope": "'nope' is neither a variable nor",
        "%forge_spawn quickstart --name c --actor critic=LightTrainer": "SERVICE one of policy, trainer, ref_model",
        "%forge_spawn quickstart --name c --actor policy=light_config": "not a ForgeActor subclass",
    }
    for cell, says in checks.items():
        assert says in usage_error(ip, cell), cell
    assert len(registry.meshes()) == meshes and "run_c" not in ip.user_ns
    assert ip.user_ns["run"] is run_a and ip.user_ns["run_b"] is runs[1]


def test_spawn_with_name_and_o_binds_only_free_service_names(ip, runs, capsys):
    run_a, run_b = runs
    ip.user_ns["policy"] = run_a.policy  # taken by a live run: stays
    ip.user_ns.pop("trainer", None)  # free: bound
    ok(ip, "cfg_c = light_config('c')")
    ok(ip, f"%forge_spawn cfg_c --name lr_hi -o run_c {LIGHT_ACTORS}")
    run_c = ip.user_ns["run_c"]
    out = capsys.readouterr().out
    assert run_c.name == "lr_hi" and run_c.state == "ready"
    assert ip.user_ns["policy"] is run_a.policy and ip.user_ns["trainer"] is run_c.trainer
    assert "bound to `run_c`, `trainer`. Not rebound: `policy` still holds the policy of run 'a'" in out, out
    assert "this run's stay reachable as `run_c.policy`." in out and "the run magics need --name lr_hi" in out
    assert ip.user_ns["run"] is run_a
    # three live runs now: the magics still refuse to guess, and --name reaches the new one
    assert "3 runs are live" in usage_error(ip, "%forge_step 1")
    ok(ip, "%forge_step 1 --name lr_hi")
    assert run_c.current_step == 1

    ok(ip, "%forge_shutdown --name lr_hi")
    assert run_c.state == "shut down" and run_a.state != "shut down" and run_b.state != "shut down"
    # a shut-down run's service names are free again; a live run's are not
    ok(ip, f"%forge_spawn cfg_c --name d -o run_d {LIGHT_ACTORS}")
    run_d = ip.user_ns["run_d"]
    assert ip.user_ns["trainer"] is run_d.trainer and ip.user_ns["policy"] is run_a.policy
    ok(ip, "%forge_shutdown --name run_d")
    assert run_d.state == "shut down"
    # a stopped service is a dead handle: its name is free even when no known run owned it
    from forge_nb.magics._runs import Runs

    alone = Runs({"policy": run_d.policy, "trainer": run_a.trainer, "ref_model": 3})
    assert alone.claimable("policy", run_b) and alone.claimable("nothing_here", run_b)
    assert not alone.claimable("trainer", run_b) and not alone.claimable("ref_model", run_b)
    ip.user_ns.pop("cfg_c")


def test_a_new_step_budget_replaces_a_pending_one_the_same_way_from_python_and_from_the_magics(ip, runs):
    """``run.step(10000)`` pending, then ``run.step(3)``: the first returns at the next boundary with the steps
    it got, the second trains exactly 3, then the run pauses; ``%forge_run --steps 10000`` then ``%forge_step
    3`` does the same (the background request ends with its steps, it is not cancelled)."""
    run_a, run_b = runs
    ok(ip, "import asyncio\nfirst = asyncio.ensure_future(run_b.step(10000))\nawait asyncio.sleep(0.3)")
    ok(ip, "second = await run_b.step(3)\nfirst_rows = await first")
    first_rows, second = ip.user_ns["first_rows"], ip.user_ns["second"]
    assert len(first_rows) < 10000 and len(second) == 3
    steps = [r["step"] for r in first_rows + second]
    assert steps == list(range(steps[0], steps[0] + len(steps)))  # one run of steps, none counted twice
    assert run_b.state == "paused" and run_b.current_step == steps[-1]

    control = ip.magics_manager.registry["ControlMagics"]
    before = run_a.current_step
    ok(ip, "%forge_run --steps 10000 --name a\nawait asyncio.sleep(0.3)")
    background = control.runs.stepping["a"]
    ok(ip, "%forge_step 3 --name a")
    assert background.done() and not background.cancelled()
    got = background.result()
    assert len(got) < 10000 and run_a.current_step == before + len(got) + 3 and run_a.state == "paused"
    for name in ("first", "first_rows", "second"):
        ip.user_ns.pop(name)


def test_start_without_a_budget_ends_a_pending_one_and_resume_keeps_it(ip, runs):
    """``run.start()`` (and ``%forge_run`` without ``--steps``) while ``run.step(10000)`` waits: the step call
    returns with the steps it got and the run trains on past them; ``pause()`` then ``resume()`` keeps a budget:
    ``run.step(40)`` returns after exactly 40 steps, paused, however the pause split them."""
    run_a, run_b = runs
    ok(ip, "import asyncio\npending = asyncio.ensure_future(run_b.step(10000))\nawait asyncio.sleep(0.3)\n"
           "run_b.start()\ngot = await asyncio.wait_for(pending, 120)")
    got, at = ip.user_ns["got"], run_b.current_step
    assert len(got) < 10000 and run_b.state == "running"
    ok(ip, f"for _ in range(600):\n    await asyncio.sleep(0.1)\n    if run_b.current_step >= {at + 3}: break")
    assert run_b.current_step >= at + 3, "the run stopped at the old budget's end instead of training on"
    ok(ip, "await run_b.stop()")

    before = run_b.current_step
    ok(ip, "budget = asyncio.ensure_future(run_b.step(40))\n"
           f"for _ in range(600):\n    await asyncio.sleep(0.05)\n    if run_b.current_step > {before}: break\n"
           "run_b.pause()\nawait run_b.training_idle.wait()\nawait asyncio.sleep(0.5)")
    paused_at = run_b.current_step
    assert not ip.user_ns["budget"].done() and run_b.state == "paused" and before < paused_at < before + 40
    ok(ip, "await asyncio.sleep(0.5)")
    assert run_b.current_step == paused_at  # paused means paused, budget or not
    ok(ip, "run_b.resume()\nbudget = await asyncio.wait_for(budget, 120)")
    assert [r["step"] for r in ip.user_ns["budget"]] == list(range(before + 1, before + 41))
    assert run_b.current_step == before + 40 and run_b.state == "paused"

    control = ip.magics_manager.registry["ControlMagics"]
    ok(ip, "%forge_run --steps 10000 --name a\nawait asyncio.sleep(0.3)")
    background = control.runs.stepping["a"]
    ok(ip, "%forge_run --name a\nawait asyncio.sleep(0.5)")
    assert background.done() and not background.cancelled() and len(background.result()) < 10000
    assert run_a.state == "running"
    ok(ip, "%forge_stop --name a")
    for name in ("pending", "got", "budget"):
        ip.user_ns.pop(name)


def test_shutdown_by_name_leaves_the_other_run_training(ip, runs, capsys):
    run_a, run_b = runs
    ok(ip, "%forge_shutdown --name a")
    assert run_a.state == "shut down" and run_b.state != "shut down"
    assert "shut down run 'a': all" in capsys.readouterr().out
    # the variable of a shut-down run may be reused; a live one's may not
    assert "`run_b` holds run 'b'" in usage_error(ip, f"%forge_attach {run_a.dir.path} -o run_b")
    # one live run left: the magics act on it without --name, and it keeps training with its own weights
    step = run_b.current_step
    ok(ip, "%forge_step 2")
    assert run_b.current_step == step + 2 and run_b.version == step + 2
    assert run_b.ledger()["balanced"]
    assert "not both" in usage_error(ip, "%forge_shutdown --name b --all")


def test_logs_show_what_a_runs_processes_wrote_by_service_and_replica(ip, runs, capsys):
    run_a, _ = runs
    pid = run_a.policy.replicas[1].mesh.pids[0]
    ok(ip, "%forge_logs policy[1] --name a")
    out = capsys.readouterr().out
    assert f"LightGenerator: ready in process {pid}" in out and "[a-policy-r1" in out and "[a-policy-r0" not in out
    ok(ip, "%forge_logs trainer -n 5 --name a")
    assert "LightGenerator" not in capsys.readouterr().out
    ok(ip, "%forge_logs --level error --name a")  # nothing failed: it says so, with where the files are
    assert "nothing logged yet at level error" in capsys.readouterr().out
    assert "service='reward': this run has ['policy', 'trainer']" in usage_error(ip, "%forge_logs reward --name a")
