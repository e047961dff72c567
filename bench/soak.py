"""Soak: the quickstart for 30 minutes with a generator replica killed every minute (not run in CI).

Prints the ledger every minute and ends with ``RESULT soak_lost_records <n> (target 0)``, where n is
how far the ledger is from balancing: accepted episodes that ended in no terminal record (trained,
buffered, or dropped with a reason); the exit status is 1 when n > 0. Also checks the killed replica
always came back current.

    .venv/bin/python bench/soak.py [--minutes 30] [--kill-every 60] [--seed 0]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import forge_nb  # noqa: E402


def lost(ledger: dict) -> int:
    ends = sum(v for k, v in ledger.items() if k not in ("accepted", "sampled", "balanced"))
    return ledger["accepted"] - ends


async def main(minutes: float, kill_every: float, seed: int) -> int:
    rng = random.Random(seed)
    run = await forge_nb.spawn(forge_nb.quickstart(name="soak"), progress=False)
    run.start()
    start, kills, stale_comebacks = time.time(), 0, 0
    try:
        while time.time() - start < minutes * 60:
            await asyncio.sleep(kill_every * rng.uniform(0.5, 1.5))
            victim = run.policy.replicas[rng.randrange(len(run.policy.replicas))]
            if victim.state == "healthy":
                os.kill(victim.mesh.pids[0], signal.SIGKILL)
                kills += 1
                while victim.state != "healthy":
                    await asyncio.sleep(0.5)
                if victim.version != run.version:
                    stale_comebacks += 1
            ledger = run.ledger()
            print(f"{(time.time() - start) / 60:5.1f} min  step {run.current_step:5d}  kills {kills:3d}  "
                  f"health {run.health:8}  lost {lost(ledger)}  {ledger}", flush=True)
            if run.state == "failed":
                print("run failed:", run.error)
                break
    finally:
        await run.stop()
    ledger = run.ledger()
    print(f"{kills} kills, {stale_comebacks} replicas came back behind the current version, final ledger {ledger}")
    await run.shutdown()
    print(f"RESULT soak_lost_records {lost(ledger)} (target 0)")
    return lost(ledger)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--kill-every", type=float, default=60)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    missing = asyncio.run(main(args.minutes, args.kill_every, args.seed))
    # end_process: after killed replicas, monarch's exit-time teardown may exit(1) on its own
    forge_nb.end_process(0 if missing == 0 else 1)
