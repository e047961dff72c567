"""Controls: start / pause / resume / step N / stop buttons and inputs for the run's hot hyperparameters.

The buttons call the same methods of the Run that the magics call (``run.start()``, ``run.pause()``,
``run.resume()``, ``await run.step(n)``, ``await run.stop()``); coroutines are awaited in tasks the
dashboard owns (:class:`LoopCaller`). The inputs mirror ``run.hparams``; *apply* sends the edited
ones with ``run.set(**changes)``, which the run applies at the next step boundary. A value changed
elsewhere (a magic) updates its input unless the user is editing it. Errors show in the dashboard.
"""

from __future__ import annotations

import html
from typing import Any

import ipywidgets as w

from forge_nb.widgets._calls import LoopCaller
from forge_nb.widgets._errors import ErrorLog

ACTIONS = ("start", "pause", "resume", "step", "stop")
ICONS = {"start": "play", "pause": "pause", "resume": "play-circle", "step": "step-forward", "stop": "stop"}


def read_hparams(run: Any) -> dict[str, Any]:
    hparams = getattr(run, "hparams", None)
    if callable(hparams):
        hparams = hparams()
    return dict(hparams or {})


def run_summary(run: Any) -> dict[str, Any]:
    """name, state, step, version and error of a run (each None when the run lacks it)."""
    return {"name": getattr(run, "name", None), "state": getattr(run, "state", None),
            "step": getattr(run, "current_step", None), "version": getattr(run, "version", None),
            "error": getattr(run, "error", None)}


def render_status(s: dict[str, Any]) -> str:
    colors = {"running": "#2ca02c", "paused": "#ff7f0e", "failed": "#d62728", "stopped": "#7f7f7f"}
    state = str(s["state"])
    out = (f"<span class='forge-run-status' data-state='{html.escape(state)}'><b>{html.escape(str(s['name']))}"
           f"</b> <span style='background:{colors.get(state, '#1f77b4')};color:white;padding:1px 6px;"
           f"border-radius:3px'>{html.escape(state)}</span> step <b>{s['step']}</b> &middot; "
           f"version <b>{s['version']}</b></span>")
    if s["error"]:
        out += f"<div style='color:#b00020'>error: {html.escape(str(s['error']))}</div>"
    return out


class Controls:
    """Buttons and hyperparameter inputs; ``refresh()`` re-reads the run's state and hparams."""

    def __init__(self, run: Any, caller: LoopCaller, errors: ErrorLog):
        self.run = run
        self._caller = caller
        self._errors = errors
        self.status = w.HTML(render_status(run_summary(run)))
        self.buttons = {a: w.Button(description=a, icon=ICONS[a], layout=w.Layout(width="90px"),
                                    tooltip=f"run.{a}()") for a in ACTIONS}
        self.step_n = w.BoundedIntText(value=1, min=1, max=1_000_000, layout=w.Layout(width="70px"),
                                       tooltip="steps for the step button")
        for action, button in self.buttons.items():
            button.add_class(f"forge-{action}")
            button.on_click(errors.guard(f"{action} button")(self._clicked(action)))
        self.message = w.HTML()
        self.apply = w.Button(description="apply", icon="check", tooltip="run.set(**edited values)")
        self.apply.on_click(errors.guard("apply button")(lambda _: self.apply_changes()))
        self.inputs: dict[str, w.ValueWidget] = {}
        self._seen: dict[str, Any] = {}
        self.hparams_box = w.HBox(layout=w.Layout(flex_flow="row wrap"))
        self._build_inputs(read_hparams(run))
        b = self.buttons
        row = w.HBox([b["start"], b["pause"], b["resume"], b["step"], self.step_n, b["stop"], self.message])
        self.widget = w.VBox([self.status, row, self.hparams_box])

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
        return {k: inp.value for k, inp in self.inputs.items() if inp.value != self._seen.get(k)}

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
        self.buttons["pause"].disabled = state in ("paused", "stopping", "stopped", "failed")
        self.buttons["resume"].disabled = state != "paused"
        self.buttons["stop"].disabled = state in ("stopping", "stopped")
        hparams = read_hparams(self.run)
        if set(hparams) != set(self.inputs):
            self._build_inputs(hparams)
            return
        for k, v in hparams.items():
            if v != self._seen.get(k):
                if self.inputs[k].value == self._seen.get(k):  # not being edited: follow the run
                    self.inputs[k].value = v
                self._seen[k] = v


def _input(name: str, value: Any) -> w.ValueWidget:
    layout = w.Layout(width="210px")
    style = {"description_width": "90px"}
    if isinstance(value, bool):
        return w.Checkbox(value=value, description=name, layout=layout, style=style)
    if isinstance(value, int):
        return w.IntText(value=value, description=name, layout=layout, style=style)
    if isinstance(value, float):
        return w.FloatText(value=value, description=name, layout=layout, style=style)
    return w.Text(value=str(value), description=name, layout=layout, style=style)
