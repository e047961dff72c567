"""The %forge_* magics in a real IPython shell: parsing, UsageError messages, %%forge_config, bare meshes."""

from __future__ import annotations

import subprocess
import sys

import pytest
from IPython.core.error import UsageError

from forge_nb.config import RunConfig
from forge_nb.magics import help_text
from forge_nb.magics._await import AWAITED
from forge_nb.system.processes.procs import pid_alive

pytestmark = pytest.mark.timeout(180)

GOOD_YAML = """\
name: from-yaml
group_size: 4
max_res_tokens: 6
trainer:
  optimizer: {lr: 2.0e-4}
  loss_config: {beta: 0.0}
loop:
  rollout_loops: 3
"""

TORCHFORGE_YAML = """\
model: tiny
group_size: 4
local_batch_size: 8
off_by_n: 2
services:
  policy: {num_replicas: 3, procs: 1, with_gpus: false}
trainer:
  optimizer: {lr: 1.0e-5}
  loss_config: {beta: 0.0}
"""


def usage_error(ip, cell: str) -> str:
    result = ip.run_cell(cell)
    error = result.error_in_exec or result.error_before_exec
    assert isinstance(error, UsageError), f"{cell!r} gave {error!r}, not a UsageError"
    return str(error)


def test_importing_the_magics_loads_nothing_heavy_and_registers_nothing():
    code = ("import sys, forge_nb.magics\n"
            "print(sorted(m for m in ('monarch', 'torch', 'forge_nb.run', 'forge_nb.system.runtime')"
            " if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_every_magic_in_the_table_is_registered(ip):
    line, cell = ip.magics_manager.magics["line"], ip.magics_manager.magics["cell"]
    documented = {w.strip("%").rstrip(".,") for w in help_text().split() if w.startswith("%forge_")}
    assert {"forge_spawn", "forge_step", "forge_shutdown", "forge_meshes", "forge_help"} <= documented
    assert documented <= set(line), documented - set(line)
    assert "forge_config" in cell and help_text().count("%%forge_config") == 1
    assert AWAITED <= set(line)


def test_help_prints_the_table(ip, capsys):
    assert ip.run_cell("%forge_help").success
    out = capsys.readouterr().out
    assert "%forge_spawn RECIPE" in out and "%forge_shutdown" in out and "%%forge_config" in out


@pytest.mark.parametrize(("cell", "says"), [
    ("%forge_run", "no run yet: %forge_spawn quickstart"),
    ("%forge_status", "no run yet"),
    ("%forge_episodes -n 3", "no run yet"),
    ("%forge_dashboard", "no run yet"),
    ("%forge_status --name nope", "no run named 'nope'"),
    ("%forge_step 0", "give a number of steps >= 1"),
    ("%forge_run --steps 0", "give a number of steps >= 1"),
    ("%forge_step two", "invalid int value: 'two'"),
    ("%forge_spawn", "needs a recipe (e.g. %forge_spawn quickstart) or, for a bare process mesh, --procs N"),
    ("%forge_spawn nope", "unknown recipe 'nope'. Use a recipe ("),
    ("%forge_spawn nope", "quickstart), 'package.module:function' returning a RunConfig"),
    ("%forge_spawn quickstart --bogus", "unrecognized arguments: --bogus"),
    ("%forge_spawn quickstart --set bogus=1", "unknown key(s) ['bogus']"),
    ("%forge_spawn quickstart --set generator.num_replicas=0", "GeneratorConfig.num_replicas=0: must be an integer"),
    ("%forge_spawn quickstart --replicas 0", "GeneratorConfig.num_replicas=0"),
    ("%forge_spawn quickstart --set trainer.optimizer.lr", "write key=value with a dotted key"),
    ("%forge_spawn quickstart --hosts 2", "--hosts applies to a bare mesh"),
    ("%forge_spawn quickstart -o 1run", "-o '1run': a variable name is needed"),
    ("%forge_spawn missing.yaml", "'missing.yaml': no such YAML file"),
    ("%forge_spawn os:getcwd", "returned a str; a recipe must return a RunConfig"),
    ("%forge_spawn no_such_module:f",
     "recipe='no_such_module:f': cannot import it here (No module named 'no_such_module')"),
    ("%forge_spawn --procs 2 --replicas 2 -o m", "--replicas, --set, --lora, --on and --actor configure a run; give a "
                                                "recipe first"),
    ("%forge_spawn quickstart --lora 8 --on base --replicas 2", "--on base: the run uses that run's generators and "
                                                                "trainer process; --replicas, --procs and --gpus"),
    ("%forge_spawn --procs 0 -o m", "procs=0: a mesh needs at least one process"),
    ("%forge_spawn --procs 1 --hosts 2 -o m", "meshes that span several hosts are not supported yet"),
    ("%forge_spawn --procs 1 --hosts gpus -o m", "hosts='gpus' names a job's host mesh, but no job is in use"),
    ("%forge_cluster --processes a=0", "each host mesh needs a whole number of hosts >= 1"),
    ("%forge_cluster --processes a=1 --attach x", "give one of JOB, --processes, --attach or --release"),
    ("%forge_cluster nothing_here", "'nothing_here' is not a variable holding a monarch job"),
    ("%forge_cluster --attach /nonexistent/job.pkl", "no job was saved at '/nonexistent/job.pkl'"),
    ("%forge_cluster --release", "no job is in use"),
    ("%forge_cluster slurm", "%forge_cluster slurm needs --nodes: a count (--nodes 3)"),
    ("%forge_cluster slurm --nodes three", "--nodes three: give a whole number of nodes, or MESH=N pairs"),
    ("%forge_cluster slurm --nodes trainer=1 generators=0", "give each host mesh a whole number of nodes >= 1"),
    ("%forge_cluster slurm --nodes 0", "give each host mesh a whole number of nodes >= 1"),
    ("%forge_cluster --nodes 3", "--nodes: for %forge_cluster slurm (e.g. %forge_cluster slurm --nodes 3)"),
    ("%forge_cluster --processes a=1 --time 1:00", "--time: for %forge_cluster slurm"),
    ("%forge_spawn --procs 1 --name my-mesh", "the mesh name 'my-mesh' is not a variable name; add -o VAR"),
    ("%forge_set lr", "'lr': write key=value"),
    ("%forge_set", "the following arguments are required: KEY=VALUE"),
    ("%forge_attach /nonexistent/run", "is not a run directory (no config.json)"),
    ("%forge_meshes extra", "%forge_meshes takes no arguments"),
    ("%forge_shutdown --name nope", "no run named 'nope'"),
    ("%forge_eval -k 0", "%forge_eval -k 0: k is the number of answers per prompt, an integer >= 1"),
    ("%forge_eval nothing_here", "%forge_eval nothing_here: no variable of that name"),
])
def test_misuse_raises_a_usage_error_that_says_what_to_do(ip, cell, says):
    assert says in usage_error(ip, cell)


@pytest.mark.skipif("__import__('torch').cuda.is_available()", reason="checks the message on a machine without CUDA")
@pytest.mark.parametrize("cell", ["%forge_spawn quickstart --gpus", "%forge_spawn --procs 1 --gpus -o m"])
def test_gpus_without_cuda_is_a_usage_error(ip, cell):
    assert "no CUDA device" in usage_error(ip, cell)


def test_a_namespace_variable_that_is_not_a_config_is_named(ip):
    ip.user_ns["five"] = 5
    assert "'five' holds a int, not a RunConfig" in usage_error(ip, "%forge_spawn five")


def test_forge_config_turns_yaml_into_a_validated_run_config(ip, capsys):
    assert ip.run_cell_magic("forge_config", "-o cfg", GOOD_YAML) is None
    cfg = ip.user_ns["cfg"]
    assert isinstance(cfg, RunConfig)
    assert (cfg.name, cfg.group_size, cfg.trainer.optimizer.lr, cfg.loop.rollout_loops) == ("from-yaml", 4, 2e-4, 3)
    assert "%forge_spawn cfg spawns it" in capsys.readouterr().out
    # without -o the config is the cell's result
    result = ip.run_cell("%%forge_config\n" + TORCHFORGE_YAML)
    assert isinstance(result.result, RunConfig)
    assert (result.result.generator.num_replicas, result.result.batch_size, result.result.max_policy_age) == (3, 8, 2)


@pytest.mark.parametrize(("yaml_text", "says"), [
    ("group_size: 1\n", "RunConfig.group_size=1: GRPO compares a group"),
    ("trainer:\n  optimizer: {lr: -1}\n", "TrainerConfig.optimizer.lr=-1: must be a positive number"),
    ("loop:\n  bogus: 1\n", "unknown key(s) ['loop.bogus']"),
    ("trainer:\n  loss: nope\n", "TrainerConfig.loss='nope': unknown loss"),
    ("bogus_section: {}\n", "unknown top-level key(s) ['bogus_section']"),
    ("name: [unclosed\n", "the cell is not valid YAML"),
])
def test_forge_config_errors_point_at_the_key(ip, yaml_text, says):
    assert says in usage_error(ip, "%%forge_config -o bad\n" + yaml_text)
    assert "bad" not in ip.user_ns


def test_a_config_variable_is_a_recipe_and_overrides_apply_to_it(ip):
    ip.run_cell_magic("forge_config", "-o mine", GOOD_YAML)
    # resolution found the variable; the override is then checked against its fields
    assert "unknown key(s) ['loop.nope']" in usage_error(ip, "%forge_spawn mine --set loop.nope=1")
    assert "LoopConfig.rollout_loops=0" in usage_error(ip, "%forge_spawn mine --set loop.rollout_loops=0")


def test_awaited_magics_are_awaited_where_await_is_allowed(ip):
    cell = ("%forge_step 3\nx = %forge_step 2\n%forge_status\nfor i in range(2):\n    %forge_run\n"
            "def f():\n    %forge_step 1\nasync def g():\n    %forge_stop\nawait get_ipython().run_line_magic("
            "'forge_step', '1')\n")
    lines = ip.transform_cell(cell).splitlines()
    assert lines[0] == "await get_ipython().run_line_magic('forge_step', '3')"
    assert lines[1] == "x = await get_ipython().run_line_magic('forge_step', '2')"
    assert lines[2] == "get_ipython().run_line_magic('forge_status', '')"  # synchronous
    assert lines[4] == "    await get_ipython().run_line_magic('forge_run', '')"
    assert lines[6] == "    get_ipython().run_line_magic('forge_step', '1')"  # await is a syntax error in a def
    assert lines[8] == "    await get_ipython().run_line_magic('forge_stop', '')"
    assert lines[9] == "await get_ipython().run_line_magic('forge_step', '1')"  # not awaited twice
    # a cell that awaits at top level itself (notebook 09's first cell) still has its magics awaited
    mixed = ip.transform_cell("run = await spawn()\n%forge_serve --tool-parser simple\n").splitlines()
    assert mixed == ["run = await spawn()",
                     "await get_ipython().run_line_magic('forge_serve', '--tool-parser simple')"]


def test_bare_mesh_is_listed_and_shutdown_leaves_no_process(ip, capsys):
    assert ip.run_cell("%forge_spawn --procs 2 -o workers").success
    mesh = ip.user_ns["workers"]
    assert mesh.name == "workers" and mesh.procs == 2 and len(mesh.pids) == 2
    assert all(pid_alive(p) for p in mesh.pids)
    assert "bound to `workers`" in capsys.readouterr().out

    assert ip.run_cell("%forge_meshes").success
    table = capsys.readouterr().out
    assert "1 mesh(es) held by this kernel" in table
    row = next(line for line in table.splitlines() if line.startswith("workers"))
    assert row.split()[:6] == ["workers", "2", "kernel", ",".join(map(str, mesh.pids)), "running", "-"]

    assert ip.run_cell("%forge_shutdown").success
    out = capsys.readouterr().out
    assert "0 run(s) and 1 mesh(es): all 2 process(es) exited" in out, out
    assert not any(pid_alive(p) for p in mesh.pids)
    ip.run_cell("%forge_meshes")
    assert "no meshes" in capsys.readouterr().out


def test_the_table_renders_as_html_too():
    from forge_nb.magics._display import Table

    table = Table([{"name": "a<b", "pids": [1, 2], "loss": 0.123456}], title="t")
    assert "<td>a&lt;b</td>" in table._repr_html_() and "<td>1,2</td>" in table._repr_html_()
    assert repr(table).splitlines() == ["t", "name  pids  loss", "a<b   1,2   0.1235"]


def test_a_step_summary_is_a_few_lines_however_many_steps_ran():
    """%forge_step N shows the first and last of its steps, their rate and the events they saw (issue 36: 150 rows
    were a 3,700 px cell); every row stays in run.metrics and on the dashboard."""
    from forge_nb.magics._display import step_summary

    rows = [{"step": i, "loss": 1.0 / i, "reward/mean": i / 150, "time": 100 + 0.05 * i} for i in range(1, 151)]
    events = [{"kind": "checkpoint", "step": 50}, {"kind": "checkpoint", "step": 100}, {"kind": "rewind", "step": 120},
              {"kind": "state", "step": 150}]
    text = repr(step_summary(rows, events, title="run 'q': 150 step(s), now paused"))
    lines = [line for line in text.splitlines() if line]
    assert len(lines) <= 6, text
    assert lines[0] == "run 'q': 150 step(s), now paused"
    assert lines[2].split()[0] == "1" and lines[3].split()[0] == "150"  # then and now
    assert "steps 1-150: 20.0 steps/s" in text
    assert "events: checkpoint x2, rewind x1" in text and "state" not in text.split("events:")[1]
    html = step_summary(rows, events, title="t")._repr_html_()
    assert html.count("<tr>") == 3  # the header and two steps
