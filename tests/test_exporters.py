"""Metric export to TensorBoard and trackio from a real MetricsStore, read back with each backend's reader."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from forge_nb.metrics import MetricsStore
from forge_nb.metrics.exporters import export


def test_tensorboard_gets_the_history_then_live_rows_and_events(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    store = MetricsStore()
    store.record(1, {"loss": 1.5, "reward/mean": 0.1})
    exporter = export(store, "tensorboard", run_dir=tmp_path, run_name="r", config={})
    store.record(2, {"loss": 1.0, "reward/mean": 0.4})
    store.event("set", step=2, changes={"lr": 1e-3})
    exporter.close()
    store.record(3, {"loss": 0.5})  # after close(): not exported

    acc = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"tensors": 0, "scalars": 0}).Reload()
    assert [(e.step, e.value) for e in acc.Scalars("loss")] == [(1, 1.5), (2, 1.0)]
    assert [e.step for e in acc.Scalars("reward/mean")] == [1, 2]
    (text,) = acc.Tensors("events/text_summary")
    assert json.loads(text.tensor_proto.string_val[0])["changes"] == {"lr": 1e-3} and text.step == 2


def test_trackio_gets_each_step_and_event_counts(tmp_path):
    script = textwrap.dedent("""
        from forge_nb.metrics.exporters import export
        from forge_nb.metrics import MetricsStore
        store = MetricsStore()
        store.record(1, {"loss": 2.0})
        exporter = export(store, "trackio", run_dir=None, run_name="mine", config={"lr": 0.1})
        store.event("skip", step=1, reason="nonfinite_loss")
        store.record(2, {"loss": 1.0})
        exporter.close()
        from trackio.sqlite_storage import SQLiteStorage
        import json
        logs = [{k: v for k, v in r.items() if k != "timestamp"} for r in SQLiteStorage.get_logs("forge_nb", "mine")]
        print("LOGS " + json.dumps(logs))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={"TRACKIO_DIR": str(tmp_path), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-2000:]
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("LOGS ")]
    logs = json.loads(line[5:])
    assert logs == [{"loss": 2.0, "step": 1}, {"events/skip": 1.0, "step": 1}, {"loss": 1.0, "step": 2}]


def test_unknown_exporter_or_option_says_what_is_accepted(tmp_path):
    store = MetricsStore()
    with pytest.raises(ValueError, match=r"choose one of \['tensorboard', 'trackio', 'wandb'\]"):
        export(store, "mlflow", run_dir=tmp_path, run_name="r", config={})
    with pytest.raises(ValueError, match="takes log_dir"):
        export(store, "tensorboard", run_dir=tmp_path, run_name="r", config={}, flush_secs=3)
    assert store._observers == []  # nothing half-attached


def test_wandb_offline_run_holds_the_logged_history(tmp_path):
    """wandb writes offline runs in its own binary log; its Python reader is gone in 0.31, so this looks
    for the logged keys in the file, which holds nothing else of this run's but its config."""
    script = textwrap.dedent(f"""
        from forge_nb.metrics.exporters import export
        from forge_nb.metrics import MetricsStore
        store = MetricsStore()
        exporter = export(store, "wandb", run_dir=None, run_name="mine", config={{"lr": 0.1}},
                          mode="offline", dir={str(tmp_path)!r})
        store.record(1, {{"loss_of_a_test": 2.0}})
        store.event("quarantine", step=1, reason="reward returned NaN")
        exporter.close()
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "WANDB_SILENT": "true"})
    assert done.returncode == 0, done.stderr[-2000:]
    (log,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    data = log.read_bytes()
    assert b"loss_of_a_test" in data and b"events/quarantine" in data


def test_a_backend_that_cannot_be_imported_says_what_to_install():
    script = ("import sys; sys.modules['trackio'] = None\n"  # as if trackio were not installed
              "from forge_nb.metrics.exporters import export\nfrom forge_nb.metrics import MetricsStore\n"
              "export(MetricsStore(), 'trackio', run_dir=None, run_name='r', config={})")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "ImportError: exporting metrics to trackio needs" in done.stderr
    assert "pip install trackio" in done.stderr
