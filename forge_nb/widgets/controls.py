"""Controls: start / pause / resume / step N / stop buttons and inputs for the run's hot hyperparameters.

The buttons call the same methods of the Run that the magics call (``run.start()``, ``run.pause()``,
``run.resume()``, ``await run.step(n)``, ``await run.stop()``); coroutines are awaited in tasks the
dashboard owns (:class:`LoopCaller`). The inputs mirror ``run.hparams``; *apply* sends the edited
ones with ``run.set(**changes)``, which the run applies at the next step boundary. A value changed
elsewhere (a magic) updates its input unless the user is editing it. Errors show in the dashboard.
"""

from __future__ import annotations

import ast
import html
from typing import Any

import ipywidgets as w

from forge_nb.controller.state import RunState
from forge_nb.widgets._shared.calls import LoopCaller
from forge_nb.widgets._shared.errors import ErrorLog
from forge_nb.widgets._shared.run import RunView

ACTIONS = ("start", "pause", "resume", "step", "stop")
ICONS = {"start": "play", "pause": "pause", "resume": "play-circle", "step": "step-forward", "stop": "stop"}
#: The run state badge's colour; each state has its own ("shut down" is not "ready").
STATE_COLORS = {RunState.READY: "#1f77b4", RunState.RUNNING: "#2ca02c", RunState.PAUSED: "#ff7f0e",
                RunState.STOPPED: "#7f7f7f", RunState.FAILED: "#d62728", RunState.SHUT_DOWN: "#262626"}
_FIT = {"width": "auto", "flex": "0 0 auto"}  # a button's Layout: its label's width, never squeezed
#: States in which no control can act any more: every button and input is disabled.
FINAL_STATES = (RunState.SHUT_DOWN,)


def read_hparams(run: RunView) -> dict[str, Any]:
    hparams = getattr(run, "hparams", None)
    if callable(hparams):
        hparams = hparams()
    return dict(hparams or {})


def run_summary(run: RunView) -> dict[str, Any]:
    """name, state, step, version and error of a run (each None when the run lacks it)."""
    endpoint = getattr(run, "openai", None)
    return {"name": getattr(run, "name", None), "state": getattr(run, "state", None),
            "step": getattr(run, "current_step", None), "version": getattr(run, "version", None),
            "error": getattr(run, "error", None),
            "openai": endpoint.status() if endpoint is not None and endpoint.serving else None}


def render_status(s: dict[str, Any]) -> str:
    state = str(s["state"])
    out = (f"<span class='forge-run-status' data-state='{html.escape(state)}'><b>{html.escape(str(s['name']))}"
           f"</b> <span class='forge-state-badge' style='background:{STATE_COLORS.get(state, '#9467bd')};"
           "color:white;padding:1px 6px;"
           f"border-radius:3px'>{html.escape(state)}</span> step <b>{s['step']}</b> &middot; "
           f"version <b>{s['version']}</b></span>")
    if s.get("openai"):
        o = s["openai"]
        out += (f"<div class='forge-openai' style='color:#555'>OpenAI endpoint <code>{html.escape(o['url'])}</code> "
                f"&middot; model <code>{html.escape(str(o['model']))}</code> &middot; {o['requests']} requests, "
                f"{o['errors']} errors</div>")
    if s["error"]:
        out += f"<div style='color:#b00020'>error: {html.escape(str(s['error']))}</div>"
    return out


class Controls:
    """Buttons and hyperparameter inputs; ``refresh()`` re-reads the run's state and hparams."""

    def __init__(self, run: RunView, caller: LoopCaller, errors: ErrorLog):
        self.run = run
        self._caller = caller
        self._errors = errors
        self.status = w.HTML(render_status(run_summary(run)))
        # Buttons as wide as their labels and rows that wrap: the dashboard is read in a panel beside the
        # notebook, often 500-700 px wide, where fixed widths cut labels ("pa...") and inputs.
        self.buttons = {a: w.Button(description=a, icon=ICONS[a], layout=_FIT, tooltip=f"run.{a}()")
                        for a in ACTIONS}
        self.step_n = w.BoundedIntText(value=1, min=1, max=1_000_000, layout=w.Layout(width="70px"),
                                       tooltip="steps for the step button")
        for action, button in self.buttons.items():
            button.add_class(f"forge-{action}")
            button.on_click(errors.guard(f"{action} button")(self._clicked(action)))
        self.message = w.HTML()
        self.apply = w.Button(description="apply", icon="check", tooltip="run.set(**edited values)", layout=_FIT)
        self.apply.on_click(errors.guard("apply button")(lambda _: self.apply_changes()))
        self.inputs: dict[str, w.ValueWidget] = {}
        self._seen: dict[str, Any] = {}
        self.hparams_box = w.HBox(layout=w.Layout(flex_flow="row wrap"))
        self._build_inputs(read_hparams(run))
        b = self.buttons
        row = w.HBox([b["start"], b["pause"], b["resume"], b["step"], self.step_n, b["stop"]],
                     layout=w.Layout(flex_flow="row wrap"))
        self.widget = w.VBox([self.status, row, self.message, self.hparams_box])

    def _clicked(self, action: str) -> Any:
        def handler(_: Any) -> None:
            method = getattr(self.run, action)
            args = (int(self.step_n.value),) if action == "step" else ()
            self.message.value = f"<i>run.{action}({', '.join(map(str, args))})</i>"
            self._caller.call(f"run.{action}", method, *args)

        return handler

    def _build_inputs(self, hparams: dict[str, Any]) -> None:
        self.inputs = {k: _input(k, v) for k, v in hparams.items()}
        self._seen = dict(hparams)
        children: list[w.Widget] = list(self.inputs.values())
        if children:
            children.append(self.apply)
        self.hparams_box.children = tuple(children)

    def edited(self) -> dict[str, Any]:
        """Inputs whose value differs from the run's last known value."""
        read = {k: _read(inp, self._seen.get(k)) for k, inp in self.inputs.items()}
        return {k: v for k, v in read.items() if v != self._seen.get(k)}

    def apply_changes(self) -> None:
        changes = self.edited()
        if not changes:
            self.message.value = "<i>no hyperparameter was edited</i>"
            return
        self.message.value = "<i>run.set(" + html.escape(", ".join(f"{k}={v!r}" for k, v in changes.items())) \
            + "): applied at the next step boundary</i>"
        self._caller.call("run.set", self.run.set, **changes)

    def refresh(self) -> None:
        summary = run_summary(self.run)
        value = render_status(summary)
        if value != self.status.value:
            self.status.value = value
        state = summary["state"]
        final = state in FINAL_STATES
        for action, button in self.buttons.items():
            button.disabled = final or {
                "pause": state in (RunState.PAUSED, RunState.STOPPED, RunState.FAILED),
                "resume": state != RunState.PAUSED,
                "stop": state == RunState.STOPPED,
            }.get(action, False)
        self.step_n.disabled = self.apply.disabled = final
        if final:
            self.message.value = "<i>the run is shut down: spawn a new one to train again</i>"
            for inp in self.inputs.values():
                inp.disabled = True
            return
        hparams = read_hparams(self.run)
        if set(hparams) != set(self.inputs):
            self._build_inputs(hparams)
            return
        for k, v in hparams.items():
            seen = self._seen.get(k)
            if v != seen:
                if _read(self.inputs[k], seen) == seen:  # not being edited: follow the run
                    self.inputs[k].value = _shown(self.inputs[k], v)
                self._seen[k] = v


def _input(name: str, value: Any) -> w.ValueWidget:
    # The label as wide as its name needs ("max_policy_age" was cut at a fixed 90px); 7.5px a character
    # is the width of JupyterLab's 13px UI font, with room for the label's padding.
    label = max(60, round(7.5 * len(name)) + 12)
    field = 110 if isinstance(value, bool | int | float) else max(110, round(7.5 * len(shown_text(value))) + 24)
    layout = w.Layout(width=f"{label + field}px")
    style = {"description_width": f"{label}px"}
    if isinstance(value, bool):
        return w.Checkbox(value=value, description=name, layout=layout, style=style)
    if isinstance(value, int):
        return w.IntText(value=value, description=name, layout=layout, style=style)
    if isinstance(value, float):
        return w.FloatText(value=value, description=name, layout=layout, style=style)
    # None ("unset", e.g. norm_len) and other values: text, read back as a Python literal by _read
    return w.Text(value=_shown(None, value), placeholder="None", description=name, layout=layout, style=style)


def _shown(inp: w.ValueWidget | None, value: Any) -> Any:
    """What an input shows for ``value``."""
    return shown_text(value) if inp is None or isinstance(inp, w.Text) else value


def shown_text(value: Any) -> str:
    """A hyperparameter in a text input: None (unset) as empty."""
    return "" if value is None else str(value)


def _read(inp: w.ValueWidget, seen: Any) -> Any:
    """An input's value as the run takes it (text parsed by :func:`parse_text`)."""
    return parse_text(inp.value, seen) if isinstance(inp, w.Text) else inp.value


def parse_text(value: str, seen: Any) -> Any:
    """A text input's value for a hyperparameter whose last value was ``seen``: text for a string one,
    else a Python literal ("" and "None" as None, "512" as 512); what is no literal stays text, for
    run.set to judge and explain."""
    if isinstance(seen, str):
        return value
    text = value.strip()
    if text in ("", "None"):
        return None
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text
