"""Tables the magics display: HTML in a notebook, aligned text in a terminal or a plain-text log."""

from __future__ import annotations

import dataclasses
import html
from collections.abc import Sequence
from typing import Any

from forge_nb.system.hosts.cluster import job_line

_MAX_CELL = 60  # characters shown of a long value (a prompt, a response, an error)


class Table:
    """Rows of dicts with a title; ``display(Table(...))`` picks HTML or text by the front end."""

    def __init__(self, rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None, title: str = ""):
        self.rows = [dict(r) for r in rows]
        self.columns = list(columns) if columns is not None else list(dict.fromkeys(k for r in rows for k in r))
        self.title = title

    def __repr__(self) -> str:
        cells = [[_fmt(r.get(c)) for c in self.columns] for r in self.rows]
        widths = [max([len(c), *(len(row[i]) for row in cells)]) for i, c in enumerate(self.columns)]
        lines = [self.title] if self.title else []
        lines.append("  ".join(c.ljust(w) for c, w in zip(self.columns, widths, strict=True)).rstrip())
        lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in cells]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{html.escape(c)}</th>" for c in self.columns)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(_fmt(r.get(c)))}</td>" for c in self.columns) + "</tr>"
                       for r in self.rows)
        caption = f"<caption style='text-align:left'><b>{html.escape(self.title)}</b></caption>" if self.title else ""
        return f"<table class='forge-nb-table'>{caption}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


class Report:
    """Several tables and lines shown as one output (``%forge_status``)."""

    def __init__(self, parts: Sequence[str | Table]):
        self.parts = list(parts)

    def __repr__(self) -> str:
        return "\n\n".join(repr(p) if isinstance(p, Table) else p for p in self.parts)

    def _repr_html_(self) -> str:
        return "".join(p._repr_html_() if isinstance(p, Table) else f"<p>{html.escape(p)}</p>" for p in self.parts)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        text = f"{value:.4g}"
    elif isinstance(value, list | tuple):
        text = ",".join(map(str, value)) or "-"
    else:
        text = str(value).replace("\n", "\\n")
    return text if len(text) <= _MAX_CELL else text[: _MAX_CELL - 1] + "…"


# -- what each magic shows ---------------------------------------------------------------------------

MESH_COLUMNS = ("name", "procs", "host", "pids", "state", "gpus", "owner", "failures", "age_s")


def meshes_table(infos: Sequence[Any]) -> Table:
    rows = [{**dataclasses.asdict(i), "gpus": i.gpu_ids if i.with_gpus else "-"} for i in infos]
    return Table(rows, MESH_COLUMNS, title=f"{len(rows)} mesh(es) held by this kernel")


REPLICA_COLUMNS = ("service", "index", "state", "host", "pids", "in_flight", "served", "failures", "restarts",
                   "version", "latency_p50_ms", "last_error")


def status_report(status: dict[str, Any]) -> Report:
    """``run.status()`` as a headline, a replica table, the loops and the last metrics."""
    mode = " (supervised fine-tuning)" if status.get("mode") == "sft" else ""
    head = (f"run {status['name']!r}: {status['state']}{mode}, step {status['step']}, version {status['version']}, "
            f"{status['buffer']} episode(s) buffered")
    parts: list[str | Table] = [head]
    if status.get("error"):
        parts.append(f"error: {status['error']}")
    replicas = [{**dataclasses.asdict(r), "service": name} for name, rs in status["services"].items() for r in rs]
    parts.append(Table(replicas, REPLICA_COLUMNS, title="replicas"))
    if status.get("shares_base_with"):
        parts.append(f"one base model: its generators and trainer process also serve {status['shares_base_with']}")
    if status.get("job"):
        parts.append(job_line(status["job"]))
    loops = status.get("loops") or {}
    parts.append("loops: " + (", ".join(f"{n} {s}" for n, s in loops.items()) or "not started (%forge_run)"))
    if status.get("openai"):
        parts.append(openai_line(status["openai"]))
    if status.get("tinker"):
        parts.append(tinker_line(status["tinker"]))
    if status.get("pending"):
        parts.append("pending for the next step: " + ", ".join(f"{k}={v}" for k, v in status["pending"].items()))
    last = status.get("last") or {}
    if last:
        parts.append(steps_table([last], title="last step (all values: run.metrics.frame())"))
    parts.append(f"run directory: {status['run_dir']}")
    return Report(parts)


def openai_line(endpoint: dict[str, Any]) -> str:
    """The run's OpenAI endpoint (``%forge_serve``): where, what it served, and how fast."""
    if not endpoint.get("serving"):
        return "OpenAI endpoint: stopped"
    p50 = f", p50 {endpoint['p50_s'] * 1000:.0f} ms" if endpoint.get("p50_s") is not None else ""
    return (f"OpenAI endpoint: {endpoint['url']} (model {endpoint['model']!r}): {endpoint['requests']} request(s), "
            f"{endpoint['errors']} error(s){p50}, {endpoint['trajectories']} open trajectory(ies)")


def tinker_line(server: dict[str, Any]) -> str:
    """The run's Tinker API (``%forge_serve --tinker``): where, its training clients' runs, its calls in flight."""
    if not server.get("serving"):
        return "Tinker API: stopped"
    clients = ", ".join(f"{run} ({model})" for model, run in server["clients"].items()) or "none yet"
    flight = ", ".join(f"{n} {kind}" for kind, n in server["in_flight"].items()) or "none"
    return (f"Tinker API: {server['url']} (base_model {server['base_model']!r}): training clients {clients}; "
            f"calls in flight: {flight}; {server['requests']} request(s), {server['refused']} refused")


RUN_COLUMNS = ("run", "variables", "state", "step", "version", "buffer", "replicas", "reward/mean", "loss")


def runs_table(statuses: Sequence[dict[str, Any]]) -> Table:
    """One line per run (``%forge_status`` with several live runs): ``run.status()`` plus its ``variables``."""
    rows = []
    for status in statuses:
        replicas = ", ".join(f"{name} {sum(r.state == 'healthy' for r in rs)}/{len(rs)}"
                             for name, rs in status["services"].items())
        last = status.get("last") or {}
        rows.append({"run": status["name"], "variables": status.get("variables"), "state": status["state"],
                     "step": status["step"], "version": status["version"], "buffer": status["buffer"],
                     "replicas": replicas, "shares base with": ", ".join(status.get("shares_base_with") or []),
                     "reward/mean": last.get("reward/mean"), "loss": last.get("loss")})
    columns = list(RUN_COLUMNS)
    if any(r["shares base with"] for r in rows):  # LoRA runs on one base model (forge_nb.spawn(cfg, base=))
        columns.insert(columns.index("replicas") + 1, "shares base with")
    return Table(rows, columns, title=f"{len(rows)} live runs (replicas: healthy/all; "
                                          "%forge_status --name NAME shows one in full)")


EPISODE_COLUMNS = ("episode_id", "version", "reward", "advantage", "prompt", "response", "target", "quarantine")


def episodes_table(rows: Sequence[dict[str, Any]]) -> Table:
    """One line per episode; multi-turn ones show their number of turns (``--turns`` shows each turn), an
    agent's their trajectory and segment (the episodes of one run of the agent share a trajectory)."""
    columns = list(EPISODE_COLUMNS)
    if any("trajectory" in r for r in rows):
        columns[1:1] = ["trajectory", "segment"]
    if not any("turns" in r for r in rows):
        return Table(rows, columns, title=f"{len(rows)} episode(s), newest last")
    counted = [{**r, "turns": len(r["turns"]) if "turns" in r else None} for r in rows]
    columns.insert(columns.index("prompt"), "turns")
    return Table(counted, columns, title=f"{len(rows)} episode(s), newest last (%forge_episodes --turns: turn by turn)")


TURN_COLUMNS = ("turn", "action", "observation", "tool", "reward")


def turns_report(rows: Sequence[dict[str, Any]]) -> Report:
    """Each episode turn by turn: the policy's action, what answered it (the environment, or a tool with
    whether the call succeeded) and the turn's reward."""
    parts: list[str | Table] = []
    for r in rows:
        head = (f"episode {r['episode_id']}"
                + (f" (trajectory {r['trajectory']}, segment {r['segment']})" if "trajectory" in r else "")
                + f": version {r['version']}, reward {_fmt(r['reward'])}, "
                f"prompt {_fmt(r['prompt'])}" + (f", quarantined: {r['quarantine']}" if r.get("quarantine") else ""))
        if "turns" not in r:
            parts.append(head + " (single turn: " + _fmt(r["response"]) + ")")
            continue
        turns = [{"turn": i, "action": t["action"], "observation": t["observation"], "reward": t["reward"],
                  "tool": _tool(t.get("info", {}))} for i, t in enumerate(r["turns"], 1)]
        parts.append(Table(turns, TURN_COLUMNS, title=head))
    return Report(parts)


def _tool(info: dict[str, Any]) -> str | None:
    if "tool" not in info:
        return None
    return f"{info['tool'] or '?'} {'ok' if info.get('tool_ok') else 'failed'}"


#: Per-step values worth a glance; the rest are in ``run.metrics.frame()``.
HEADLINE = ("step", "loss", "reward/mean", "eval/reward", "grad_norm", "response_len/mean", "policy_age/mean",
            "version", "time/step_s")


def steps_table(rows: Sequence[dict[str, Any]], title: str = "") -> Table:
    columns = [c for c in HEADLINE if any(c in r for r in rows)]
    return Table(rows, columns, title=title or f"{len(rows)} step(s)")


#: Events a step summary counts (the rest are on the dashboard and in ``run.metrics.events``).
_SUMMARY_EVENTS = ("rewind", "trainer_died", "skip", "quarantine", "replica", "weight_load_failed", "set",
                   "set_refused", "starved", "checkpoint", "eval", "error")


def step_summary(rows: Sequence[dict[str, Any]], events: Sequence[dict[str, Any]], title: str) -> Report:
    """What ``%forge_step N`` shows whatever N is: the first and the last of the steps (the rows between are
    on the dashboard and in ``run.metrics``), their rate, and the events they saw, counted by kind."""
    if not rows:
        return Report([title])
    shown = [rows[0], rows[-1]] if len(rows) > 1 else [rows[0]]
    lines: list[str | Table] = [steps_table(shown, title=title)]
    times = [r["time"] for r in rows if isinstance(r.get("time"), int | float)]
    if len(times) > 1 and times[-1] > times[0]:
        rate = (len(times) - 1) / (times[-1] - times[0])
        lines.append(f"steps {rows[0].get('step')}-{rows[-1].get('step')}: {rate:.1f} steps/s; every step: "
                     "run.metrics.frame(), the dashboard (%forge_dashboard)")
    counts: dict[str, int] = {}
    for event in events:
        if event.get("kind") in _SUMMARY_EVENTS:
            counts[event["kind"]] = counts.get(event["kind"], 0) + 1
    if counts:
        lines.append("events: " + ", ".join(f"{kind} x{n}" for kind, n in counts.items())
                     + " (run.metrics.events_frame())")
    return Report(lines)
