"""MetricsStore: rows and events, observers that cannot break the run, files that survive a restart."""

from __future__ import annotations

import math

import pytest

from forge_nb.metrics import MetricsStore, summarize


def test_rows_events_and_frames():
    store = MetricsStore()
    store.record(1, {"loss": 0.5, "reward/mean": 0.1, "note": "dropped", "flag": True})
    store.record(2, {"loss": float("nan"), "reward/mean": 0.3})
    store.event("set", changes={"lr": 1e-4})
    assert store.step == 2 and store.last("reward/mean") == 0.3 and math.isnan(store.last("loss"))
    assert store.series("reward/mean") == ([1, 2], [0.1, 0.3])
    assert store.names() == ["loss", "reward/mean"]
    df = store.frame()
    assert list(df.index) == [1, 2] and "note" not in df.columns and "flag" not in df.columns
    assert store.events_frame("set").iloc[0]["step"] == 2


def test_a_failing_observer_is_recorded_and_the_others_still_hear():
    store = MetricsStore()
    heard = []

    def broken(kind, row):
        raise KeyError("widget bug")

    store.subscribe(broken)
    store.subscribe(lambda kind, row: heard.append((kind, row["step"])))
    store.record(1, {"loss": 1.0})
    assert heard == [("step", 1)]
    assert len(store.observer_errors) == 1 and "widget bug" in store.observer_errors[0]


def test_replay_and_unsubscribe():
    store = MetricsStore()
    store.record(1, {"a": 1})
    store.event("state", state="running")
    seen = []
    unsubscribe = store.subscribe(lambda kind, row: seen.append(kind), replay=True)
    assert seen == ["step", "event"]
    unsubscribe()
    store.record(2, {"a": 2})
    assert seen == ["step", "event"]


def test_history_survives_in_the_run_directory(tmp_path):
    store = MetricsStore(tmp_path)
    for step in range(1, 4):
        store.record(step, {"loss": 1.0 / step})
    store.event("checkpoint", path="x")
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 4, "lo')  # a line cut by a crash mid-write
    again = MetricsStore(tmp_path)
    assert [r["step"] for r in again.rows] == [1, 2, 3] and again.events[0]["kind"] == "checkpoint"


def test_summarize():
    assert summarize([], "r") == {}
    s = summarize([0.0, 1.0], "r")
    assert s == {"r/mean": 0.5, "r/std": 0.5, "r/min": 0.0, "r/max": 1.0}


def test_events_are_bounded_in_memory_and_on_disk(tmp_path, monkeypatch):
    from forge_nb import metrics

    monkeypatch.setattr(metrics, "MAX_EVENTS", 100)
    monkeypatch.setattr(metrics, "MAX_EVENTS_BYTES", 20_000)
    store = metrics.MetricsStore(tmp_path)
    for i in range(1000):
        store.event("replica", n=i, reason="x" * 50)
    assert 50 <= len(store.events) <= 100 and store.events[-1]["n"] == 999  # the newest are kept
    current, older = tmp_path / "events.jsonl", tmp_path / "events.jsonl.1"
    assert current.stat().st_size <= 20_000 + 200 and older.stat().st_size <= 20_000 + 200
    assert '"n": 999' in current.read_text()


def test_rows_beyond_the_last_ones_leave_memory_and_read_back_from_the_file(tmp_path):
    store = MetricsStore(tmp_path, keep_rows=50)
    expected = [store.record(step, {"loss": step / 10, "nan": math.nan if step % 7 == 0 else step}) for step in
                range(1, 1001)]
    rows = store.rows
    assert len(rows) == 1000 and rows.in_memory == 50  # the kernel holds 50 rows, not 1000
    assert rows[0]["loss"] == 0.1 and rows[-1]["step"] == 1000 and rows[499]["step"] == 500
    assert [r["step"] for r in rows[10:13]] == [11, 12, 13] and [r["step"] for r in rows[-3:]] == [998, 999, 1000]
    assert [r["step"] for r in rows] == list(range(1, 1001)) and next(reversed(rows))["step"] == 1000
    assert math.isnan(rows[6]["nan"]) and rows[7]["nan"] == 8  # NaN is kept as NaN, read back from the file too
    assert [r["step"] for r in rows] == [r["step"] for r in expected]
    assert store.series("loss")[1][:3] == [0.1, 0.2, 0.3] and store.frame().shape[0] == 1000
    with pytest.raises(IndexError):
        rows[1000]
    again = MetricsStore(tmp_path, keep_rows=50)  # resumed: the same rows, the same 50 in memory
    assert len(again.rows) == 1000 and again.rows.in_memory == 50 and again.rows[3]["step"] == 4
    assert again.record(1001, {"loss": 0.0})["step"] == 1001 and again.rows[-2]["step"] == 1000


def test_rows_a_full_disk_keeps_back_stay_in_memory_until_written(tmp_path, monkeypatch):
    store = MetricsStore(tmp_path, keep_rows=5)
    for step in range(1, 11):
        store.record(step, {"loss": 1.0})
    monkeypatch.setattr(store, "_write", lambda name, waiting: False)  # as a full disk answers
    for step in range(11, 31):
        store.record(step, {"loss": 2.0})
    # the 20 rows the file lacks stay in memory, beyond the last 5
    assert store.rows.in_memory == 20 and [r["step"] for r in store.rows][-21:] == list(range(10, 31))
    monkeypatch.undo()
    store.record(31, {"loss": 3.0})  # space is back: what waited goes to the file, then leaves memory
    assert store.rows.in_memory == 5 and [r["step"] for r in store.rows] == list(range(1, 32))
    assert [r["step"] for r in MetricsStore(tmp_path).rows] == list(range(1, 32))
