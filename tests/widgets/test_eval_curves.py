"""The dashboard's mismatch panels and its evaluation lines, fed as a run feeds them (rows, then "eval" events)."""

from __future__ import annotations

from forge_nb.widgets._shared.series import EVALS, PANELS, CurveData


def test_mismatch_rows_and_eval_events_become_their_panels_lines() -> None:
    data = CurveData()
    titles = {p.title: p.metrics for p in PANELS}
    assert titles["mismatch KL (generator vs trainer)"] == ("mismatch/kl", "mismatch/kl_same_version")
    data.add_row({"step": 1, "mismatch/kl": 0.01, "mismatch/ratio_p99": 1.3})
    data.add_event({"kind": "eval", "step": 1, "version": 1, "k": 4, "eval/avg@4": 0.5, "eval/pass@4": 0.75})
    data.add_event({"kind": "eval", "step": 9, "version": 9, "k": 4, "eval/avg@4": 0.9, "eval/pass@4": 1.0})
    new, changed, _, _ = data.take()
    evals = {data.traces[i].key: data.traces[i] for i in new}
    assert set(evals) == {"eval/avg@4", "eval/pass@4"} and all(t.panel == EVALS for t in evals.values())
    assert evals["eval/avg@4"].x.view().tolist() == [1, 9] and evals["eval/avg@4"].y.view().tolist() == [0.5, 0.9]
    kl = data.traces[data._index["mismatch/kl"]]
    assert kl.y.view().tolist() == [0.01] and data._index["mismatch/kl"] in changed
    assert not data.marks  # an evaluation is a curve, not a mark


def test_a_tinker_steps_mean_advantage_is_drawn_in_the_reward_panel() -> None:
    # a step taken through the Tinker API has no reward; its row carries the Datums' mean advantage
    from forge_nb.widgets.curves import _style

    data = CurveData()
    data.add_row({"step": 1, "reward/mean": 0.25, "loss": 0.5})
    data.add_row({"step": 2, "source/tinker": 1.0, "advantages/mean": -0.125, "loss": 0.4})
    trace = data.traces[data._index["advantages/mean"]]
    assert trace.panel == 0 and PANELS[0].title == "reward"
    assert trace.x.view().tolist() == [2] and trace.y.view().tolist() == [-0.125]
    assert _style(trace, 1)["name"] == "mean advantage (Tinker steps)" and _style(trace, 1)["dash"]
