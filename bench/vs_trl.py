"""The CPU quickstart against TRL's GRPOTrainer on the same task, side by side.

Both learn the quickstart's toy task ("c" -> "cccc", `forge_nb.rl.tasks.ToyTask`, scored by its
`PatternReward`) from the same locally built tiny Qwen3 (`forge_nb.models.build_tiny_model`), with 16
completions of at most 4 tokens a step at temperature 1.0 and no KL term:

- **TRL** (`trl.GRPOTrainer`): generation by transformers in the training process, configured as the
  quickstart trains (:func:`fair_trl_settings`, read from ``forge_nb.quickstart()``): float32, no gradient
  checkpointing, the GRPO loss with the same clip range and KL weight, fused AdamW at the same constant
  learning rate, the same gradient clipping, group size, batch, completion length and sampling. It runs as
  its users run it: a script (``bench/_trl_grpo.py``) in an environment of TRL and what it needs only
  (``TRL_ENV``: torch, trl, transformers, datasets, accelerate at forge_nb's versions; made once under
  ``~/.cache/forge_nb``), where vLLM is absent: with vLLM installed, as in forge_nb's environment, importing
  TRL's trainer imports vLLM too (~5 s its CPU users never pay). ``--trl-env same`` runs it with forge_nb's
  interpreter instead (the ``bench`` extra installs TRL there). Each side's interpreter is printed, and each
  seed's line says when its imports were done, its model built and its first step taken.
- **forge_nb**: `forge_nb.quickstart()` as shipped (a vLLM CPU generator service, its engine inside the
  generator actor's process, the trainer actor, weights through torchstore; groups of 4, lr 7e-4, async,
  the generator loading each version while the next step trains; the trainer sampling the rollouts until the
  generator serves: its line says when it began to), started in the background as ``%forge_run`` does and stopped
  after ``--forge-steps`` steps.

Both sides' settings are printed first. Each run is its own process, started by this script (the clock
starts at its launch, so imports, model loading and spawning count), one seed after another with the order
flipped each seed so that neither side always runs on a machine warmed (or loaded) by the other. Per run it
records every step's time and mean reward and reports the steady rate (steps per second from step ``--skip``
to step ``--forge-steps``, the same window on both sides: TRL runs many more steps in its budget and slows
by ~10% over them) and the time from launch to the first step whose last-10 mean reward is >= 0.8. It
prints, medians over seeds:

    RESULT quickstart_steps_per_s_vs_trl <forge_nb steady steps/s / TRL's> (target >= 1; first 0.5)
    RESULT seeds_reaching_0.8 forge_nb <n> trl <n> of <seeds>        (target: forge_nb >= TRL)
    RESULT time_to_0.8_vs_trl <forge_nb seconds from launch to 0.8 / TRL's> (target <= 1.0)
    RESULT peak_memory_mb forge_nb <MB> trl <MB>   (the largest summed PSS of each side's processes, sampled
                                                   every 2 s the same way: forge_nb counts all of its own)
    RESULT quickstart_launch_to_first_step_s <forge_nb: launch to the first training step> (TRL's beside it)
    RESULT quickstart_launch_to_first_step_vs_trl <forge_nb's launch to first step / TRL's> (target <= 1.0)
    RESULT quickstart_spawn_to_first_step_s <forge_nb: from calling spawn, as %forge_spawn does in a kernel
                                             that has imported forge_nb, to the first step> (target 15)
    RESULT quickstart_second_spawn_to_first_step_s <forge_nb: a second run's spawn to its first step, in the
                                             same process after the first run's shutdown> (target <= 2)

and forge_nb's per-step breakdown (the controller's own ``time/*`` metrics, medians over the steady
steps): waiting for a batch, the trainer's ``train_step``, pushing the weights, the generators' update (in
async mode it overlaps the next step, so ``step`` is less than the sum), the whole step.
A run that never reaches 0.8 in its budget counts as infinitely slow for that median.

``--busy N`` runs both sides on a busier machine: N other processes, each spinning one core in a Python loop
at the same priority, run through the whole comparison (started before the first seed, killed after the last),
as another user's job would. The RESULT lines keep their names; the first lines of the output say N.
TRL runs with torch's default intra-op threads (one a core), as its users do, unless ``--trl-threads N``;
forge_nb's trainer and generator take one each on two cores (``forge_nb.actors.training.policy_model``,
``forge_nb.actors.engine.inproc``). Each TRL seed's line says how many it had. On a quiet machine TRL's default
is its faster setting; beside other work its two threads wait on each other and one is faster by far, so a
busy comparison is fair only when run both ways (``bench/HISTORY.md``, "A busier machine, TRL's threads, and the
trainer compiled").

    .venv/bin/python bench/vs_trl.py [--seeds 5] [--trl-budget-s 60] [--forge-steps 120] [--busy 0]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

TARGET = 0.8
WINDOW = 10  # steps in the moving mean that must reach TARGET
BREAKDOWN = ("time/wait_batch_s", "time/train_s", "time/push_s", "time/update_s", "time/step_s")


# -- what a run reports -----------------------------------------------------------------------------

def reach_time(times: list[float], rewards: list[float], launch: float) -> float:
    """Seconds from launch to the first step whose last-WINDOW mean reward is >= TARGET (inf if none)."""
    for i in range(WINDOW - 1, len(rewards)):
        if sum(rewards[i - WINDOW + 1 : i + 1]) / WINDOW >= TARGET:
            return times[i] - launch
    return math.inf


def steady_rate(times: list[float], skip: int) -> float:
    """Steps per second from step ``skip`` to the last (the first steps carry warm-up costs)."""
    if len(times) <= skip + 1:
        return float("nan")
    return (len(times) - 1 - skip) / (times[-1] - times[skip])


def summary(record: dict[str, Any], skip: int, last: int) -> dict[str, Any]:
    """``rate``: steps/s over steps ``skip``..``last`` (the same window on both sides: TRL runs far more steps
    and slows by ~10% over them); ``rate_all``: over every step from ``skip``."""
    times, rewards, launch = record["times"], record["rewards"], record["launch"]
    return {"steps": len(times), "rate": steady_rate(times[:last + 1], skip), "rate_all": steady_rate(times, skip),
            "to_target_s": reach_time(times, rewards, launch),
            "first_step_s": times[0] - launch if times else math.inf,
            "spawn_to_first_step_s": times[0] - record.get("spawn_called", math.nan) if times else math.inf,
            "last10": statistics.mean(rewards[-WINDOW:]) if rewards else 0.0,
            "peak_mb": record["peak_mb"], "peak_procs": record["peak_procs"],
            "second_spawn_s": record.get("second_spawn_s", math.nan)}


# -- the two sides, each in its own process ---------------------------------------------------------

def tiny_model(seed: int, folder: Path) -> Path:
    from forge_nb.models import TinyModelConfig, build_tiny_model

    return build_tiny_model(folder / f"tiny-{seed}", TinyModelConfig(alphabet="abcdefgh", seed=seed))


def clip_range(loss: Any) -> tuple[float, float]:
    """(eps_low, eps_high) of a GRPO-family loss: its ``clip_low``/``clip_high`` where set, else ``clip_eps``."""
    low = loss.clip_eps if loss.clip_low is None else loss.clip_low
    return low, loss.clip_eps if loss.clip_high is None else loss.clip_high


def fair_trl_settings(cfg: Any, steps_per_generation: int = 1) -> dict[str, Any]:
    """TRL's ``GRPOConfig`` fields set as forge_nb's quickstart ``cfg`` trains (TRL's own defaults on
    this CPU are bf16, gradient checkpointing, the DAPO loss and a linear decay, which the quickstart does not do).

    Everything that shapes a step or the learning is read from ``cfg``: group size, batch, completion length,
    sampling, learning rate, clip range, KL weight, gradient clipping, weight decay. The optimizer is AdamW with
    torch's fused CPU kernel on both sides (``forge_nb.config.trainer_sections.OptimizerConfig.build``), float32 on
    both (the tiny model is saved in float32 and the quickstart's generator and trainer run it so).
    """
    from forge_nb.rl.losses import make_loss

    loss = make_loss(cfg.trainer.loss, **cfg.trainer.loss_config)
    eps_low, eps_high = clip_range(loss)
    sampling, opt = cfg.generator.sampling_params, cfg.trainer.optimizer
    return {
        "bf16": False, "fp16": False, "gradient_checkpointing": False,
        "model_init_kwargs": {"dtype": "float32"},
        "loss_type": loss.name, "epsilon": eps_low, "epsilon_high": eps_high, "beta": loss.beta,
        "scale_rewards": "group", "num_iterations": 1,
        "optim": "adamw_torch_fused", "learning_rate": opt.lr, "lr_scheduler_type": "constant",
        "weight_decay": opt.weight_decay, "max_grad_norm": cfg.trainer.training.max_norm,
        "adam_beta1": opt.beta1, "adam_beta2": opt.beta2, "adam_epsilon": opt.eps,
        "per_device_train_batch_size": cfg.batch_size, "num_generations": cfg.group_size,
        "max_completion_length": cfg.max_res_tokens,
        "temperature": sampling.get("temperature", 1.0), "top_p": sampling.get("top_p", 1.0),
        "steps_per_generation": steps_per_generation,
    }


def forge_settings(cfg: Any) -> dict[str, Any]:
    """What forge_nb's side trains with, in the same words as :func:`fair_trl_settings` prints."""
    from forge_nb.rl.losses import make_loss

    loss = make_loss(cfg.trainer.loss, **cfg.trainer.loss_config)
    eps_low, eps_high = clip_range(loss)
    opt = cfg.trainer.optimizer
    return {
        "dtype": cfg.generator.engine_args.get("dtype", "auto") + " (generator), float32 (trainer)",
        "gradient_checkpointing": False, "loss": loss.name, "clip": (eps_low, eps_high), "beta": loss.beta,
        "advantages": "group (r - mean) / (std + 1e-4)", "optimizer": "AdamW fused (CPU), constant lr",
        "lr": opt.lr, "weight_decay": opt.weight_decay, "betas": (opt.beta1, opt.beta2), "eps": opt.eps,
        "max_norm": cfg.trainer.training.max_norm, "batch_size": cfg.batch_size, "group_size": cfg.group_size,
        "max_res_tokens": cfg.max_res_tokens,
        "sampling": dict(cfg.generator.sampling_params), "generator_replicas": cfg.generator.num_replicas,
        "loop": f"{cfg.loop.mode}, {cfg.loop.rollout_loops} rollout loops, max_policy_age {cfg.max_policy_age}, "
                f"generators loading every {cfg.loop.sync_interval} versions (sync_interval)",
    }


#: what a TRL user on CPU installs, at the versions forge_nb's environment holds (the same torch and transformers on
#: both sides: the same model code and kernels)
TRL_ENV = ("torch==2.13.0", "trl==1.16.0", "transformers==5.19.0", "datasets==4.7.0", "accelerate==1.16.0")


def trl_python(args: argparse.Namespace) -> str:
    """The interpreter TRL's side runs with: ``--trl-python``; forge_nb's own with ``--trl-env same`` (vLLM
    installed, which TRL then imports); by default a virtualenv holding ``TRL_ENV`` only, made once and kept under
    ``~/.cache/forge_nb`` (pip takes the wheels from its cache after the first time)."""
    if args.trl_python:
        return args.trl_python
    if args.trl_env == "same":
        return sys.executable
    import hashlib

    pins = hashlib.sha256(" ".join(TRL_ENV).encode()).hexdigest()[:10]
    folder = Path.home() / ".cache" / "forge_nb" / f"bench-trl-{pins}"
    python = folder / "bin" / "python"
    if not (folder / "ready").exists():
        print(f"making TRL's environment ({', '.join(TRL_ENV)}) in {folder}", flush=True)
        base = getattr(sys, "_base_executable", sys.executable)  # the interpreter behind forge_nb's virtualenv
        subprocess.run([base, "-m", "venv", "--clear", str(folder)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *TRL_ENV],
                       check=True)
        (folder / "ready").write_text(" ".join(TRL_ENV))
    return str(python)


def trl_spec(args: argparse.Namespace, workdir: Path) -> Path:
    """What TRL's side is handed (``bench/_trl_grpo.py``): the tiny model, the task's rows, the GRPOConfig fields."""
    import forge_nb
    from forge_nb.rl.tasks import ToyTask

    task = ToyTask(seed=args.seed)
    rows = [task.sample() for _ in range(max(64, 2 * args.trl_steps + 64))]
    spec = {"model": str(tiny_model(args.seed, workdir)), "seed": args.seed, "threads": args.trl_threads,
            "rows": [{"prompt": r["request"], "target": r["target"]} for r in rows],
            "settings": fair_trl_settings(forge_nb.quickstart(), args.trl_steps_per_generation),
            "budget_s": args.trl_budget_s, "max_steps": args.trl_steps,
            "output_dir": str(workdir / f"trl-out-{args.seed}")}
    path = workdir / f"trl-spec-{args.seed}.json"
    path.write_text(json.dumps(spec))
    return path


def forge_side(args: argparse.Namespace) -> dict[str, Any]:
    """The quickstart as shipped, ``--forge-steps`` steps (stopping early once ``--forge-budget-s`` passed)."""
    started = time.time()
    import forge_nb

    imported = time.time()

    async def train() -> dict[str, Any]:
        cfg = forge_nb.quickstart(run_dir=str(Path(args.workdir) / f"forge-run-{args.seed}"), seed=args.seed)
        spawn_called = time.time()
        run = await forge_nb.spawn(cfg, progress=False)
        spawned = time.time()
        run.start()  # in the background, as %forge_run does: no pause at chunk boundaries
        try:
            while run.current_step < args.forge_steps and time.time() - spawned < args.forge_budget_s:
                if run.error:
                    raise RuntimeError(run.error)
                await asyncio.sleep(0.05)
        finally:
            await run.stop()
        rows = [r for r in run.metrics.rows if "reward/mean" in r]
        up = next((e["time"] for e in run.metrics.events if e["kind"] == "generators_up"), math.nan)
        steady = rows[args.skip:]
        breakdown = {k: statistics.median(r[k] for r in steady if k in r) for k in BREAKDOWN
                     if any(k in r for r in steady)}
        await run.shutdown()
        # a second run in the same process, as a kernel's next %forge_spawn: the first's processes kept warm
        again = time.time()
        second = await forge_nb.spawn(forge_nb.quickstart(name="second", seed=args.seed,
                                                          run_dir=str(Path(args.workdir) / f"forge-2-{args.seed}")),
                                      progress=False)
        await second.step(1)
        second_s = time.time() - again
        await forge_nb.shutdown_all()
        return {"times": [r["time"] for r in rows], "rewards": [r["reward/mean"] for r in rows],
                "spawn_called": spawn_called, "spawned": spawned, "breakdown": breakdown, "started": started,
                "imported": imported, "built": spawned, "python": sys.executable, "second_spawn_s": second_s,
                "generators_up": up, "steps_from_trainer": sum(1 for r in rows if r.get("rollout/from_trainer"))}

    return asyncio.run(train())


def child(args: argparse.Namespace) -> None:
    Path(args.out).write_text(json.dumps(forge_side(args)))


def tree_pss_mb(root: Any) -> tuple[float, int]:
    """The summed proportional set size (PSS, MB) of ``root`` and every process under it, and how many there
    are: shared memory (vLLM's, the weights' files in /dev/shm mapped by several processes) counts once."""
    import psutil

    total, count = 0, 0
    for proc in [root, *root.children(recursive=True)]:
        try:
            with open(f"/proc/{proc.pid}/smaps_rollup") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("Pss:"))
            count += 1
        except (OSError, StopIteration, psutil.Error):
            pass  # ended between the listing and the read
    return total / 1024, count


def launch(side: str, seed: int, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Run one side in a fresh process; its record, with the launch time and its peak memory (the largest
    summed PSS of its process tree, sampled every ``--memory-every-s`` seconds, the same way on both sides)."""
    import psutil

    out = workdir / f"{side}-{seed}.json"
    log = workdir / f"{side}-{seed}.log"
    if side == "trl":  # a script of its own, with TRL's interpreter; what forge_nb decides is in the spec
        spec = trl_spec(argparse.Namespace(**{**vars(args), "seed": seed}), workdir)
        command = [args.trl_interpreter, os.path.join(ROOT, "bench", "_trl_grpo.py"), str(spec), str(out)]
    else:
        command = [sys.executable, os.path.abspath(__file__), "--child", side, "--seed", str(seed), "--out",
                   str(out), "--workdir", str(workdir), "--forge-steps", str(args.forge_steps), "--forge-budget-s",
                   str(args.forge_budget_s), "--skip", str(args.skip)]
    launched = time.time()
    peak_mb, peak_procs = 0.0, 0
    with open(log, "w") as f:
        child_proc = subprocess.Popen(command, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT)
        root = psutil.Process(child_proc.pid)
        while child_proc.poll() is None:
            mb, procs = tree_pss_mb(root)
            if mb > peak_mb:
                peak_mb, peak_procs = mb, procs
            time.sleep(args.memory_every_s)
    if child_proc.returncode != 0:
        tail = log.read_text().splitlines()[-15:]
        raise SystemExit(f"{side} seed {seed} failed (exit {child_proc.returncode}); the end of {log}:\n"
                         + "\n".join(tail))
    record = json.loads(out.read_text())
    record.update(launch=launched, peak_mb=peak_mb, peak_procs=peak_procs)
    return record


def ratio(a: float, b: float) -> float:
    if math.isinf(a) and math.isinf(b):
        return float("nan")
    return a / b if b else math.inf


@contextlib.contextmanager
def other_work(processes: int) -> Iterator[None]:
    """``processes`` processes that each spin one core for as long as the block runs (``--busy``), and end by
    themselves if this process is killed before it can stop them (they check their parent every ~0.1 s)."""
    spin = "import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n    for _ in range(2_000_000): pass"
    spinners = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(processes)]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def main(args: argparse.Namespace) -> None:
    import importlib.util

    import forge_nb

    args.trl_interpreter = trl_python(args)
    if args.trl_env == "same" and importlib.util.find_spec("trl") is None:
        raise SystemExit("--trl-env same runs TRL with this interpreter, which lacks it: .venv/bin/pip install -e "
                         "'.[bench]'")
    print(f"interpreters: forge_nb {sys.executable}; TRL {args.trl_interpreter}", flush=True)
    workdir = Path(tempfile.mkdtemp(prefix="bench-vs-trl-"))
    print(f"logs and records in {workdir}", flush=True)
    cfg = forge_nb.quickstart()
    print("forge_nb (forge_nb.quickstart()): " + ", ".join(f"{k}={v}" for k, v in forge_settings(cfg).items()))
    print("TRL (GRPOConfig, besides use_cpu and logging): "
          + ", ".join(f"{k}={v}" for k, v in fair_trl_settings(cfg, args.trl_steps_per_generation).items()),
          flush=True)
    print(f"other work on the machine: {args.busy} process(es) spinning a core each (--busy), "
          f"on {os.cpu_count()} cores", flush=True)
    with other_work(args.busy):
        results, breakdowns = compare(args, workdir)
    report(results, breakdowns, args)


def compare(args: argparse.Namespace, workdir: Path) -> tuple[dict[str, list[dict[str, Any]]], list[dict[str, float]]]:
    """Every seed's run of both sides, in alternating order: (summaries by side, forge_nb's step breakdowns)."""
    results: dict[str, list[dict[str, Any]]] = {"trl": [], "forge_nb": []}
    breakdowns: list[dict[str, float]] = []
    for seed in range(args.seeds):
        order = ("trl", "forge_nb") if seed % 2 == 0 else ("forge_nb", "trl")
        for side in order:
            record = launch("trl" if side == "trl" else "forge", seed, args, workdir)
            s = summary(record, args.skip, args.forge_steps)
            results[side].append(s)
            at = {k: record[k] - record["launch"] for k in ("started", "imported", "built")}
            extra = (f"; process start +{at['started']:.1f} s, imports done +{at['imported']:.1f} s, model built "
                     f"+{at['built']:.1f} s")
            if side == "trl":
                extra += (f"; trained parameters {'/'.join(record['param_dtypes'])}, torch threads "
                          f"{record['threads']}, vLLM imported: {record['vllm_imported']}")
            if side == "forge_nb":
                breakdowns.append(record["breakdown"])
                up, own = record["generators_up"] - record["launch"], record["steps_from_trainer"]
                extra += (f"; spawn called +{record['spawn_called'] - record['launch']:.1f} s; generator serving "
                          f"+{up:.1f} s ({own} steps on the trainer's rollouts); a second run's spawn to its first "
                          f"step {record['second_spawn_s']:.2f} s")
            print(f"seed {seed} {side:8}: {s['steps']:5d} steps, {s['rate']:6.2f} steps/s over steps {args.skip}-"
                  f"{args.forge_steps} ({s['rate_all']:.2f} over all), first step "
                  f"{s['first_step_s']:5.1f} s, last-10 reward {s['last10']:.2f}, reward {TARGET} at "
                  f"{s['to_target_s']:.1f} s from launch, peak memory {s['peak_mb']:.0f} MB in {s['peak_procs']} "
                  f"process(es){extra}", flush=True)
    return results, breakdowns


def report(results: dict[str, list[dict[str, Any]]], breakdowns: list[dict[str, float]],
           args: argparse.Namespace) -> None:
    """The medians over seeds and the RESULT lines."""
    med = {side: {k: statistics.median(r[k] for r in rs)
                  for k in ("rate", "to_target_s", "first_step_s", "spawn_to_first_step_s", "peak_mb")}
           for side, rs in results.items()}
    for side, m in med.items():
        reached = sum(math.isfinite(r["to_target_s"]) for r in results[side])
        print(f"{side:8} median: {m['rate']:.2f} steps/s, first step {m['first_step_s']:.1f} s, "
              f"reward {TARGET} at {m['to_target_s']:.1f} s from launch ({reached} of {len(results[side])} "
              f"seeds reached it), peak memory {m['peak_mb']:.0f} MB")
    parts = [f"{k.removeprefix('time/').removesuffix('_s')} {1000 * statistics.median(b[k] for b in breakdowns):.0f} ms"
             for k in BREAKDOWN if all(k in b for b in breakdowns)]
    print("forge_nb per step (median over its steady steps, then over seeds): " + ", ".join(parts))
    print(f"RESULT quickstart_steps_per_s_vs_trl {ratio(med['forge_nb']['rate'], med['trl']['rate']):.3f} "
          "(target >= 1; first milestone 0.5)")
    reached = {side: sum(math.isfinite(r["to_target_s"]) for r in rs) for side, rs in results.items()}
    print(f"RESULT seeds_reaching_0.8 forge_nb {reached['forge_nb']} trl {reached['trl']} of {args.seeds} "
          "(target: forge_nb >= TRL)")
    print(f"RESULT time_to_0.8_vs_trl {ratio(med['forge_nb']['to_target_s'], med['trl']['to_target_s']):.2f} "
          "(target <= 1.0; 0 when most of TRL's seeds never reached it)")
    print(f"RESULT peak_memory_mb forge_nb {med['forge_nb']['peak_mb']:.0f} trl {med['trl']['peak_mb']:.0f} "
          f"(ratio {med['forge_nb']['peak_mb'] / med['trl']['peak_mb']:.2f})")
    print(f"RESULT quickstart_launch_to_first_step_s {med['forge_nb']['first_step_s']:.1f} (TRL: "
          f"{med['trl']['first_step_s']:.1f})")
    print(f"RESULT quickstart_launch_to_first_step_vs_trl "
          f"{ratio(med['forge_nb']['first_step_s'], med['trl']['first_step_s']):.2f} (target <= 1.0)")
    print(f"RESULT quickstart_spawn_to_first_step_s {med['forge_nb']['spawn_to_first_step_s']:.1f} (target 15)")
    second = statistics.median(r["second_spawn_s"] for r in results["forge_nb"])
    print(f"RESULT quickstart_second_spawn_to_first_step_s {second:.2f} (target <= 2; a second run in the same "
          "process after the first's shutdown)")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--trl-steps", type=int, default=3000, help="TRL: at most this many steps")
    ap.add_argument("--trl-budget-s", type=float, default=60.0, help="TRL: seconds of training at most")
    ap.add_argument("--forge-steps", type=int, default=120, help="forge_nb: steps")
    ap.add_argument("--forge-budget-s", type=float, default=120.0, help="forge_nb: seconds of training at most")
    ap.add_argument("--skip", type=int, default=10, help="steps left out of the steady rate")
    ap.add_argument("--trl-threads", type=int, default=0,
                    help="TRL: torch's intra-op threads (0: torch's default, one a core, as TRL's users run it)")
    ap.add_argument("--trl-steps-per-generation", type=int, default=1,
                    help="TRL: optimizer steps per generation (its users' default 1: on-policy; 2 reuses one "
                         "generation for two steps, as the quickstart's generators keep a version for two steps)")
    ap.add_argument("--busy", type=int, default=0, help="other processes spinning a core each through the run")
    ap.add_argument("--trl-env", choices=("own", "same"), default="own",
                    help="TRL's interpreter: own (a virtualenv of TRL and its needs only, as its users have; made "
                         "once under ~/.cache/forge_nb) or same (forge_nb's, where vLLM is installed)")
    ap.add_argument("--trl-python", help="run TRL's side with this interpreter instead")
    # A sample reads /proc/<pid>/smaps_rollup of every process of the side: ~60 ms of CPU for forge_nb's 1.4 GB,
    # taken from the two cores the sides run on. Every 0.5 s it cost the quickstart's start 1-2 s and both
    # sides' steps; every 2 s the peaks came out the same (bench/HISTORY.md).
    ap.add_argument("--memory-every-s", type=float, default=2.0, help="how often each side's memory is sampled")
    ap.add_argument("--child", choices=("forge",), help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--workdir", help=argparse.SUPPRESS)
    parsed = ap.parse_args()
    if parsed.child:
        child(parsed)
    else:
        main(parsed)
