"""IPython magics for forge_nb: ``%load_ext forge_nb``, then drive a run from cells.

=====================================================  =========================================================
Magic                                                  What it does
=====================================================  =========================================================
%forge_spawn RECIPE [--name N] [--replicas K]          spawn a run's services and wait for them; RECIPE is
  [--procs P] [--gpus] [--set KEY=VALUE ...]           quickstart, module:function, a .yaml path or a
  [--actor SERVICE=CLASS ...] [-o VAR]                 RunConfig variable; binds run (or VAR) and, where
                                                       free, policy, trainer, ref_model
%forge_spawn --procs N [--gpus] [--hosts H] -o NAME    a bare process mesh for your own actors
%forge_cluster [JOB | --processes M=N ...]             put what spawns next on a monarch job's hosts (SLURM,
  [--attach PATH] [--release]                          Kubernetes, ProcessJob); no argument: show the hosts
%forge_cluster slurm --nodes N [--partition P]         nodes from SLURM (sbatch), released at %forge_shutdown
  [--gpus-per-node G] [--time T]
%%forge_config [-o VAR]                                the cell's YAML as a validated RunConfig
%forge_attach PATH [-o VAR]                            bring back a run from its directory (new kernel)
%forge_run [--steps N]                                 start the loops in the background (N steps, then pause)
%forge_pause / %forge_resume                           pause at the next boundary / continue
%forge_step N                                          run N training steps, wait, show a short summary
%forge_stop                                            stop the loops at a step boundary (services stay up)
%forge_set KEY=VALUE ...                               hyperparameters for the next step (lr, temperature, ...)
%forge_status                                          services, replicas, loops, step, version, last values;
                                                       with several live runs, one line per run
%forge_episodes [-n K] [--version V] [--min-reward R]  recent episodes as a table (--turns: turn by turn)
%forge_eval [PROMPTS] [-k K] [-n N] [-o VAR]           k answers per held-out prompt from the current version's
  [--episode-fn FN]                                    generators: avg@k and unbiased pass@k (run.evaluate)
%forge_logs [SERVICE[i]] [-n N] [--level L]           what the processes wrote (vLLM, monarch, torch): to
                                                       files in the run directory, not to the cells
%forge_dashboard [--side]                              the live dashboard (forge_nb.widgets); --side: in a
                                                       JupyterLab panel beside the notebook, always in view
                                                       (in the cell, saying so, where no panel can be made)
%forge_serve [--tool-parser P] [--port N] [-o VAR]     the policy as an OpenAI-compatible endpoint on 127.0.0.1
  [--stop]                                             (token: VAR.token); agent code trains through it
%forge_serve --tinker [--port N] [-o VAR] [--stop]     the Tinker API on a LoRA run (tinker.ServiceClient); each
                                                       training client a LoRA run on its base
%forge_meshes                                          every process mesh the kernel holds, and those kept warm
%forge_shutdown [--name N | --all]                     stop loops, services and meshes; check no process is left;
                                                       release the job's hosts (%forge_cluster); --name N keeps
                                                       its processes warm for the next spawn
%forge_help                                            this table
=====================================================  =========================================================

Several runs in one kernel: every run magic takes ``--name N`` (a run's name or a variable holding a
Run). With one live run (not shut down) the magics act on it; with several and no ``--name`` they
raise a ``UsageError`` that lists the live runs, except ``%forge_status``, which then shows one line
per run. ``%forge_shutdown`` without ``--name`` stops the kernel's run and every mesh, and refuses
when several runs are live (``--all`` stops them all). Runs made with ``forge_nb.spawn`` and held in
a variable count as live runs too. Names are never taken from another run: ``-o VAR`` holding a live
run (``run`` by default) is refused before anything spawns, and ``policy``/``trainer``/``ref_model``
are bound only where free or held by a shut-down run; otherwise the new run's stay ``VAR.policy`` etc.
``MAGIC?`` shows a magic's options. Misuse raises IPython's ``UsageError`` with a message that says
what to write instead.

Waiting without blocking the loop: ``%forge_spawn``, ``%forge_attach``, ``%forge_step``,
``%forge_stop`` and ``%forge_shutdown`` wait for the run, and ``%forge_run``, ``%forge_resume`` and
``%forge_set`` need a running event loop to start tasks on. These return a coroutine, and an input
transformer puts ``await`` in front of them (see ``_await``). The cell then runs as a task on the
kernel's event loop, where the Run's loops run too: the cell waits, training goes on, an interrupt
cancels the cell only (with ipykernel 7.4 a background task keeps ticking during and between such
cells). The alternatives fail there: ``loop.run_until_complete`` inside a cell raises "This
event loop is already running"; a spawn in a background task would leave ``%forge_run`` in the next
cell with no run yet; re-entering the loop (nest_asyncio) breaks the tasks it interleaves. In a
terminal IPython the same cells work, but background loops only advance while some cell awaits.

Magics are thin: parse (``_parse``), call the public API (``forge_nb.spawn``, ``Run``), keep the
handle (``_runs``), display a table (``_display``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["help_text", "load_ipython_extension", "unload_ipython_extension"]


def help_text() -> str:
    """The table of magics above (the module docstring between its first and last ``====`` rule)."""
    lines = (__doc__ or "").splitlines()
    rules = [i for i, line in enumerate(lines) if line.startswith("====")]
    return "\n".join(lines[rules[0]: rules[-1] + 1])


def load_ipython_extension(ipython: Any) -> None:
    """Register the %forge_* magics and the transformer that awaits them; start forge_nb's runtime."""
    from forge_nb.magics._await import await_forge_magics
    from forge_nb.magics._cluster import ClusterMagics
    from forge_nb.magics._control import ControlMagics
    from forge_nb.magics._eval import EvalMagics
    from forge_nb.magics._runs import Runs
    from forge_nb.magics._serve import ServeMagics
    from forge_nb.magics._spawn import SpawnMagics
    from forge_nb.system.runtime import lifecycle

    # Before anything imports monarch, so its supervision env applies (see forge_nb.system.runtime.lifecycle).
    lifecycle.ensure_started()
    runs = Runs.of(ipython)
    ipython.register_magics(SpawnMagics(ipython, runs), ControlMagics(ipython, runs, help_text()),
                            ClusterMagics(ipython), ServeMagics(ipython, runs), EvalMagics(ipython, runs))
    if await_forge_magics not in ipython.input_transformers_post:
        ipython.input_transformers_post.append(await_forge_magics)


def unload_ipython_extension(ipython: Any) -> None:
    """Remove the magics and the transformer; runs and meshes stay up (``%forge_shutdown`` first to stop them)."""
    from forge_nb.magics._await import await_forge_magics

    for kind in ("line", "cell"):
        table = ipython.magics_manager.magics[kind]
        for name in [n for n in table if n.startswith("forge_")]:
            del table[name]
    if await_forge_magics in ipython.input_transformers_post:
        ipython.input_transformers_post.remove(await_forge_magics)
