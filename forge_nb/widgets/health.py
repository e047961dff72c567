"""HealthGrid: one row per replica of each service, coloured by state, refreshed on events and by polling.

The grid reads ``service.status()`` (plain ``ReplicaStatus`` records, duck-typed here: widgets never
import the service layer) and renders an HTML table per service: state, pids, requests in flight,
served, failures / restarts, latency p50 / p95, and the weight-version lag (the run's version minus
the replica's), with a replica's last error on a row of its own under it. It refreshes when a service
reports a state change (``service.subscribe``) and when the dashboard's poll ticks (in-flight counts and
latencies change without events). Rows carry ``data-replica`` and ``data-state`` so a browser test can
read them.
"""

from __future__ import annotations

import asyncio
import html
import weakref
from collections.abc import Callable
from typing import Any

import ipywidgets as w

from forge_nb.system.hosts.cluster import job_line
from forge_nb.widgets._shared.throttle import Throttle

FIELDS = ("service", "index", "state", "pids", "in_flight", "served", "failures", "restarts",
          "latency_p50_ms", "latency_p95_ms", "last_error", "version", "host")
COLORS = {"healthy": "#2ca02c", "starting": "#1f77b4", "recovering": "#d62728", "failed": "#7f0000",
          "stopped": "#7f7f7f"}
Snapshot = dict[str, list[dict[str, Any]]]


def status_dict(status: Any) -> dict[str, Any]:
    """A ReplicaStatus (or anything with its attributes, or a dict) as a plain dict."""
    if isinstance(status, dict):
        return {f: status.get(f) for f in FIELDS}
    return {f: getattr(status, f, None) for f in FIELDS}


def snapshot(services: dict[str, Any]) -> Snapshot:
    """service name -> its replicas' status dicts."""
    return {name: [status_dict(s) for s in svc.status()] for name, svc in services.items()}


def sharing(services: dict[str, Any]) -> dict[str, list[str]]:
    """service name -> the other runs that use it too (LoRA runs on one base hold shares of its services:
    ``forge_nb.service.shared``, duck-typed)."""
    found = {}
    for name, svc in services.items():
        runs, me = getattr(getattr(svc, "shared", None), "names", None), getattr(svc, "run_name", None)
        others = [n for n in runs or [] if n != me]
        if me is not None and others:
            found[name] = others
    return found


def _cell(value: Any, unit: str = "") -> str:
    if value is None:
        return "&ndash;"
    if isinstance(value, float):
        return f"{value:.1f}{unit}"
    return f"{html.escape(str(value))}{unit}"


def render_job(job: dict[str, Any] | None) -> str:
    """The job the hosts come from (``Run.job``: a SLURM job's id, state, nodes), or nothing on one machine."""
    if not job:
        return ""
    lost = any(why != "alive" for why in job["hosts"].values())
    return (f"<div class='forge-job' data-job='{html.escape(str(job.get('job_id')))}' "
            f"data-job-state='{html.escape(str(job.get('state')))}' style='margin:2px 0;font-size:12px;"
            f"color:{'#7f0000' if lost else 'inherit'}'>{html.escape(job_line(job))}</div>")


HEAD = ("replica", "state", "pids", "in flight", "served", "failures / restarts", "p50 / p95 ms", "version lag")


def render_health(snap: Snapshot, run_version: int | None, job: dict[str, Any] | None = None,
                  shared: dict[str, list[str]] | None = None) -> str:
    """The HTML tables of a snapshot (also the grid's part of the plain HTML view), under the job's line;
    ``shared``: the other runs each service serves too (:func:`sharing`)."""
    if not snap:
        return f"<div class='forge-health'>{render_job(job)}<i>no services yet</i></div>"
    # Nine narrow columns (pairs of numbers share one) and the last error on a row of its own under its
    # replica: the grid fits a dashboard ~500 px wide beside the notebook without cutting a column.
    head = "".join(f"<th style='padding:2px 4px;text-align:left'>{h}</th>" for h in HEAD)
    parts = ["<div class='forge-health'>", render_job(job)]
    for name, rows in snap.items():
        healthy = sum(r["state"] == "healthy" for r in rows)
        others = (shared or {}).get(name)
        with_others = (f" &middot; <span data-shared='{html.escape(','.join(others))}'>shared with "
                       f"{html.escape(', '.join(others))}</span>" if others else "")
        parts.append(f"<div data-service='{html.escape(name)}' style='margin:4px 0;overflow-x:auto'>"
                     f"<b>{html.escape(name)}</b> &mdash; {healthy}/{len(rows)} healthy{with_others}"
                     f"<table style='border-collapse:collapse;font-size:12px'><tr>{head}</tr>")
        for r in rows:
            state = str(r["state"])
            lag = (run_version - r["version"]) if run_version is not None and r["version"] is not None else None
            error = str(r["last_error"] or "")
            cells = [
                _cell(f"{name}[{r['index']}]"),
                f"<span style='background:{COLORS.get(state, '#999')};color:white;padding:1px 6px;"
                f"border-radius:3px'>{html.escape(state)}</span>",
                _cell(",".join(str(p) for p in r["pids"] or []) + (f" @{r['host']}" if r["host"] not in (None, "kernel")
                                                                  else "") or None),
                _cell(r["in_flight"]), _cell(r["served"]), f"{_cell(r['failures'])}&nbsp;/&nbsp;{_cell(r['restarts'])}",
                f"{_cell(r['latency_p50_ms'])}&nbsp;/&nbsp;{_cell(r['latency_p95_ms'])}", _cell(lag),
            ]
            tds = "".join(f"<td style='padding:2px 4px'>{c}</td>" for c in cells)
            parts.append(f"<tr data-replica='{html.escape(name)}[{r['index']}]' "
                         f"data-state='{html.escape(state)}'>{tds}</tr>")
            if error:
                parts.append(f"<tr class='forge-last-error'><td colspan='{len(HEAD)}' title='{html.escape(error)}' "
                             "style='padding:0 4px 4px 16px;color:#b00020'>"
                             f"last error: {html.escape(error[:200])}</td></tr>")
        parts.append("</table></div>")
    parts.append("</div>")
    return "".join(parts)


class HealthGrid:
    """The replica health grid of a run's services; ``refresh()`` re-reads every status."""

    def __init__(self, services: Callable[[], dict[str, Any]], version: Callable[[], int | None],
                 loop: asyncio.AbstractEventLoop | None = None,
                 on_error: Callable[[BaseException], None] | None = None, interval: float = 0.1,
                 job: Callable[[], dict[str, Any] | None] = lambda: None):
        self._services = services
        self._version = version
        self._job = job
        # as wide as the dashboard, scrolling sideways where a narrower view cannot hold the table
        self.html = w.HTML(render_health({}, None), layout=w.Layout(width="100%", overflow="auto"))
        self.widget = self.html
        self.snapshot: Snapshot = {}
        self.throttle = Throttle(self.refresh, interval=interval, loop=loop, on_error=on_error)
        self._unsubscribe: dict[int, Callable[[], None]] = {}  # id() of each service subscribed to -> undo
        self.closed = False

    def refresh(self) -> None:
        if self.closed:
            return
        services = dict(self._services() or {})
        for svc in services.values():
            self._subscribe(svc)
        self.snapshot = snapshot(services)
        value = render_health(self.snapshot, self._version(), self._job(), sharing(services))
        if value != self.html.value:
            self.html.value = value

    def _subscribe(self, svc: Any) -> None:
        """Hear of the service's state changes. The hook holds only a weakref, so a grid that is dropped
        without ``unsubscribe()`` goes quiet instead of being kept alive by the service."""
        if id(svc) in self._unsubscribe or not hasattr(svc, "subscribe"):
            return
        ref = weakref.ref(self)

        def on_event(event: Any) -> None:
            grid = ref()
            if grid is not None and not grid.closed:
                grid.throttle.poke()

        self._unsubscribe[id(svc)] = svc.subscribe(on_event) or (lambda: None)

    def unsubscribe(self) -> None:
        """Stop hearing of state changes (the next ``refresh()`` subscribes again)."""
        for undo in self._unsubscribe.values():
            undo()
        self._unsubscribe.clear()
        self.throttle.cancel()

    def states(self) -> dict[str, str]:
        """"service[i]" -> state, from the last refresh."""
        return {f"{name}[{r['index']}]": r["state"] for name, rows in self.snapshot.items() for r in rows}

    def close(self) -> None:
        self.closed = True
        self.unsubscribe()
        self.html.close()
