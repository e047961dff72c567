"""Execute an example notebook headless and keep what it made.

    .venv/bin/python scripts/run_notebook.py example_notebooks/01_quickstart.py [--outputs outputs] [--steps N]

The notebook sources are percent-format Python (``# %%`` starts a code cell, ``# %% [markdown]`` a
markdown cell), read with jupytext, as JupyterLab reads them. This script turns one into a notebook,
runs it in a real kernel (nbclient) and writes to the outputs folder: the executed notebook, the same as
HTML (nbconvert), an HTML report with the training curves (self-contained: plotly is inlined), and the run
directories. It prints where they are and the final reward.

The executed notebook's dashboards show offline as their static snapshots (``forge_nb.widgets.snapshot``):
the kernel replaced each one at the end of every cell, so it holds the curves and the run's state as the
last cell left them. The widget state is kept too (with a network, nbconvert's page draws the live widgets
from a CDN and their stylesheet hides the snapshots); serving a widget renderer from the package instead
would mean shipping ipywidgets' HTML manager and every anywidget module inside each page.

The notebooks carry no test plumbing. Their budget is a cell tagged ``parameters`` (``STEPS = 250``);
``--steps N`` adds a cell after it that sets ``STEPS = N``, as papermill does. The kernel works in a
fresh folder, ``<outputs>/<notebook>-work/``, that links to what sits beside the notebook (its ``data/``),
so the runs' directories (``runs/<name>-<time>/``) land there and nowhere else.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import jupytext
import nbformat


def to_notebook(source: str) -> nbformat.NotebookNode:
    """Percent-format Python -> a notebook, as jupytext reads it in JupyterLab (magics stay magics)."""
    nb = jupytext.reads(source, fmt="py:percent")
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


def inject_parameters(nb: nbformat.NotebookNode, **values: Any) -> nbformat.NotebookNode:
    """Add a cell setting ``values`` after the cell tagged ``parameters`` (papermill's convention).

    Raises ValueError when the notebook has no such cell or the cell does not assign a given name,
    so that a renamed parameter cannot be silently ignored."""
    tagged = [i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", [])]
    if len(tagged) != 1:
        raise ValueError(f"the notebook has {len(tagged)} cells tagged 'parameters'; tag exactly one "
                         "(`# %% tags=[\"parameters\"]`) to run it with other values")
    cell = nb.cells[tagged[0]]
    assigned = {line.split("=", 1)[0].strip() for line in cell.source.splitlines() if "=" in line}
    unknown = sorted(set(values) - assigned)
    if unknown:
        raise ValueError(f"parameters {unknown} are not set in the notebook's parameters cell "
                         f"({cell.source!r}); use one of {sorted(assigned)}")
    source = "# injected by scripts/run_notebook.py\n" + "\n".join(f"{k} = {v!r}" for k, v in values.items())
    injected = nbformat.v4.new_code_cell(source, metadata={"tags": ["injected-parameters"]})
    nb.cells.insert(tagged[0] + 1, injected)
    return nb


def workdir(notebook: Path, outputs: Path) -> Path:
    """A fresh folder for the kernel, with links to the files beside the notebook that are not notebooks, nor the
    folder that holds ``outputs`` (a link to it would be a loop: ``out/nb-work/out/nb-work/...``)."""
    work = (outputs / f"{notebook.stem}-work").resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    for sibling in notebook.resolve().parent.iterdir():
        if sibling.suffix != ".py" and sibling.name not in ("runs", ".ipynb_checkpoints", "__pycache__") \
                and not work.is_relative_to(sibling.resolve()):
            (work / sibling.name).symlink_to(sibling)
    return work


def execute(path: Path, outputs: Path, steps: int | None, timeout: int = 1800) -> dict[str, Any]:
    from jupyter_client.manager import KernelManager
    from nbclient import NotebookClient

    outputs.mkdir(parents=True, exist_ok=True)
    work = workdir(path, outputs)
    nb = to_notebook(path.read_text())
    if steps is not None:
        inject_parameters(nb, STEPS=steps)
    start = time.time()
    # The kernel talks to this process over local sockets (IPC), not TCP: nothing else needs to reach it, and
    # over TCP ipykernel warns on every run that the channel is unencrypted. The sockets' path is absolute
    # (the kernel runs in ``work``) and short (a Unix socket's path has at most 107 bytes).
    sockets = Path(tempfile.mkdtemp(prefix="forge-nb-kernel-"))
    km = KernelManager(kernel_name="python3", transport="ipc", ip=str(sockets / "k"))
    client = NotebookClient(nb, km=km, timeout=timeout, resources={"metadata": {"path": str(work)}})
    try:
        client.execute()
    finally:
        executed = outputs / f"{path.stem}.ipynb"
        nbformat.write(nb, executed)
        to_html(nb, outputs / f"{path.stem}.html")
        if km.has_kernel:  # a manager handed to nbclient is ours to stop
            km.shutdown_kernel()
        shutil.rmtree(sockets, ignore_errors=True)
    found = work / "runs"
    runs = sorted(d for d in found.iterdir() if d.is_dir()) if found.is_dir() else []  # <name>-<time>/
    run_dir = runs[0] if runs else None
    report = write_report(run_dir, outputs / f"{path.stem}-report.html", title=path.stem) if run_dir else None
    return {"notebook": str(executed), "html": str(outputs / f"{path.stem}.html"),
            "report": str(report) if report else None,
            "run_dir": str(run_dir) if run_dir else None, "run_dirs": [str(d) for d in runs],
            "final_reward": _final_reward(run_dir) if run_dir else None, "seconds": round(time.time() - start, 1)}


def to_html(nb: nbformat.NotebookNode, out: Path) -> Path:
    """The executed notebook as one HTML page (nbconvert's lab template), as `jupyter nbconvert --to html` makes."""
    from nbconvert import HTMLExporter

    body, _ = HTMLExporter().from_notebook_node(nb)
    out.write_text(body)
    return out


def _rows(run_dir: Path) -> list[dict[str, float]]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _final_reward(run_dir: Path, last: int = 50) -> float | None:
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
    print(f"executed notebook: {result['notebook']} (as HTML: {result['html']})")
    print(f"report:            {result['report']}")
    print(f"run directories:   {', '.join(result['run_dirs']) or 'none'}")
    print(f"final reward:      {result['final_reward']} (mean of the last 50 steps) in {result['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
