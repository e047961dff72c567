"""The quickstart's generator/trainer mismatch as it runs, and dynamic sampling against plain batches.

Two quickstart runs per seed, one after the other on the same machine, with the same seed: "plain" (the recipe as it
is) and "dynamic" (``rollout.dynamic_sampling=True``: groups whose rewards are all equal are dropped and the batch
refilled). Both evaluate on the toy task's 16 held-out prompts every ``--eval-every`` steps (``loop.eval_every``
with ``eval_k=4``: four sampled answers per prompt, pinned to the version just trained); "time to 0.8" is the seconds
from the first step to the first evaluation whose avg@4 is >= 0.8 (the toy task saturates: its easy prompts end up
answered right by every sample, and those groups train nothing). The trained batches' own reward is no measure here:
dynamic sampling keeps only groups with a spread, whose mean stays below a saturated batch's; and a greedy evaluation
reaches 0.8 within the first ten steps, too soon to tell the two apart.

    RESULT mismatch_kl_quickstart <mean mismatch/kl of the plain run's steps> (target recorded)
    RESULT mismatch_kl_same_version_quickstart <the same over episodes of the version being trained>
    RESULT time_to_0.8_dynamic_vs_plain <dynamic's seconds / plain's, the median over seeds> (target <= 1.0)
    RESULT steps_to_0.8_dynamic_vs_plain <the same in steps (a multiple of --eval-every)>

    .venv/bin/python bench/mismatch.py [--seeds 0 1 2] [--max-steps 300] [--eval-every 5]
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

import forge_nb  # noqa: E402
from forge_nb.config import LoopConfig, RolloutConfig  # noqa: E402


async def one_run(seed: int, dynamic: bool, args: argparse.Namespace) -> dict[str, Any]:
    """Train until an evaluation reaches 0.8 (or ``--max-steps``); the seconds it took and the run's measures."""
    with tempfile.TemporaryDirectory(prefix="forge_nb-mismatch-") as folder:
        cfg = forge_nb.quickstart(run_dir=folder, seed=seed, rollout=RolloutConfig(dynamic_sampling=dynamic),
                                  loop=LoopConfig(mode="async", rollout_loops=8, sync_interval=2,
                                                  eval_every=args.eval_every, eval_prompts=16, eval_k=4))
        run = await forge_nb.spawn(cfg, progress=False)
        try:
            start, reached = time.perf_counter(), None
            while run.current_step < args.max_steps and reached is None:
                await run.step(args.eval_every)
                evals = run.metrics.events_frame("eval")
                if len(evals) and evals["eval/avg@4"].iloc[-1] >= 0.8:
                    reached = time.perf_counter() - start
            rows = run.metrics.rows
            ledger = run.ledger()
            return {
                "seconds": reached, "steps": run.current_step,
                "kl": statistics.fmean(r["mismatch/kl"] for r in rows if "mismatch/kl" in r),
                "kl_same": statistics.fmean([r["mismatch/kl_same_version"] for r in rows
                                             if "mismatch/kl_same_version" in r] or [float("nan")]),
                "p99": statistics.fmean(r["mismatch/ratio_p99"] for r in rows if "mismatch/ratio_p99" in r),
                "zero_std": statistics.fmean(r.get("frac_reward_zero_std", 0.0) for r in rows),
                "dropped": ledger["zero_variance"], "balanced": ledger["balanced"],
                "generated": sum(r.get("groups/generated", 0) for r in rows),
            }
        finally:
            await run.shutdown()


async def main(args: argparse.Namespace) -> None:
    results: dict[tuple[int, bool], dict[str, Any]] = {}
    for seed in args.seeds:
        for dynamic in (False, True):
            out = results[seed, dynamic] = await one_run(seed, dynamic, args)
            name = "dynamic" if dynamic else "plain"
            print(f"seed {seed} {name:7s}: 0.8 after {out['seconds'] or float('nan'):6.1f} s, {out['steps']} steps; "
                  f"mismatch/kl {out['kl']:.2e} (same version {out['kl_same']:.2e}), ratio p99 {out['p99']:.3f}; "
                  f"frac_reward_zero_std {out['zero_std']:.2f}; {out['dropped']} episodes dropped, ledger balanced "
                  f"{out['balanced']}", flush=True)
    plain = [results[s, False] for s in args.seeds]
    ratios = [results[s, True]["seconds"] / results[s, False]["seconds"] for s in args.seeds
              if results[s, True]["seconds"] and results[s, False]["seconds"]]
    print(f"RESULT mismatch_kl_quickstart {statistics.fmean(p['kl'] for p in plain):.3e} (target recorded)")
    print(f"RESULT mismatch_kl_same_version_quickstart {statistics.fmean(p['kl_same'] for p in plain):.3e}")
    shown = f"{statistics.median(ratios):.3f}" if ratios else "none"
    print(f"RESULT time_to_0.8_dynamic_vs_plain {shown} (target 1.0; per seed {[round(r, 3) for r in ratios]})")
    steps = [results[s, True]["steps"] / results[s, False]["steps"] for s in args.seeds
             if results[s, True]["seconds"] and results[s, False]["seconds"]]
    shown = f"{statistics.median(steps):.3f}" if steps else "none"
    print(f"RESULT steps_to_0.8_dynamic_vs_plain {shown} (per seed {[round(r, 3) for r in steps]})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--max-steps", type=int, default=300)
    parser.add_argument("--eval-every", type=int, default=5)
    asyncio.run(main(parser.parse_args()))
