"""Dashboard cost: latency from a metric being recorded to the widget holding it, and training throughput
with the dashboard on and off, in one run.

The measurement runs inside a real IPython kernel (started here through jupyter_client, its output and
that of the monarch/vLLM processes sent to a log file), so widget updates pay for their comm messages
as in a notebook; no browser is attached. It spawns the CPU quickstart run, warms up, starts it, and
lets it train without a pause while the dashboard is switched on and off in windows of equal length,
in the order off, on, on, off, on, off, off, on, ... (each pair of pairs mirrored, so a drift in training
speed as the policy learns hits both modes alike). The first ``--settle-s`` of a window (building or
closing a dashboard) is not counted. Earlier versions ran ``run.step(N)`` blocks from a paused run; the
buffer state each block started from swung its rate 1-7 steps/s, which hid a few percent either way.
Reported:

- latency p50/p95: per drawn row, from ``MetricsStore.record`` (the row's time) to the end of the
  flush that sent it to the curves widget (``Dashboard.curves.lags_ms``);
- throughput: training steps per second in the "on" windows against the "off" windows. Each window's
  rate runs from its first step to its last (a count of whole steps over the window rounds by one
  step in 40-80, 1.25-2.5%). Each "on" window is paired with the "off" window beside it, and the
  slowdown is the median of the pairs (``RESULT dashboard_slowdown_pct``) with a distribution-free
  95% interval from the pairs' order statistics (``RESULT dashboard_slowdown_upper95_pct`` is its
  upper end). The median, because the shared VM stalls now and then: a window that falls from 4.0
  to 2.9 steps/s in either mode moves a mean of 30 pairs by 1%, and the median not at all. The
  pooled rate (all steps over all time of each mode) is printed beside it;
- where the time goes: the dashboard's own time on the kernel thread (figure flushes + health/status
  polls), the kernel process's garbage-collection pauses, and the machine's busy CPU seconds per step
  (from /proc/stat, every process: the run's, the kernel's IOPub thread, this client decoding messages),
  and of those the kernel process's and this client's own CPU (from /proc/<pid>/stat).

    .venv/bin/python bench/dashboard.py [--pairs P] [--window-s S] [--synthetic [--cpu-work]] [--log PATH]
                                        [--raw PATH]

``--synthetic`` replaces the quickstart with a loop recording realistic rows (the quickstart's ~40
metrics) every ``--step-s`` seconds: minutes faster, no model, same dashboard path.

``--synthetic --cpu-work`` makes each synthetic step a fixed amount of CPU work instead of a sleep: one
worker process per core runs a calibrated loop (``--step-s`` of work on an idle machine) and the kernel
awaits them all, as the Run awaits its actors. The machine is saturated as in the quickstart, but
every step is the same work, so most windows agree within 1-3% where the quickstart's spread 2-5
steps/s. A step ends when the last worker does, so CPU the dashboard takes from either core delays
the whole step, as in a training step that waits for every rank. What it measures is the same as
with the quickstart: CPU the dashboard takes from the work, and the delay its time on the kernel
thread adds between steps.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
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

    def __init__(self, step_s: float, cpu_work: bool = False):
        from forge_nb.metrics import MetricsStore

        self.name, self.state, self.error = "synthetic", "ready", None
        self.current_step = self.version = 0
        self.metrics, self.services, self.hparams = MetricsStore(), {}, {"lr": 3e-3, "temperature": 1.0}
        self.step_s = step_s
        self._task: asyncio.Task[None] | None = None
        self._pool: Any = None
        self._iterations = 0
        if cpu_work:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            self._workers = os.cpu_count() or 1
            self._pool = ProcessPoolExecutor(self._workers, mp_context=multiprocessing.get_context("spawn"))
            self._pool.submit(burn, 1).result()  # started before timing anything
            probe = 2_000_000
            self._iterations = int(probe * step_s / self._pool.submit(burn, probe).result())

    async def _one_step(self) -> None:
        if self._pool is None:
            await asyncio.sleep(self.step_s)
        else:
            loop = asyncio.get_running_loop()
            await asyncio.gather(*(loop.run_in_executor(self._pool, burn, self._iterations)
                                   for _ in range(self._workers)))
        self.current_step += 1
        self.version += 1
        s = self.current_step
        self.metrics.record(s, {k: (s % 17) / 17 + i for i, k in enumerate(ROW_KEYS)})

    async def step(self, n: int = 1) -> None:
        for _ in range(n):
            await self._one_step()
        self.state = "paused"

    def start(self) -> None:
        async def forever() -> None:
            while True:
                await self._one_step()

        self.state = "running"
        self._task = asyncio.get_running_loop().create_task(forever())

    def pause(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self.state = "paused"

    async def stop(self) -> None:
        self.pause()

    def episodes(self, n: int = 50, **_: Any) -> list[dict[str, Any]]:
        return []

    async def shutdown(self) -> None:
        self.pause()
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)


def burn(iterations: int) -> float:
    """A fixed amount of CPU work (a worker's share of one synthetic step); returns the seconds it took."""
    t = time.perf_counter()
    x = 0
    for i in range(iterations):
        x ^= i * i
    return time.perf_counter() - t


def _timed(fn: Any, acc: list[float]) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            acc[0] += time.perf_counter() - t

    return wrapper


def schedule(pairs: int) -> list[str]:
    """off, on, on, off, on, off, off, on, ...: ``pairs`` windows of each mode, every four mirrored."""
    quad = [("off", "on", "on", "off"), ("on", "off", "off", "on")]
    return [mode for i in range(pairs) for mode in quad[(i // 2) % 2][2 * (i % 2):2 * (i % 2) + 2]]


def busy_cpu_s() -> float:
    """CPU seconds the whole machine has spent busy (every core, every process) since boot."""
    import psutil

    times = psutil.cpu_times()
    return sum(times) - times.idle - getattr(times, "iowait", 0.0) - getattr(times, "guest", 0.0) \
        - getattr(times, "guest_nice", 0.0)


def proc_cpu_s(pid: int) -> float:
    """CPU seconds (user + system, every thread) process ``pid`` has used."""
    import psutil

    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


async def measure(pairs: int, window_s: float, settle_s: float, synthetic: bool, step_s: float,
                  client_pid: int, cpu_work: bool = False) -> dict[str, Any]:
    """Runs in the kernel: the windows, returning the raw figures."""
    import gc

    from IPython.display import display

    import forge_nb
    from forge_nb.widgets import Dashboard

    t0 = time.monotonic()
    if synthetic:
        run: Any = SyntheticRun(step_s, cpu_work)
    else:
        run = await forge_nb.spawn(forge_nb.quickstart(run_dir=tempfile.mkdtemp(prefix="bench-dash-")),
                                   progress=False)
    spawn_s = time.monotonic() - t0
    await run.step(5)  # warm-up: engines compiled, weight sync and the replay buffer in steady state
    gc_s, gc_started = [0.0], [0.0]

    def gc_clock(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            gc_started[0] = time.perf_counter()
        else:
            gc_s[0] += time.perf_counter() - gc_started[0]

    gc.callbacks.append(gc_clock)
    windows: list[dict[str, Any]] = []
    lags: list[float] = []
    busy = [0.0]
    run.start()
    try:
        for mode in schedule(pairs):
            d = None
            if mode == "on":
                d = Dashboard(run)
                d.curves.throttle._flush_fn = _timed(d.curves.throttle._flush_fn, busy)  # bench-only probes
                d.health.throttle._flush_fn = _timed(d.health.throttle._flush_fn, busy)
                d.tick = _timed(d.tick, busy)  # type: ignore[method-assign]
                display(d)
            await asyncio.sleep(settle_s)  # building the dashboard (or closing the last one) is not counted
            if d is not None:
                d.curves.lags_ms.clear()
            begin, cpu0, gc0, busy0 = time.time(), busy_cpu_s(), gc_s[0], busy[0]
            kernel0, client0 = proc_cpu_s(os.getpid()), proc_cpu_s(client_pid)
            await asyncio.sleep(window_s)
            end = time.time()
            if run.state == "failed":
                raise RuntimeError(f"the run failed during the benchmark: {run.error}")
            times = [row["time"] for row in run.metrics.rows if begin <= row["time"] < end]
            windows.append({"mode": mode, "seconds": end - begin, "steps": len(times),
                            "step_times": [times[0], times[-1]] if times else [],
                            "cpu_s": busy_cpu_s() - cpu0,
                            "gc_s": gc_s[0] - gc0, "dashboard_s": busy[0] - busy0,
                            "kernel_cpu_s": proc_cpu_s(os.getpid()) - kernel0,
                            "client_cpu_s": proc_cpu_s(client_pid) - client0})
            if d is not None:
                lags += list(d.curves.lags_ms)
                errors = list(d.errors.messages)
                d.close()
                if errors:
                    raise RuntimeError(f"dashboard errors during the benchmark: {errors}")
    finally:
        gc.callbacks.remove(gc_clock)
        await run.stop()
        await run.shutdown()
    return {"windows": windows, "lags": lags, "spawn_s": spawn_s, "synthetic": synthetic, "cpu_work": cpu_work}


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
                f"r = await b.measure({args.pairs}, {args.window_s}, {args.settle_s}, {args.synthetic}, "
                f"{args.step_s}, {os.getpid()}, {args.cpu_work})\n"
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


def window_rate(w: dict[str, Any]) -> float:
    """Steps per second from the window's first step to its last: not rounded to whole steps the way
    ``steps / seconds`` is (one step of 80 is 1.25%)."""
    if w["steps"] >= 3 and w["step_times"][1] > w["step_times"][0]:
        return (w["steps"] - 1) / (w["step_times"][1] - w["step_times"][0])
    return w["steps"] / w["seconds"]


def median_interval(xs: list[float], confidence: float = 0.95) -> tuple[float, float]:
    """A distribution-free interval for the median of ``xs``: the order statistics k and n-k+1 for the
    largest k with P(Binomial(n, 1/2) < k) <= (1 - confidence) / 2. It assumes nothing about the
    spread, which here has the long tail of the machine's stalls."""
    xs, n = sorted(xs), len(xs)
    tail, k = 0.0, 0
    while k < n // 2 and tail + math.comb(n, k) / 2 ** n <= (1 - confidence) / 2:
        tail += math.comb(n, k) / 2 ** n
        k += 1
    if k == 0:
        return -math.inf, math.inf  # too few pairs for this confidence
    return xs[k - 1], xs[n - k]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=32, help="off/on window pairs (even: whole mirrored quads)")
    ap.add_argument("--window-s", type=float, default=10.0, help="seconds counted per window")
    ap.add_argument("--settle-s", type=float, default=2.0, help="seconds not counted at each switch")
    ap.add_argument("--synthetic", action="store_true", help="a recording loop instead of the quickstart")
    ap.add_argument("--step-s", type=float, default=0.25, help="seconds per synthetic step")
    ap.add_argument("--cpu-work", action="store_true",
                    help="with --synthetic: each step is fixed CPU work on every core, not a sleep")
    ap.add_argument("--timeout", type=float, default=3000)
    ap.add_argument("--log", default=os.path.join(tempfile.gettempdir(), "bench-dashboard-kernel.log"))
    ap.add_argument("--raw", default=os.path.join(tempfile.gettempdir(), "bench-dashboard-raw.json"),
                    help="where the windows' raw figures are written")
    args = ap.parse_args()
    if args.cpu_work and not args.synthetic:
        ap.error("--cpu-work shapes the synthetic steps; add --synthetic")
    r = run_in_kernel(args)
    with open(args.raw, "w") as f:
        json.dump({"args": vars(args), **r}, f)
    by_mode = {m: [w for w in r["windows"] if w["mode"] == m] for m in ("off", "on")}
    keys = ("seconds", "steps", "cpu_s", "gc_s", "dashboard_s", "kernel_cpu_s", "client_cpu_s")
    total = {m: {k: sum(w[k] for w in ws) for k in keys} for m, ws in by_mode.items()}
    rate = {m: t["steps"] / t["seconds"] for m, t in total.items()}
    what = ("CPU quickstart run, training without pauses" if not r["synthetic"]
            else "synthetic steps of fixed CPU work on every core" if r["cpu_work"]
            else "synthetic recording loop")
    print(f"workload: {what}; {args.pairs} windows of {args.window_s:.0f} s per mode, mirrored "
          f"(spawn {r['spawn_s']:.0f} s)")
    for m in ("off", "on"):
        print(f"steps/s {m:3}: " + " ".join(f"{window_rate(w):.2f}" for w in by_mode[m]))
    print(f"latency record -> widget over {len(r['lags'])} rows: p50 {pct(r['lags'], 0.5):.1f} ms, "
          f"p95 {pct(r['lags'], 0.95):.1f} ms, max {max(r['lags'], default=float('nan')):.1f} ms")
    on, off = total["on"], total["off"]
    print(f"dashboard time on the kernel thread: {1000 * on['dashboard_s'] / on['seconds']:.1f} ms per s "
          f"({100 * on['dashboard_s'] / on['seconds']:.2f}%)")
    print(f"kernel GC pauses: {1000 * on['gc_s'] / on['seconds']:.1f} ms per s on, "
          f"{1000 * off['gc_s'] / off['seconds']:.1f} ms per s off")
    cores = os.cpu_count() or 1
    for m, t in total.items():
        print(f"machine CPU {m:3}: {t['cpu_s'] / t['seconds']:.2f} of {cores} cores busy, "
              f"{1000 * t['cpu_s'] / max(t['steps'], 1):.0f} ms CPU per training step; of which the kernel "
              f"process {1000 * t['kernel_cpu_s'] / t['seconds']:.0f} ms per s, this client (decoding the "
              f"kernel's messages) {1000 * t['client_cpu_s'] / t['seconds']:.0f} ms per s")
    pairs = [1 - window_rate(b) / window_rate(a) for a, b in zip(by_mode["off"], by_mode["on"], strict=True)]
    slowdown = 100 * (1 - rate["on"] / rate["off"])
    median = 100 * statistics.median(pairs)
    low, high = (100 * x for x in median_interval(pairs))
    print(f"throughput, pooled: {rate['on']:.3f} steps/s on vs {rate['off']:.3f} off ({on['steps']} and "
          f"{off['steps']} steps): {slowdown:.2f}% slower")
    print(f"throughput, window pairs (first-to-last step): median {median:.2f}% slower, 95% interval "
          f"{low:.2f}% .. {high:.2f}%; mean {100 * statistics.mean(pairs):.2f}%")
    print(f"RESULT dashboard_slowdown_pct {median:.2f} (target 2)")
    print(f"RESULT dashboard_slowdown_upper95_pct {high:.2f} (target 2)")
    print(f"RESULT dashboard_p95_latency_ms {pct(r['lags'], 0.95):.1f} (target 250)")


if __name__ == "__main__":
    main()
