"""The CPU quickstart's learning curve: does mean reward reach 0.8 within 10 minutes on 2 cores?

Spawns the quickstart (tiny Qwen3, toy task, 2 vLLM CPU generator replicas), trains in the background,
prints the curve every 15 s and stops at the first of: the mean reward of the last 10 steps >= the
target, or the time budget (default 10 minutes, counted from the first training step). Ends with
``RESULT quickstart_final_reward <mean of the last 10 steps> (target 0.8)``: the mean when it first reached
the target, or the last one when the time ran out.

    .venv/bin/python bench/learning_curve.py [--minutes 10] [--target 0.8]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import forge_nb  # noqa: E402


def last_mean(run, n: int = 10) -> float:
    values = run.metrics.series("reward/mean")[1][-n:]
    return sum(values) / len(values) if values else 0.0


async def main(minutes: float, target: float) -> None:
    t0 = time.time()
    run = await forge_nb.spawn(forge_nb.quickstart(run_dir=f"runs/learning-curve-{int(t0)}"), progress=False)
    print(f"spawned in {time.time() - t0:.0f} s", flush=True)
    run.start()
    while run.current_step == 0:
        await asyncio.sleep(0.5)
    start = time.time()
    next_print = 0.0
    try:
        while time.time() - start < minutes * 60 and last_mean(run) < target and run.state == "running":
            await asyncio.sleep(1)
            if time.time() - start >= next_print:
                print(f"{time.time() - start:6.0f} s  step {run.current_step:4d}  reward(last 10) {last_mean(run):.3f}",
                      flush=True)
                next_print += 15
        reached = (run.current_step, time.time() - start, last_mean(run))
    finally:
        await run.stop()
    elapsed = time.time() - start
    final = last_mean(run)
    print(f"final: step {run.current_step}, {elapsed:.0f} s of training, {run.current_step / elapsed:.2f} steps/s; "
          f"reward(last 10) {final:.3f} after the step that was in flight at the stop")
    if reached[2] >= target:
        print(f"reached: reward(last 10) {reached[2]:.3f} >= {target} at step {reached[0]}, {reached[1]:.0f} s "
              "after the first step")
        final = reached[2]
    if run.error:
        print("run error:", run.error)
    await run.shutdown()
    print(f"RESULT quickstart_final_reward {final:.3f} (target {target})")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--target", type=float, default=0.8)
    args = ap.parse_args()
    asyncio.run(main(args.minutes, args.target))
