"""LoRA on the quickstart: what a version moves, what the run learns, and whether a generator's memory grows as it
loads adapter after adapter.

1. **The quickstart with ``trainer.lora``** (rank ``--rank``, alpha twice that, lr ``--lr``; otherwise the recipe as
   it is: one vLLM CPU generator, groups of 4, batches of 16) trains ``--steps`` steps. Each row's
   ``weights/pushed_mb`` is what its push moved; the model's own bytes are its checkpoint's.
2. **Loads**: a LoRA Generator and a LoRA RLTrainer on the tiny model, as the run spawns them (actors on meshes of
   their own, one namespace): the trainer pushes a version and the generator loads it, ``--loads`` times after
   ``--warmup`` loads, each older version dropped from the store as a run drops it; the generator process's RSS
   (psutil) before and after, as vLLM's repeated LoRA loads were reported to leak host memory (TRL's tracker).

    RESULT lora_sync_bytes_ratio <adapter bytes a push moves / the model's bytes>
    RESULT lora_quickstart_final_reward <mean reward of the last 25 steps> (target >= 0.9)
    RESULT lora_engine_rss_growth_mb_per_100_loads <RSS growth of the generator's process per 100 loads> (target <= 5)
    RESULT lora_shared_base_throughput_ratio, lora_shared_base_memory_ratio, lora_join_base_to_first_step_s: none
      (several runs on one base are not built yet)

    .venv/bin/python bench/lora.py [--steps 300] [--loads 200] [--rank 8] [--lr 2e-3]
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
from forge_nb.system import runtime  # noqa: E402


def model_bytes(path: str) -> int:
    return sum(t.numel() * t.element_size() for t in load_file(f"{path}/model.safetensors").values())


async def quickstart(args: argparse.Namespace, workdir: str) -> dict[str, Any]:
    lora = {"rank": args.rank, "alpha": 2 * args.rank}
    cfg = forge_nb.quickstart(name="lora-bench", run_dir=f"{workdir}/run")
    run = await forge_nb.spawn(cfg, overrides={"trainer.lora": lora, "trainer.lr": args.lr}, progress=False)
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
    gen_mesh = await runtime.spawn_mesh("lora-bench-gen", 1)
    trainer_mesh = await runtime.spawn_mesh("lora-bench-train", 1)
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


async def main(args: argparse.Namespace) -> None:
    runtime.ensure_started()
    with tempfile.TemporaryDirectory(prefix="lora-bench-") as workdir:
        q = await quickstart(args, workdir)
        print(f"a push moved {q['pushed_bytes'] / 1e6:.3f} MB (the adapters) of the model's "
              f"{q['whole_bytes'] / 1e6:.3f} MB", flush=True)
        l = await loads(args, workdir)  # noqa: E741
        print(f"generator RSS after {args.warmup} loads {l['first_mb']:.1f} MB, after {args.warmup + args.loads} "
              f"{l['last_mb']:.1f} MB", flush=True)
    print(f"RESULT lora_sync_bytes_ratio {q['pushed_bytes'] / q['whole_bytes']:.3f}")
    print(f"RESULT lora_quickstart_final_reward {q['final']:.3f} (target >= 0.9)")
    print(f"RESULT lora_engine_rss_growth_mb_per_100_loads {l['growth_per_100']:.2f} (target <= 5)")
    for name in ("lora_shared_base_throughput_ratio", "lora_shared_base_memory_ratio",
                 "lora_join_base_to_first_step_s"):
        print(f"RESULT {name} none (several runs on one base are not built yet)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--loads", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--lr", type=float, default=2e-3)
    asyncio.run(main(parser.parse_args()))
    forge_nb.end_process(0)
