"""Explorer: recent episodes filtered by policy version and reward range, and one prompt across versions.

Reads ``run.episodes(n=, version=, min_reward=, max_reward=)`` (dicts with prompt, response, target, reward,
advantage, version, episode_id; a multi-turn episode's ``turns`` are shown turn by turn, an agent's
``trajectory`` and ``segment`` under its id; a trained episode's ``token_ratios``, the trainer's per-token ratio
to the generator, coloured where it leaves [0.8, 1.25] and [0.5, 2]). The table shows
the filtered episodes; below it, one prompt's completions sit side by side, a column per policy version, so
a change in behaviour between versions is visible at a glance. With *follow* on, both refresh when the run's
version changes (checked on the dashboard's poll tick, only while the explorer is open: a collapsed one
costs nothing); editing a filter refreshes at once.
"""

from __future__ import annotations

import html
from collections import defaultdict
from typing import Any

import ipywidgets as w

from forge_nb.widgets._shared.errors import ErrorLog
from forge_nb.widgets._shared.run import RunView

Episode = dict[str, Any]
#: The version dropdown's value for "every version". Not None: ipywidgets' Dropdown takes a None value
#: for "nothing selected" and shows a blank box instead of the option's label.
ALL = "all"


def _num(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, int | float) and not isinstance(value, bool) else html.escape(
        str(value))


def _text(value: Any, limit: int = 400) -> str:
    s = str(value if value is not None else "")
    short = s if len(s) <= limit else s[:limit] + " ..."
    return f"<span style='white-space:pre-wrap' title='{html.escape(s[:2000])}'>{html.escape(short)}</span>"


def render_episodes(episodes: list[Episode]) -> str:
    if not episodes:
        return "<div class='forge-episodes'><i>no episodes match</i></div>"
    head = "".join(f"<th style='text-align:left;padding:2px 6px'>{h}</th>" for h in (
        "id", "version", "reward", "advantage", "prompt", "response", "target", "ratio trainer / generator"))
    rows = []
    for e in episodes:
        response = _turns(e["turns"]) if "turns" in e else _text(e.get("response"))
        ident = html.escape(str(e.get("episode_id", "")))
        if "trajectory" in e:  # an agent's: the episodes of one run of the agent share a trajectory
            ident += (f"<br><span style='color:#666' title='{html.escape(str(e['trajectory']))}'>trajectory "
                      f"{html.escape(str(e['trajectory'])[:8])}, segment {_num(e.get('segment'))}</span>")
        cells = [ident, _num(e.get("version")), _num(e.get("reward")),
                 _num(e.get("advantage")), _text(e.get("prompt"), 200), response, _text(e.get("target"), 100),
                 _ratios(e.get("token_ratios"))]
        rows.append("<tr>" + "".join(f"<td style='vertical-align:top;padding:2px 6px'>{c}</td>"
                                     for c in cells) + "</tr>")
    return (f"<div class='forge-episodes' style='max-height:360px;overflow:auto'><table "
            f"style='border-collapse:collapse;font-size:12px'><tr>{head}</tr>{''.join(rows)}</table></div>")


#: Per-token ratios outside these bands are drawn orange (mild) and red (far): where mismatch correction would act.
RATIO_BANDS = ((0.8, 1.25), (0.5, 2.0))
RATIOS_SHOWN = 48  #: tokens shown of a long answer's ratios (the tooltip has its min and max)


def _ratios(values: list[float] | None) -> str:
    """An episode's per-token ratio trainer / generator, as the trainer measured it when the episode trained
    (``mismatch/token_ratios``); empty before then, or when the generator gave no logprobs."""
    if not values:
        return "<span style='color:#999'>-</span>"
    (mild_lo, mild_hi), (far_lo, far_hi) = RATIO_BANDS

    def color(v: float) -> str:
        return "#d62728" if not far_lo <= v <= far_hi else "#ff7f0e" if not mild_lo <= v <= mild_hi else "#444"

    spans = " ".join(f"<span style='color:{color(v)}'>{v:.2f}</span>" for v in values[:RATIOS_SHOWN])
    more = f" ... ({len(values)} tokens)" if len(values) > RATIOS_SHOWN else ""
    return (f"<span style='font-family:monospace' title='min {min(values):.3g}, max {max(values):.3g}'>"
            f"{spans}{more}</span>")


def _turns(turns: list[dict[str, Any]]) -> str:
    """A multi-turn episode's response, turn by turn: the policy's action, then what answered it (the
    environment, a tool marked ok or failed, or an agent's own message) and the turn's reward."""
    lines = []
    for i, t in enumerate(turns, 1):
        info = t.get("info", {})
        source = (f"tool {html.escape(str(info['tool']))} {'ok' if info.get('tool_ok') else 'failed'}"
                  if "tool" in info else html.escape(str(info.get("source", "env"))))
        answer = _text(t["observation"], 200) if t.get("observation") else "<i>(end)</i>"
        lines.append(f"<div class='forge-turn'><b>{i}</b> &#9654; {_text(t.get('action'), 200)} "
                     f"<span style='color:#666'>&#9664; {source}: {answer}</span> "
                     f"<i>r={_num(t.get('reward'))}</i></div>")
    return "".join(lines)


def render_compare(episodes: list[Episode], prompt: str | None, max_versions: int = 6) -> str:
    """One prompt's completions, a column per version (the newest ``max_versions``)."""
    if prompt is None:
        return "<div class='forge-compare'><i>no prompt selected</i></div>"
    by_version: dict[Any, list[Episode]] = defaultdict(list)
    for e in episodes:
        if str(e.get("prompt")) == prompt:
            by_version[e.get("version")].append(e)
    if not by_version:
        return "<div class='forge-compare'><i>no completions of this prompt in the recent episodes</i></div>"
    versions = sorted(by_version, key=lambda v: (v is None, v))[-max_versions:]
    head = "".join(f"<th style='text-align:left;padding:2px 6px'>version {_num(v)}</th>" for v in versions)
    cols = []
    for v in versions:
        items = "".join(f"<div style='border-bottom:1px solid #ddd;padding:2px 0'><b>{_num(e.get('reward'))}"
                        f"</b> {_text(e.get('response'))}</div>" for e in by_version[v])
        cols.append(f"<td style='vertical-align:top;padding:2px 6px;min-width:160px'>{items}</td>")
    target = by_version[versions[-1]][0].get("target")
    return (f"<div class='forge-compare'><div>{_text(prompt, 600)}</div><div>target: {_text(target, 200)}</div>"
            f"<table style='border-collapse:collapse;font-size:12px'><tr>{head}</tr>"
            f"<tr>{''.join(cols)}</tr></table></div>")


def _bound(text: str, name: str) -> float | None:
    text = text.strip()
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{name}={text!r} is not a number; type a number or leave it empty") from None


class Explorer:
    """Filtered recent episodes and a prompt's completions across versions; ``refresh()`` re-reads."""

    def __init__(self, run: RunView, errors: ErrorLog, n: int = 50, pool: int = 500):
        self.run = run
        self.pool = pool
        small = w.Layout(width="150px")
        self.version = w.Dropdown(options=[("all", ALL)], value=ALL, description="version", layout=small,
                                  style={"description_width": "55px"})
        self.min_reward = w.Text(placeholder="min", description="reward", layout=small,
                                 style={"description_width": "55px"}, continuous_update=False)
        self.max_reward = w.Text(placeholder="max", layout=w.Layout(width="80px"), continuous_update=False)
        self.n = w.BoundedIntText(value=n, min=1, max=100_000, description="n", layout=w.Layout(width="120px"),
                                  style={"description_width": "20px"})
        self.refresh_button = w.Button(description="refresh", icon="refresh", layout=w.Layout(width="100px"))
        self.follow = w.Checkbox(value=True, description="follow new versions", indent=False)
        self.table = w.HTML(render_episodes([]))
        self.prompt = w.Dropdown(options=[], description="prompt", layout=w.Layout(width="95%"))
        self.compare = w.HTML(render_compare([], None))
        self._updating = False
        self._seen_version: Any = object()
        self._pool: list[Episode] = []
        refresh = errors.guard("episode explorer")(lambda *_: self.refresh())
        self.refresh_button.on_click(refresh)
        for widget in (self.version, self.min_reward, self.max_reward, self.n):
            widget.observe(lambda _: None if self._updating else refresh(), names="value")
        self.prompt.observe(errors.guard("episode explorer")(lambda _: self._compare()), names="value")
        filters = w.HBox([self.version, self.min_reward, self.max_reward, self.n, self.refresh_button,
                          self.follow])
        self.widget = w.VBox([filters, self.table, w.HTML("<b>one prompt across versions</b>"), self.prompt,
                              self.compare])

    @property
    def selected_version(self) -> int | None:
        """The version filter for ``run.episodes`` (None: every version)."""
        value = self.version.value
        return None if value == ALL or value is None else int(value)

    def refresh(self) -> None:
        self._seen_version = getattr(self.run, "version", None)
        lo, hi = _bound(self.min_reward.value, "min reward"), _bound(self.max_reward.value, "max reward")
        episodes = list(self.run.episodes(n=int(self.n.value), version=self.selected_version,
                                          min_reward=lo, max_reward=hi))
        self.table.value = render_episodes(episodes)
        self._pool = list(self.run.episodes(n=self.pool))
        self._updating = True
        try:
            versions = sorted({e.get("version") for e in self._pool if e.get("version") is not None})
            current = self.version.value
            options: list[tuple[str, Any]] = [("all", ALL)] + [(str(v), v) for v in versions]
            if current != ALL and current not in versions:
                options.append((str(current), current))
            if options != list(self.version.options):
                self.version.options = options
                self.version.value = current
            prompts = list(dict.fromkeys(str(e.get("prompt")) for e in reversed(self._pool)))[:100]
            selected = self.prompt.value
            labels = [(p if len(p) <= 80 else p[:80] + " ...", p) for p in prompts]
            if labels != list(self.prompt.options):
                self.prompt.options = labels
                self.prompt.value = selected if selected in prompts else (prompts[0] if prompts else None)
        finally:
            self._updating = False
        self._compare()

    def _compare(self) -> None:
        self.compare.value = render_compare(self._pool, self.prompt.value)

    def tick(self, visible: bool = True) -> None:
        """On the poll tick: refresh when shown, following, and the run's version moved."""
        if visible and self.follow.value and getattr(self.run, "version", None) != self._seen_version:
            self.refresh()
