"""Service overhead: a 1 KB ``route()`` round trip against raw monarch ``call_one``, in one run.

Both sides talk to the same kind of mesh (one proc on this host, an async echo endpoint). Blocks of
raw and routed calls alternate so that noise on this shared machine hits both alike. Reported: p50
and p95 latency with one call in flight, and calls/s with 1 and 100 in flight.

    .venv/bin/python bench/service_overhead.py [--calls N] [--rounds R]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from forge_nb.system.runtime import lifecycle, spawning  # noqa: E402

PAYLOAD = os.urandom(1024)


async def sequential(call, n: int) -> list[float]:
    lat = []
    for _ in range(n):
        t = time.perf_counter()
        await call(PAYLOAD)
        lat.append(time.perf_counter() - t)
    return lat


async def concurrent(call, n: int, width: int) -> float:
    """calls/s with ``width`` requests in flight."""
    sem = asyncio.Semaphore(width)

    async def one() -> None:
        async with sem:
            await call(PAYLOAD)

    t = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(n)))
    return n / (time.perf_counter() - t)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def main(calls: int, rounds: int) -> None:
    lifecycle.ensure_started()
    from bench._echo import Echo, RawEcho

    mesh = await spawning.spawn_mesh("bench-raw")
    raw_actor = mesh.spawn("echo", RawEcho)
    svc = await Echo.options(num_replicas=1).as_service()

    def raw(p):
        return raw_actor.echo.call_one(p)

    def routed(p):
        return svc.echo.route(p)

    for call in (raw, routed):  # warm-up
        await sequential(call, 200)
    lat = {"raw": [], "route": []}
    tput = {("raw", 1): [], ("route", 1): [], ("raw", 100): [], ("route", 100): []}
    for _ in range(rounds):
        for name, call in (("raw", raw), ("route", routed)):
            lat[name] += await sequential(call, calls)
            for width in (1, 100):
                tput[(name, width)].append(await concurrent(call, calls, width))
    await svc.shutdown()
    await mesh.stop()

    p50 = {k: pct(v, 0.5) * 1e3 for k, v in lat.items()}
    p95 = {k: pct(v, 0.95) * 1e3 for k, v in lat.items()}
    cps = {k: statistics.median(v) for k, v in tput.items()}
    print(f"{'':18}{'raw call_one':>14}{'route()':>12}{'ratio':>8}")
    print(f"{'p50 latency (ms)':18}{p50['raw']:14.3f}{p50['route']:12.3f}{p50['route'] / p50['raw']:8.3f}")
    print(f"{'p95 latency (ms)':18}{p95['raw']:14.3f}{p95['route']:12.3f}{p95['route'] / p95['raw']:8.3f}")
    for w in (1, 100):
        r, s = cps[("raw", w)], cps[("route", w)]
        print(f"{f'calls/s, {w} in flight':18}{r:14.0f}{s:12.0f}{s / r:8.3f}")
    t1 = cps[("route", 1)] / cps[("raw", 1)]
    t100 = cps[("route", 100)] / cps[("raw", 100)]
    print(f"throughput ratio (worst of 1 and 100 in flight): {min(t1, t100):.3f} (target 0.90)")
    print(f"RESULT service_route_p50_ratio {p50['route'] / p50['raw']:.3f} (target 1.10)")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    asyncio.run(main(args.calls, args.rounds))
