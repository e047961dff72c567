"""Optional export of a run's metrics to TensorBoard, trackio or Weights & Biases.

::

    run.export("tensorboard")                      # event files under <run_dir>/tensorboard
    run.export("trackio", project="forge_nb")      # trackio's local database (TRACKIO_DIR)
    run.export("wandb", project="forge_nb", mode="offline")

An exporter is a ``MetricsStore`` observer: each step's row is logged at its step (history first, so an
exporter attached mid-run has the whole curve), and each event as text where the backend keeps text
(TensorBoard) or as a ``events/<kind>`` count otherwise. The backends are optional packages, imported
only here; a missing one is an ImportError that says what to install. ``run.shutdown()`` closes them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from forge_nb.metrics import MetricsStore, Row
from forge_nb.system.importpath import require

__all__ = ["EXPORTERS", "Exporter", "export"]


class Exporter:
    """Feeds a MetricsStore's rows to one backend until ``close()``."""

    def __init__(self, store: MetricsStore):
        self._events: dict[str, int] = {}
        self._unsubscribe = store.subscribe(self._observe, replay=True)

    def _observe(self, kind: str, row: Row) -> None:
        if kind == "step":
            values = {k: v for k, v in row.items() if k not in ("step", "time")}
            self.log_values(int(row["step"]), values)
        else:
            self._events[row["kind"]] = self._events.get(row["kind"], 0) + 1
            self.log_event(int(row.get("step") or 0), row)

    def log_values(self, step: int, values: dict[str, float]) -> None:
        raise NotImplementedError

    def log_event(self, step: int, event: Row) -> None:
        """Default: a running count per kind, for backends without text."""
        self.log_values(step, {f"events/{event['kind']}": float(self._events[event["kind"]])})

    def close(self) -> None:
        self._unsubscribe()


class TensorBoardExporter(Exporter):
    """``torch.utils.tensorboard.SummaryWriter``: scalars per metric, events as text under ``events``."""

    def __init__(self, store: MetricsStore, log_dir: str | Path):
        writer_cls = _require("torch.utils.tensorboard", "tensorboard").SummaryWriter
        self.log_dir = Path(log_dir)
        self._writer = writer_cls(log_dir=str(self.log_dir))
        super().__init__(store)

    def log_values(self, step: int, values: dict[str, float]) -> None:
        for name, value in values.items():
            self._writer.add_scalar(name, value, step)

    def log_event(self, step: int, event: Row) -> None:
        self._writer.add_text("events", json.dumps(event, default=str), step)

    def close(self) -> None:
        super().close()
        self._writer.close()


class TrackerExporter(Exporter):
    """trackio or wandb, which share an API: ``init(project=, name=, config=)``, ``log(values, step=)``,
    ``finish()``."""

    def __init__(self, store: MetricsStore, backend: str, *, project: str, name: str,
                 config: dict[str, Any], **init_args: Any):
        module = _require(backend, backend)
        self.backend = backend
        self._run = module.init(project=project, name=name, config=config, **init_args)
        super().__init__(store)

    def log_values(self, step: int, values: dict[str, float]) -> None:
        self._run.log(values, step=step)

    def close(self) -> None:
        super().close()
        self._run.finish()


EXPORTERS = ("tensorboard", "trackio", "wandb")


def export(store: MetricsStore, kind: str, *, run_dir: Path | None, run_name: str,
           config: dict[str, Any], **options: Any) -> Exporter:
    """An exporter of ``store`` to ``kind`` (one of EXPORTERS); see the module docstring for options."""
    if kind == "tensorboard":
        log_dir = options.pop("log_dir", None) or (run_dir / "tensorboard" if run_dir else None)
        if log_dir is None or options:
            raise ValueError(f"export('tensorboard'): takes log_dir=... only (got {sorted(options) or 'none'})")
        return TensorBoardExporter(store, log_dir)
    if kind in ("trackio", "wandb"):
        options.setdefault("project", "forge_nb")
        options.setdefault("name", run_name)
        return TrackerExporter(store, kind, config=config, **options)
    raise ValueError(f"export({kind!r}): unknown exporter; choose one of {list(EXPORTERS)}")


def _require(module: str, package: str) -> Any:
    return require(module, missing=f"exporting metrics to {package} needs the {package!r} package: "
                                   f"pip install {package} ")
