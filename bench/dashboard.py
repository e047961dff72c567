"""Dashboard cost: latency from a metric being recorded to the widget holding it, and training throughput
with the dashboard on and off, in one run.

The measurement runs inside a real IPython kernel (started here through jupyter_client, its output and
that of the monarch/vLLM processes sent to a log file), so widget updates pay for their comm messages
as in a notebook; no browser is attached. It spawns the CPU quickstart run, warms up, then alternates
blocks of ``run.step(N)`` with no dashboard and with a displayed ``Dashboard(run)``, so that noise on
this shared machine hits both alike. Reported:

- latency p50/p95: per drawn row, from ``MetricsStore.record`` (the row's time) to the end of the
  ``fig.batch_update()`` that put it in the FigureWidget (``Dashboard.curves.lags_ms``);
- throughput: median time per training step (row to row, pooled over the blocks of each mode) with the
  dashboard on and off, and the slowdown (``RESULT dashboard_slowdown_pct``); block rates are printed too;
- the dashboard's own time on the kernel thread (figure flushes + health/status polls), in ms per s:
  a steadier measure of its cost than the throughput difference on a noisy machine.

    .venv/bin/python bench/dashboard.py [--rounds R] [--steps N] [--synthetic] [--log PATH]

``--synthetic`` replaces the quickstart with a loop recording realistic rows (the quickstart's ~40
metrics) every ``--step-s`` seconds: minutes faster, no model, same dashboard path.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

ROW_KEYS = ("loss", "loss/policy", "clip/frac_low", "clip/frac_high", "ratio/mean", "ratio/max", "entropy",
            "loss/total", "grad_norm", "tokens", "lr", "skipped", "time_s", "time/push_s", "time/update_s",
            "weight_sync_s", "reward/mean", "reward/std", "reward/min", "reward/max", "reward/PatternReward",
            "response_len/mean", "response_len/max", "policy_age/mean", "policy_age/max", "time/wait_batch_s",
            "time/train_s", "time/step_s", "version", "buffer/size", "tokens_per_s/train",
            "tokens_per_s/generate", "buffer/added", "buffer/sampled", "buffer/evicted_stale")


class SyntheticRun:
    """The Run's surface over a loop that records a quickstart-like row every ``step_s`` seconds."""

    def __init__(self, step_s: float):
        from forge_nb.metrics import MetricsStore

        self.name, self.state, self.error = "synthetic", "ready", None
        self.current_step = self.version = 0
        self.metrics, self.services, self.hparams = MetricsStore(), {}, {"lr": 3e-3, "temperature": 1.0}
        self.step_s = step_s

    async def step(self, n: int = 1) -> None:
        self.state = "running"
        for _ in range(n):
            await asyncio.sleep(self.step_s)
            self.current_step += 1
            self.version += 1
            s = self.current_step
            self.metrics.record(s, {k: (s % 17) / 17 + i for i, k in enumerate(ROW_KEYS)})
        self.state = "paused"

    def episodes(self, n: int = 50, **_: Any) -> list[dict[str, Any]]:
        return []

    def start(self) -> None: ...

    def pause(self) -> None: ...

    async def shutdown(self) -> None: ...


def _timed(fn: Any, acc: list[float]) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            acc[0] += time.perf_counter() - t

    return wrapper


async def measure(rounds: int, steps: int, synthetic: bool, step_s: float) -> dict[str, Any]:
    """Runs in the kernel: the blocks, returning the raw figures."""
    from IPython.display import display

    import forge_nb
    from forge_nb.widgets import Dashboard

    t0 = time.monotonic()
    if synthetic:
        run: Any = SyntheticRun(step_s)
    else:
        run = await forge_nb.spawn(forge_nb.quickstart(run_dir=tempfile.mkdtemp(prefix="bench-dash-")),
                                   progress=False)
    spawn_s = time.monotonic() - t0
    await run.step(5)  # warm-up: engines compiled, weight sync and the replay buffer in steady state
    rates: dict[str, list[float]] = {"off": [], "on": []}
    intervals: dict[str, list[float]] = {"off": [], "on": []}  # seconds from one step's row to the next
    lags: list[float] = []
    busy, on_wall = [0.0], 0.0
    try:
        for _ in range(rounds):
            for mode in ("off", "on"):
                d = None
                if mode == "on":
                    d = Dashboard(run)
                    d.curves.throttle._flush_fn = _timed(d.curves.throttle._flush_fn, busy)  # bench-only probes
                    d.health.throttle._flush_fn = _timed(d.health.throttle._flush_fn, busy)
                    d.tick = _timed(d.tick, busy)  # type: ignore[method-assign]
                    display(d)
                    await asyncio.sleep(0.3)
                t, first, started = time.perf_counter(), len(run.metrics.rows), time.time()
                await run.step(steps)
                wall = time.perf_counter() - t
                rates[mode].append(steps / wall)
                stamps = [started] + [row["time"] for row in run.metrics.rows[first:]]
                intervals[mode] += [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
                if d is not None:
                    await asyncio.sleep(0.3)  # the last rows drawn
                    on_wall += wall + 0.3
                    lags += list(d.curves.lags_ms)
                    errors = list(d.errors.messages)
                    d.close()
                    if errors:
                        raise RuntimeError(f"dashboard errors during the benchmark: {errors}")
    finally:
        await run.shutdown()
    return {"rates": rates, "intervals": intervals, "lags": lags, "busy_s": busy[0], "on_wall_s": on_wall,
            "spawn_s": spawn_s, "synthetic": synthetic}


def run_in_kernel(args: argparse.Namespace) -> dict[str, Any]:
    from jupyter_client import KernelManager

    log = open(args.log, "w")  # noqa: SIM115 - the kernel and its children write here until shutdown
    km = KernelManager(kernel_name="python3")
    km.kernel_spec.argv[0] = sys.executable  # this interpreter (the project's venv)
    km.start_kernel(cwd=ROOT, stdout=log, stderr=log)
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=120)
        code = (f"import sys, json; sys.path.insert(0, {ROOT!r})\nimport bench.dashboard as b\n"
                f"r = await b.measure({args.rounds}, {args.steps}, {args.synthetic}, {args.step_s})\n"
                "print('BENCH-JSON ' + json.dumps(r))")
        msg_id = kc.execute(code)
        deadline = time.monotonic() + args.timeout
        result = None
        while time.monotonic() < deadline:
            try:
                msg = kc.get_iopub_msg(timeout=5)
            except Exception:
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                for line in content["text"].splitlines():
                    if line.startswith("BENCH-JSON "):
                        result = json.loads(line[len("BENCH-JSON "):])
            elif kind == "error":
                raise RuntimeError(f"the benchmark failed in the kernel: {content['ename']}: {content['evalue']}"
                                   f" (log: {args.log})")
            elif kind == "status" and content["execution_state"] == "idle":
                break
        if result is None:
            raise RuntimeError(f"no result from the kernel within {args.timeout}s (log: {args.log})")
        return result
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)
        log.close()


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=8, help="off/on block pairs")
    ap.add_argument("--steps", type=int, default=8, help="training steps per block")
    ap.add_argument("--synthetic", action="store_true", help="a recording loop instead of the quickstart")
    ap.add_argument("--step-s", type=float, default=0.25, help="seconds per synthetic step")
    ap.add_argument("--timeout", type=float, default=3000)
    ap.add_argument("--log", default=os.path.join(tempfile.gettempdir(), "bench-dashboard-kernel.log"))
    args = ap.parse_args()
    r = run_in_kernel(args)
    off, on = statistics.median(r["rates"]["off"]), statistics.median(r["rates"]["on"])
    # each "on" block against the "off" block just before it: load on this shared machine drifts
    paired = statistics.median(1 - b / a for a, b in zip(r["rates"]["off"], r["rates"]["on"], strict=True))
    what = "synthetic recording loop" if r["synthetic"] else "CPU quickstart run"
    print(f"workload: {what}, {args.rounds} x {args.steps} steps per mode (spawn {r['spawn_s']:.0f} s)")
    print("steps/s off: " + " ".join(f"{x:.3f}" for x in r["rates"]["off"]))
    print("steps/s on:  " + " ".join(f"{x:.3f}" for x in r["rates"]["on"]))
    print(f"latency record -> widget over {len(r['lags'])} rows: p50 {pct(r['lags'], 0.5):.1f} ms, "
          f"p95 {pct(r['lags'], 0.95):.1f} ms, max {max(r['lags'], default=float('nan')):.1f} ms")
    busy = 1000 * r["busy_s"] / max(r["on_wall_s"], 1e-9)
    print(f"dashboard time on the kernel thread: {busy:.1f} ms per s ({busy / 10:.2f}%)")
    print(f"throughput by blocks: {100 * paired:.2f}% slower with the dashboard (median of paired blocks; "
          f"medians {on:.3f} on vs {off:.3f} off steps/s, {100 * (1 - on / off):.2f}%)")
    # Block rates swing with how full the replay buffer happens to be when a block starts; the time from
    # one step's row to the next, pooled over every block of a mode, has many more samples.
    step_on, step_off = (statistics.median(r["intervals"][m]) for m in ("on", "off"))
    slowdown = 100 * (step_on / step_off - 1)
    print(f"median time per step: {1000 * step_on:.0f} ms on vs {1000 * step_off:.0f} ms off "
          f"({len(r['intervals']['on'])} and {len(r['intervals']['off'])} steps): {slowdown:.2f}% slower")
    print(f"RESULT dashboard_slowdown_pct {slowdown:.2f} (target 2)")
    print(f"RESULT dashboard_p95_latency_ms {pct(r['lags'], 0.95):.1f} (target 250)")


if __name__ == "__main__":
    main()
