"""LoRA on the quickstart: what a version moves, what the run learns, and whether a generator's memory grows as it
loads adapter after adapter.

1. **The quickstart with ``trainer.lora``** (rank ``--rank``, alpha twice that, lr ``--lr``; otherwise the recipe as
   it is: one vLLM CPU generator, groups of 4, batches of 16) trains ``--steps`` steps. Each row's
   ``weights/pushed_mb`` is what its push moved; the model's own bytes are its checkpoint's.
2. **Loads**: a LoRA Generator and a LoRA RLTrainer on the tiny model, as the run spawns them (actors on meshes of
   their own, one namespace): the trainer pushes a version and the generator loads it, ``--loads`` times after
   ``--warmup`` loads, each older version dropped from the store as a run drops it; the generator process's RSS
   (psutil) before and after, as vLLM's repeated LoRA loads were reported to leak host memory (TRL's tracker).
3. **Four runs on one base against four runs apart**, side by side in one invocation: four LoRA quickstart runs
   (the same settings, one generator replica each, learning rates 5e-4 to 4e-3) train ``--shared-steps`` steps
   at once, first each with services of its own (spawned together), then the last three spawned onto the first's
   base (``forge_nb.spawn(cfg, base=first)``). Throughput is all four runs' steps over the wall time of the
   training; memory is the peak, sampled every 0.5 s, of the summed PSS (proportional set size: shared pages
   split between the processes that map them) of every process the runs' meshes hold. The last run's join is
   timed from the spawn call to the end of its first trained step, the others idle.
4. **One trainer pass over four runs' rows**, in this process on one thread: the tiny model with four adapters
   (rank ``--rank``, the default targets) as a shared trainer holds them; a forward and backward of one run's
   batch (the quickstart's 16 rows of 8 tokens) with its adapter, against one pass over the four runs' 64 rows,
   each row through its own adapter (peft's mixed-adapter path: ``adapter_names`` on its LoRA layers), and 64
   rows of one adapter. Whether a trainer shared by several runs could gain by batching their steps together.

    RESULT lora_sync_bytes_ratio <adapter bytes a push moves / the model's bytes>
    RESULT lora_quickstart_final_reward <mean reward of the last 25 steps> (target >= 0.9)
    RESULT lora_engine_rss_growth_mb_per_100_loads <RSS growth of the generator's process per 100 loads> (target <= 5)
    RESULT lora_shared_base_throughput_ratio <steps/s of four runs on one base / four runs apart> (target >= 2.0)
    RESULT lora_shared_base_memory_ratio <peak PSS on one base / apart> (target <= 0.5)
    RESULT lora_join_base_to_first_step_s <a run spawned onto a live base: the call to its first step> (target <= 2)
    RESULT lora_mixed_pass_vs_four_passes <one pass over four runs' rows, each with its adapter / four passes>

    .venv/bin/python bench/lora.py [--steps 300] [--loads 200] [--rank 8] [--lr 2e-3] [--shared-steps 60]
                                   [--only-shared | --only-passes]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import psutil  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

import forge_nb  # noqa: E402
from forge_nb import weights  # noqa: E402
from forge_nb.models import build_tiny_model  # noqa: E402
from forge_nb.system.runtime import lifecycle, registry, spawning  # noqa: E402


def model_bytes(path: str) -> int:
    return sum(t.numel() * t.element_size() for t in load_file(f"{path}/model.safetensors").values())


async def quickstart(args: argparse.Namespace, workdir: str) -> dict[str, Any]:
    lora = {"rank": args.rank, "alpha": 2 * args.rank}
    cfg = forge_nb.quickstart(name="lora-bench", run_dir=f"{workdir}/run")
    run = await forge_nb.spawn(cfg, overrides={"trainer.lora": lora, "trainer.optimizer.lr": args.lr}, progress=False)
    print(f"quickstart with trainer.lora={lora}, lr {args.lr}, {args.steps} steps (recipe: group_size "
          f"{cfg.group_size}, batch_size {cfg.batch_size}, {cfg.generator.num_replicas} generator replica, "
          f"sync_interval {cfg.loop.sync_interval})", flush=True)
    try:
        rewards, pushed = [], []
        started = time.monotonic()
        while len(rewards) < args.steps:
            rows = await run.step(min(50, args.steps - len(rewards)))
            rewards += [r["reward/mean"] for r in rows]
            pushed += [r["weights/pushed_mb"] for r in rows if "weights/pushed_mb" in r]
            print(f"  step {len(rewards):4d}  reward(last 25) {statistics.mean(rewards[-25:]):.3f}  "
                  f"{len(rewards) / (time.monotonic() - started):.1f} steps/s", flush=True)
        whole = model_bytes(run.model)
    finally:
        await run.shutdown()
    return {"final": statistics.mean(rewards[-25:]), "pushed_bytes": statistics.median(pushed) * 2**20,
            "whole_bytes": whole}


async def loads(args: argparse.Namespace, workdir: str) -> dict[str, Any]:
    from forge_nb.actors.generator import Generator
    from forge_nb.actors.trainer import RLTrainer

    model = str(build_tiny_model(f"{workdir}/tiny"))
    lora = {"rank": args.rank, "alpha": 2 * args.rank}
    await weights.initialize_store()
    gen_mesh = await spawning.spawn_mesh("lora-bench-gen", 1)
    trainer_mesh = await spawning.spawn_mesh("lora-bench-train", 1)
    try:
        generator = gen_mesh.spawn("gen", Generator, engine_args={"model": model}, weights_namespace="lora-bench",
                                   sampling_params={"n": 1, "max_tokens": 4}, lora=lora)
        trainer = trainer_mesh.spawn("trainer", RLTrainer, model=model, lora=lora, weights_namespace="lora-bench")
        await trainer.setup.call()
        await generator.setup.call_one()
        process = psutil.Process(gen_mesh.pids[0])
        rss: list[float] = []
        for version in range(1, args.warmup + args.loads + 1):
            pushed = (await trainer.push_weights.call(version)).item(procs=0)
            await generator.update_weights.call_one(version, manifest=pushed["manifest"])
            await generator.generate.call_one("abc")  # the adapter is used, not only loaded
            if version > 1:  # as a run's WeightSync keeps only the version its generators hold
                await weights.drop_version(version - 1, namespace="lora-bench")
            if version >= args.warmup:
                rss.append(process.memory_info().rss / 2**20)
    finally:
        await gen_mesh.stop()
        await trainer_mesh.stop()
        await weights.shutdown_store()
    return {"first_mb": rss[0], "last_mb": rss[-1], "growth_per_100": (rss[-1] - rss[0]) * 100 / args.loads}


LRS = (5e-4, 1e-3, 2e-3, 4e-3)  # the four runs of part 3, as in example_notebooks/10_lora_sweep.py


def lora_run(args: argparse.Namespace, workdir: str, side: str, lr: float) -> tuple[Any, dict[str, Any]]:
    name = f"{side}-{lr:g}"
    return (forge_nb.quickstart(name=name, run_dir=f"{workdir}/{name}"),
            {"trainer.lora": {"rank": args.rank, "alpha": 2 * args.rank}, "trainer.optimizer.lr": lr,
             "generator.num_replicas": 1})


class PeakMemory:
    """The peak of the summed PSS of every process of the kernel's meshes, sampled every 0.5 s while it runs."""

    def __init__(self) -> None:
        self.peak_mb = 0.0
        self._task = asyncio.ensure_future(self._sample())

    async def _sample(self) -> None:
        while True:
            total = 0
            for pid in {p for mesh in registry.meshes() for p in mesh.pids}:
                try:
                    total += psutil.Process(pid).memory_full_info().pss
                except psutil.Error:  # gone meanwhile
                    pass
            self.peak_mb = max(self.peak_mb, total / 2**20)
            await asyncio.sleep(0.5)

    def stop(self) -> float:
        self._task.cancel()
        return self.peak_mb


def cpu_seconds() -> dict[str, float]:
    """CPU seconds so far of the kernel (this process) and of the meshes' processes, by mesh."""
    spent = {"kernel": sum(psutil.Process().cpu_times()[:2])}
    for mesh in registry.meshes():
        for pid in mesh.pids:
            try:
                spent[mesh.name] = spent.get(mesh.name, 0.0) + sum(psutil.Process(pid).cpu_times()[:2])
            except psutil.Error:
                pass
    return spent


async def train_together(runs: list[Any], steps: int) -> tuple[float, float, list[float]]:
    """Every run's ``steps`` at once: steps/s over all runs, the peak PSS meanwhile, each run's last-10 reward;
    prints where the CPU went (seconds per step of all runs: the kernel, the generators, the trainers)."""
    memory = PeakMemory()
    engines = {id(r.policy.replicas[0]): r.policy for r in runs}.values()  # one a run, or the one they share

    async def engine_steps() -> int:
        return sum([sum(await policy.engine_steps.fanout()) for policy in engines])

    stepped = await engine_steps()
    before, started = cpu_seconds(), time.monotonic()
    rows = await asyncio.gather(*(run.step(steps) for run in runs))
    wall = time.monotonic() - started
    after, peak = cpu_seconds(), memory.stop()
    total = len(runs) * steps
    print(f"  engine steps a training step: {(await engine_steps() - stepped) / total:.1f}", flush=True)
    used = {k: (v - before.get(k, 0.0)) * 1000 / total for k, v in after.items()}
    kinds = {kind: sum(v for k, v in used.items() if kind in k) for kind in ("kernel", "policy", "trainer")}
    print(f"  CPU ms a step: {', '.join(f'{k} {v:.1f}' for k, v in kinds.items())} (wall {wall * 1000 / total:.1f} "
          "ms a step)", flush=True)
    return total / wall, peak, [statistics.mean(r["reward/mean"] for r in rs[-10:]) for rs in rows]


async def shared_vs_apart(args: argparse.Namespace, workdir: str) -> dict[str, Any]:
    configs = [lora_run(args, workdir, "apart", lr) for lr in LRS]
    apart = await asyncio.gather(*(forge_nb.spawn(cfg, overrides=o, progress=False) for cfg, o in configs))
    try:
        apart_rate, apart_mb, apart_rewards = await train_together(apart, args.shared_steps)
    finally:
        for run in apart:
            await run.shutdown()
    print(f"apart: 4 runs x {args.shared_steps} steps, {apart_rate:.1f} steps/s in all, peak PSS {apart_mb:.0f} MB, "
          f"rewards (last 10) {[round(r, 2) for r in apart_rewards]}", flush=True)
    cfg, overrides = lora_run(args, workdir, "shared", LRS[0])
    runs = [await forge_nb.spawn(cfg, overrides=overrides, progress=False)]
    try:
        for lr in LRS[1:-1]:
            cfg, overrides = lora_run(args, workdir, "shared", lr)
            runs.append(await forge_nb.spawn(cfg, overrides=overrides, base=runs[0], progress=False))
        cfg, overrides = lora_run(args, workdir, "shared", LRS[-1])
        started = time.monotonic()
        runs.append(await forge_nb.spawn(cfg, overrides=overrides, base=runs[0], progress=False))
        await runs[-1].step(1)
        join_s = time.monotonic() - started
        shared_rate, shared_mb, shared_rewards = await train_together(runs, args.shared_steps)
    finally:
        for run in reversed(runs):
            await run.shutdown()
    print(f"shared: 4 runs x {args.shared_steps} steps, {shared_rate:.1f} steps/s in all, peak PSS {shared_mb:.0f} "
          f"MB, rewards (last 10) {[round(r, 2) for r in shared_rewards]}; the last run's join to its first step "
          f"{join_s:.2f} s", flush=True)
    return {"throughput": shared_rate / apart_rate, "memory": shared_mb / apart_mb, "join_s": join_s}


def trainer_passes(args: argparse.Namespace, workdir: str, reps: int = 30) -> dict[str, float]:
    """Median ms of a forward and backward of the quickstart's batch shape: one adapter's 16 rows, four adapters'
    64 rows in one pass (each row its own adapter), one adapter's 64 rows (see the module docstring, part 4)."""
    import torch
    from transformers import AutoModelForCausalLM

    from forge_nb.actors.training import lora
    from forge_nb.config.trainer_sections import LoraConfig

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(build_tiny_model(f"{workdir}/passes"), dtype=torch.float32)
    names = [f"run{i}" for i in range(4)]
    for name in names:
        lora.inject(model, LoraConfig(rank=args.rank, alpha=2 * args.rank), name)
    layers = lora._tuner_layers(model)
    cfg = forge_nb.quickstart()
    rows, width = cfg.batch_size, cfg.max_req_tokens + cfg.max_res_tokens

    def median_ms(runs: int, adapters: list[str]) -> float:
        """``runs`` batches of rows in one pass; with several ``adapters`` each batch's rows go through its own."""
        tokens = torch.randint(0, model.config.vocab_size, (rows * runs, width))
        for layer in layers:
            layer.set_adapter(adapters)  # trainable, as each run's step makes its own
        per_row = [adapters[min(i // rows, len(adapters) - 1)] for i in range(rows * runs)]
        hooks = [layer.register_forward_pre_hook(lambda _m, a, kw: (a, {**kw, "adapter_names": per_row}),
                                                 with_kwargs=True) for layer in layers] if len(adapters) > 1 else []
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            model(input_ids=tokens).logits.float().logsumexp(-1).mean().backward()
            times.append(time.perf_counter() - start)
        for hook in hooks:
            hook.remove()
        return statistics.median(times) * 1000

    return {"one": median_ms(1, names[:1]), "mixed": median_ms(4, names), "one_x4": median_ms(4, names[:1]),
            "rows": rows, "width": width}


async def main(args: argparse.Namespace) -> None:
    lifecycle.ensure_started()
    with tempfile.TemporaryDirectory(prefix="lora-bench-") as workdir:
        if args.only_shared:
            print_shared(await shared_vs_apart(args, workdir))
            return
        if args.only_passes:
            print_passes(trainer_passes(args, workdir))
            return
        q = await quickstart(args, workdir)
        print(f"a push moved {q['pushed_bytes'] / 1e6:.3f} MB (the adapters) of the model's "
              f"{q['whole_bytes'] / 1e6:.3f} MB", flush=True)
        l = await loads(args, workdir)  # noqa: E741
        print(f"generator RSS after {args.warmup} loads {l['first_mb']:.1f} MB, after {args.warmup + args.loads} "
              f"{l['last_mb']:.1f} MB", flush=True)
        print(f"four LoRA runs (rank {args.rank}, lr {', '.join(f'{lr:g}' for lr in LRS)}; the quickstart's recipe, "
              "one generator replica each), apart and on one base", flush=True)
        s = await shared_vs_apart(args, workdir)
        p = trainer_passes(args, workdir)
    print(f"RESULT lora_sync_bytes_ratio {q['pushed_bytes'] / q['whole_bytes']:.3f}")
    print(f"RESULT lora_quickstart_final_reward {q['final']:.3f} (target >= 0.9)")
    print(f"RESULT lora_engine_rss_growth_mb_per_100_loads {l['growth_per_100']:.2f} (target <= 5)")
    print_shared(s)
    print_passes(p)


def print_shared(s: dict[str, Any]) -> None:
    print(f"RESULT lora_shared_base_throughput_ratio {s['throughput']:.2f} (target >= 2.0)")
    print(f"RESULT lora_shared_base_memory_ratio {s['memory']:.2f} (target <= 0.5)")
    print(f"RESULT lora_join_base_to_first_step_s {s['join_s']:.2f} (target <= 2)")


def print_passes(p: dict[str, float]) -> None:
    print(f"trainer passes (one thread, {p['rows']} rows of {p['width']} tokens a run): one run's rows with its "
          f"adapter {p['one']:.1f} ms; four runs' rows in one pass, each with its own adapter (peft's mixed-adapter "
          f"path) {p['mixed']:.1f} ms; four runs' rows with one adapter {p['one_x4']:.1f} ms", flush=True)
    print(f"RESULT lora_mixed_pass_vs_four_passes {p['mixed'] / (4 * p['one']):.2f} (below 1: a shared trainer "
          "could gain by stepping its runs together)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--loads", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--shared-steps", type=int, default=60)
    parser.add_argument("--only-shared", action="store_true", help="part 3 alone")
    parser.add_argument("--only-passes", action="store_true", help="part 4 alone")
    asyncio.run(main(parser.parse_args()))
    forge_nb.end_process(0)
