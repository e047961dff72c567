"""Dashboard cost with a browser showing it: training throughput with the dashboard's updates on and
off while JupyterLab displays it in headless Chromium on the same machine.

bench/dashboard.py measures the dashboard in a kernel with no browser attached. A researcher sees it in
JupyterLab, where every curve flush is also drawn by the page (the curves scrolled into view: the
costly case). This bench opens a notebook in JupyterLab (the browser
tests' ``Lab``: loopback, no token, Debian's chromium through Playwright), whose cells start the same
fixed-CPU-work synthetic run as ``bench/dashboard.py --synthetic --cpu-work`` and display
``Dashboard(run)``. It then alternates windows with the dashboard updating (``start()``) and stopped
(``stop()``: the view stays on the page, nothing is sent), mirrored, and reports steps per second in
each mode (from each window's first recorded step to its last, as ``bench/dashboard.py`` does: whole
steps over a 20 s window would round by 1.2%) with the CPU of the kernel, the Jupyter server and
chromium (every process of each, from /proc), what the page's curves view received and drew, and
where the page's main thread spent its time (Chromium's own ``Performance.getMetrics`` over CDP:
script, style recalculation, layout, and all tasks).
The slowdown is the median of the on/off pairs, with a distribution-free 95% interval
(``bench.dashboard.median_interval``).

    .venv/bin/python bench/dashboard_browser.py [--pairs P] [--window-s S] [--history N]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.dashboard import median_interval, proc_cpu_s, schedule, window_rate  # noqa: E402

PAGE_STATS = "() => ({...document.querySelector('.forge-dashboard .forge-curves').forgeCurves.stats})"
#: Chromium's main-thread totals (seconds) reported per window, as ms per s: what the page's cost is made of.
PAGE_TIMES = {"script": "ScriptDuration", "style": "RecalcStyleDuration", "layout": "LayoutDuration",
              "tasks": "TaskDuration"}


def page_times(cdp) -> dict[str, float]:
    metrics = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
    return {k: float(metrics.get(name, 0.0)) for k, name in PAGE_TIMES.items()}


def cpu_s(marker: str) -> float:
    """CPU seconds used so far by every process whose command line contains ``marker``."""
    total = 0.0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    total += proc_cpu_s(int(pid))
        except (OSError, ValueError):
            continue  # the process ended while being read
    return total


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=8, help="on/off window pairs")
    ap.add_argument("--window-s", type=float, default=20.0, help="seconds counted per window")
    ap.add_argument("--settle-s", type=float, default=3.0, help="seconds not counted at each switch")
    ap.add_argument("--history", type=int, default=40, help="steps recorded before the dashboard opens")
    args = ap.parse_args()
    from tests.widgets.test_browser import Lab

    cells = [f"import sys\nsys.path.insert(0, {ROOT!r})\nimport bench.dashboard as b\n"
             "from forge_nb.widgets import Dashboard\nrun = b.SyntheticRun(0.25, cpu_work=True)\n"
             f"await run.step({args.history})\nrun.start()",
             "d = Dashboard(run)\nd"]
    tmp = Path(tempfile.mkdtemp(prefix="bench-dash-browser-"))
    lab = Lab(tmp, cells, shutdown="d.close()\nawait run.shutdown()")
    windows: list[dict[str, float | str]] = []
    try:
        lab.open_and_run_all()
        lab.page.wait_for_selector(".forge-dashboard .forge-curves canvas", timeout=600_000)
        lab.page.locator(".forge-dashboard .forge-curves").scroll_into_view_if_needed()
        connection = lab.kernel_eval("import ipykernel.connect as c\nprint(c.get_connection_file())").strip()
        markers = {"kernel": os.path.basename(connection), "server": "jupyterlab", "chromium": "chromium"}
        cdp = lab.page.context.new_cdp_session(lab.page)
        cdp.send("Performance.enable")
        for mode in schedule(args.pairs):
            lab.kernel_eval("d.start()" if mode == "on" else "d.stop()")
            time.sleep(args.settle_s)
            cpu0 = {k: cpu_s(m) for k, m in markers.items()}
            page0, times0 = lab.page.evaluate(PAGE_STATS), page_times(cdp)
            begin, t0 = float(lab.kernel_eval("import time\nprint(repr(time.time()))")), time.monotonic()
            time.sleep(args.window_s)
            end, t1 = float(lab.kernel_eval("print(repr(time.time()))")), time.monotonic()
            page1, times1 = lab.page.evaluate(PAGE_STATS), page_times(cdp)
            # the rows' record times, read in the kernel: the rate from the window's first step to its last
            times = json.loads(lab.kernel_eval("import json\nprint(json.dumps([r['time'] for r in run.metrics.rows"
                                               f" if {begin!r} <= r['time'] < {end!r}]))"))
            counted = {"steps": len(times), "seconds": end - begin,
                       "step_times": [times[0], times[-1]] if times else []}
            window: dict[str, float | str] = {"mode": mode, "rate": window_rate(counted)}
            window.update({k: (cpu_s(m) - cpu0[k]) / (t1 - t0) for k, m in markers.items()})
            window.update({k: (page1[k] - page0[k]) / (t1 - t0) for k in ("messages", "draws")})
            window.update({k: (times1[k] - times0[k]) / (t1 - t0) for k in PAGE_TIMES})
            windows.append(window)
            print(f"{mode:3} {window['rate']:.2f} steps/s; CPU ms per s: "
                  + ", ".join(f"{k} {1000 * float(window[k]):.0f}" for k in markers)
                  + f"; page: {window['messages']:.1f} messages/s, {window['draws']:.1f} draws/s; "
                  + "main thread ms per s: "
                  + ", ".join(f"{k} {1000 * float(window[k]):.0f}" for k in PAGE_TIMES), flush=True)
    finally:
        lab.close()
        shutil.rmtree(tmp, ignore_errors=True)
    on = [w for w in windows if w["mode"] == "on"]
    off = [w for w in windows if w["mode"] == "off"]
    pairs = [1 - float(a["rate"]) / float(b["rate"]) for a, b in zip(on, off, strict=True)]
    for name, ws in (("on", on), ("off", off)):
        print(f"{name:3}: {statistics.mean(float(w['rate']) for w in ws):.3f} steps/s; CPU ms per s: "
              + ", ".join(f"{k} {1000 * statistics.mean(float(w[k]) for w in ws):.0f}"
                          for k in ("kernel", "server", "chromium"))
              + "; page main thread ms per s: "
              + ", ".join(f"{k} {1000 * statistics.mean(float(w[k]) for w in ws):.0f}" for k in PAGE_TIMES))
    lo, hi = median_interval(pairs)
    print(f"window pairs: median {100 * statistics.median(pairs):.1f}% slower, 95% interval "
          f"{100 * lo:.1f}..{100 * hi:.1f}% ({', '.join(f'{100 * p:.1f}' for p in pairs)})")
    print(f"RESULT dashboard_browser_slowdown_pct {100 * statistics.median(pairs):.1f} (target 2)")
    print(f"RESULT dashboard_browser_slowdown_upper95_pct {100 * hi:.1f}")


if __name__ == "__main__":
    main()
