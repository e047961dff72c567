"""Execute an example notebook headless and keep what it made.

    .venv/bin/python scripts/run_notebook.py example_notebooks/01_quickstart.py [--outputs outputs] [--steps N]

The notebook sources are percent-format Python (``# %%`` starts a code cell, ``# %% [markdown]`` a
markdown cell whose lines start with ``# ``). This script turns one into an .ipynb, runs it in a real
kernel (nbclient), and writes to the outputs folder: the executed notebook, an HTML report with the
training curves (self-contained: plotly is inlined), and the run directory. It prints where they are
and the final reward. ``--steps`` is the small budget the tests use; notebooks read it as
``FORGE_NB_STEPS``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

import nbformat


def to_notebook(source: str) -> nbformat.NotebookNode:
    """Percent-format Python -> a notebook (the first block before any marker is a code cell)."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    for block in re.split(r"^# %%", source, flags=re.M):
        if not block.strip():
            continue
        header, _, body = block.partition("\n")
        if "[markdown]" in header:
            text = "\n".join(line[2:] if line.startswith("# ") else line.lstrip("#") for line in body.splitlines())
            nb.cells.append(nbformat.v4.new_markdown_cell(text.strip()))
        else:
            nb.cells.append(nbformat.v4.new_code_cell(body.strip()))
    return nb


def execute(path: Path, outputs: Path, steps: int | None, timeout: int = 1800) -> dict[str, object]:
    from nbclient import NotebookClient

    outputs.mkdir(parents=True, exist_ok=True)
    run_dir = (outputs / f"{path.stem}-run").resolve()
    os.environ["FORGE_NB_RUN_DIR"] = str(run_dir)
    if steps is not None:
        os.environ["FORGE_NB_STEPS"] = str(steps)
    nb = to_notebook(path.read_text())
    start = time.time()
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": os.getcwd()}})
    try:
        client.execute()
    finally:
        executed = outputs / f"{path.stem}.ipynb"
        nbformat.write(nb, executed)
    report = write_report(run_dir, outputs / f"{path.stem}-report.html", title=path.stem)
    final = _final_reward(run_dir)
    return {"notebook": str(executed), "report": str(report) if report else None, "run_dir": str(run_dir),
            "final_reward": final, "seconds": round(time.time() - start, 1)}


def _rows(run_dir: Path) -> list[dict[str, float]]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _final_reward(run_dir: Path, last: int = 10) -> float | None:
    values = [r["reward/mean"] for r in _rows(run_dir) if "reward/mean" in r][-last:]
    return round(sum(values) / len(values), 4) if values else None


def write_report(run_dir: Path, out: Path, title: str) -> Path | None:
    """A self-contained HTML page with the run's curves (None if the run recorded no step)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    rows = _rows(run_dir)
    if not rows:
        return None
    panels = [("reward/mean", "reward"), ("loss", "loss"), ("entropy", "entropy"), ("grad_norm", "grad norm"),
              ("tokens_per_s/generate", "generated tokens/s"), ("weight_sync_s", "weight sync (s)")]
    fig = make_subplots(rows=3, cols=2, subplot_titles=[t for _, t in panels])
    for i, (key, label) in enumerate(panels):
        pts = [(r["step"], r[key]) for r in rows if key in r]
        r, c = divmod(i, 2)
        if key == "reward/mean":
            band = [(r_["step"], r_["reward/min"], r_["reward/max"]) for r_ in rows if "reward/min" in r_]
            fig.add_trace(go.Scatter(x=[b[0] for b in band], y=[b[2] for b in band], line={"width": 0},
                                     showlegend=False), row=1, col=1)
            fig.add_trace(go.Scatter(x=[b[0] for b in band], y=[b[1] for b in band], fill="tonexty",
                                     line={"width": 0}, name="reward min/max"), row=1, col=1)
        fig.add_trace(go.Scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], name=label), row=r + 1, col=c + 1)
    fig.update_layout(title=f"forge_nb: {title} ({len(rows)} steps)", height=900, showlegend=False)
    fig.write_html(out, include_plotlyjs=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("notebook", type=Path)
    ap.add_argument("--outputs", type=Path, default=Path("outputs"))
    ap.add_argument("--steps", type=int, default=None)
    args = ap.parse_args()
    result = execute(args.notebook, args.outputs, args.steps)
    print(f"executed notebook: {result['notebook']}")
    print(f"report:            {result['report']}")
    print(f"run directory:     {result['run_dir']}")
    print(f"final reward:      {result['final_reward']} (mean of the last 10 steps) in {result['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
