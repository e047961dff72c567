"""Sandbox cost: executions per second of the bubblewrap sandbox against the old rlimit-only path, in one run.

Both run the same small programs through ``forge_nb.actors._sandbox.run_sandboxed`` in this process
(the coder actor adds one monarch call, the same for both). Blocks of the two paths alternate so that
noise on this shared machine hits both alike. Reported: executions/s one at a time and with
``--width`` in flight, per path, and the ratio bwrap / rlimit-only of the sequential rates.

    .venv/bin/python bench/sandbox.py [--execs N] [--rounds R] [--width W]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from forge_nb.actors._sandbox import run_sandboxed  # noqa: E402

PROGRAMS = (
    "print(sum(i * i for i in range(1000)))",  # what a reward check usually runs: tiny
    "import json, re; print(json.dumps({'ok': bool(re.match('a+', 'aaa'))}))",
)


async def rate(isolation: str, n: int, width: int) -> float:
    """Executions per second with ``width`` in flight; each must succeed."""
    sem = asyncio.Semaphore(width)

    async def one(i: int) -> None:
        async with sem:
            result = await run_sandboxed(PROGRAMS[i % len(PROGRAMS)], isolation=isolation, timeout_s=30)
            if result.exit_code != 0:
                raise RuntimeError(f"{isolation}: {result}")

    t = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    return n / (time.perf_counter() - t)


async def main(execs: int, rounds: int, width: int) -> None:
    for isolation in ("none", "bwrap"):  # warm the page cache for both
        await rate(isolation, 3, 1)
    seq: dict[str, list[float]] = {"none": [], "bwrap": []}
    par: dict[str, list[float]] = {"none": [], "bwrap": []}
    for r in range(rounds):
        order = ("none", "bwrap") if r % 2 == 0 else ("bwrap", "none")
        for isolation in order:
            seq[isolation].append(await rate(isolation, execs, 1))
            par[isolation].append(await rate(isolation, execs, width))
    for isolation, label in (("none", "rlimit-only"), ("bwrap", "bwrap")):
        print(f"{label:12s} sequential {statistics.median(seq[isolation]):7.1f} exec/s   "
              f"{width} in flight {statistics.median(par[isolation]):7.1f} exec/s")
    ratio = statistics.median(b / n for b, n in zip(seq["bwrap"], seq["none"], strict=True))
    print(f"RESULT sandbox_exec_per_s_bwrap {statistics.median(seq['bwrap']):.1f}")
    print(f"RESULT sandbox_exec_per_s_rlimit_only {statistics.median(seq['none']):.1f}")
    print(f"RESULT sandbox_exec_per_s_ratio {ratio:.3f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--execs", type=int, default=40, help="executions per block")
    parser.add_argument("--rounds", type=int, default=3, help="alternating blocks per path")
    parser.add_argument("--width", type=int, default=4, help="executions in flight in the concurrent blocks")
    args = parser.parse_args()
    asyncio.run(main(args.execs, args.rounds, args.width))
