"""Does the kernel grow with the length of a run? The quickstart trains ``--steps`` steps in one run, in this process
(the kernel's part of a run: its loops, metrics, ledger, episodes, events); the process's RSS (psutil) is sampled
every ``--every`` steps, and the growth is the least-squares slope of RSS over steps after the first ``--warmup``
steps (allocator arenas, caches and the first thousand rows settle there). The run's memory of its rows is printed
beside it (``run.metrics.rows.in_memory``), and the ledger must balance at the end: nothing was lost.

    RESULT kernel_rss_mb_per_1000_steps <slope of the kernel's RSS, MB per 1000 steps> (target <= 0.5)

    .venv/bin/python bench/kernel_memory.py [--steps 10000] [--every 500] [--warmup 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import psutil  # noqa: E402

import forge_nb  # noqa: E402


def slope(xs: list[float], ys: list[float]) -> float:
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)


async def main(args: argparse.Namespace) -> None:
    me = psutil.Process()
    with tempfile.TemporaryDirectory(prefix="kernel-memory-") as workdir:
        run = await forge_nb.spawn(forge_nb.quickstart(name="kernel-memory", run_dir=f"{workdir}/run"),
                                   progress=False)
        cfg = run.config
        print(f"the quickstart as it is (group_size {cfg.group_size}, batch_size {cfg.batch_size}, "
              f"{cfg.generator.num_replicas} generator replica(s)), {args.steps} steps in one run")
        samples: list[tuple[int, float]] = []
        t0 = time.perf_counter()
        try:
            done = 0
            while done < args.steps:
                await run.step(args.every)
                done += args.every
                gc.collect()
                rss = me.memory_info().rss / 2**20
                samples.append((done, rss))
                print(f"  step {done:6d}: kernel RSS {rss:7.1f} MB, rows in memory {run.metrics.rows.in_memory}, "
                      f"{done / (time.perf_counter() - t0):.1f} steps/s", flush=True)
            ledger = run.ledger()
        finally:
            await run.shutdown()
    after = [(s, r) for s, r in samples if s > args.warmup]
    growth = slope([s for s, _ in after], [r for _, r in after]) * 1000
    print(f"ledger balanced: {ledger['balanced']}; RSS {samples[0][1]:.1f} MB at step {samples[0][0]}, "
          f"{samples[-1][1]:.1f} MB at step {samples[-1][0]}")
    print(f"RESULT kernel_rss_mb_per_1000_steps {growth:.3f} (target <= 0.5)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--every", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=2000)
    asyncio.run(main(parser.parse_args()))
