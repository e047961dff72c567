"""Execute the example notebooks as written and keep them, with their outputs, for the docs.

    .venv/bin/python scripts/docs_notebooks.py                 # every notebook under example_notebooks/
    .venv/bin/python scripts/docs_notebooks.py 01_quickstart 09_agents

The docs build never runs a notebook (myst-nb's ``nb_execution_mode = "off"``): a build of two minutes could
not, and a page must show what the notebook did on a real machine. So each notebook is executed here, headless
and with its own budget, by ``scripts/run_notebook.py``, and saved to ``docs/notebooks/<name>.ipynb`` with its
outputs; machine paths in the outputs are made relative, and a live widget's output (the dashboard, the
curves of several runs) becomes a note that points at the dashboard's page, since a static page cannot draw it
without its kernel. The notebook's metadata records when, on which
commit and machine it ran and how long it took, which the docs' notebook table shows. ``tests/docs`` fails
when a notebook's source no longer matches its executed copy: run this script for that notebook again.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import os
import platform
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ROOT / "example_notebooks"
EXECUTED = ROOT / "docs" / "notebooks"


def _runner():
    spec = importlib.util.spec_from_file_location("run_notebook", ROOT / "scripts" / "run_notebook.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def scrub(text: str, paths: dict[str, str]) -> str:
    """``text`` with each absolute path of ``paths`` replaced by its stand-in (longest first)."""
    for path in sorted(paths, key=len, reverse=True):
        text = text.replace(path, paths[path])
    return text


def scrub_notebook(nb: nbformat.NotebookNode, paths: dict[str, str]) -> None:
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            if "text" in output:
                output["text"] = scrub(output["text"], paths)
            for mime, value in output.get("data", {}).items():
                if isinstance(value, str):
                    output["data"][mime] = scrub(value, paths)
            if "traceback" in output:
                output["traceback"] = [scrub(line, paths) for line in output["traceback"]]


WIDGET = "application/vnd.jupyter.widget-view+json"
WIDGET_NOTE = ("*A live widget: JupyterLab draws it while the kernel runs, and a saved page cannot. "
               "[The dashboard](../dashboard.md) shows what it looks like.*")


def widgets_to_notes(nb: nbformat.NotebookNode) -> None:
    """Each widget output becomes a markdown note; the widgets' saved state goes (a page has no kernel)."""
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            if WIDGET in output.get("data", {}):
                output["data"] = {"text/markdown": WIDGET_NOTE}
    nb.metadata.pop("widgets", None)


def machine() -> str:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else ""
    return f"{platform.machine()}, {os.cpu_count()} cores, {model}".strip(", ")


def execute(name: str) -> Path:
    source = SOURCES / f"{name}.py"
    if not source.exists():
        raise SystemExit(f"no notebook {source.relative_to(ROOT)}; the notebooks are "
                         f"{', '.join(p.stem for p in sorted(SOURCES.glob('[0-9][0-9]_*.py')))}")
    with tempfile.TemporaryDirectory(prefix="forge-nb-docs-") as tmp:
        result = _runner().execute(source, Path(tmp), steps=None)
        nb = nbformat.read(result["notebook"], as_version=4)
        work = str(Path(tmp).resolve() / f"{name}-work")
        scrub_notebook(nb, {work: ".", str(Path(tmp).resolve()): ".", tmp: ".", str(ROOT): ".",
                            str(Path.home()): "~"})
        widgets_to_notes(nb)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    nb.metadata["forge_nb"] = {"executed": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
                               "commit": commit, "machine": machine(), "seconds": result["seconds"],
                               "final_reward": result["final_reward"]}
    EXECUTED.mkdir(parents=True, exist_ok=True)
    out = EXECUTED / f"{name}.ipynb"
    nbformat.write(nb, out)
    leftover = re.findall(r"/(?:work|home|root|tmp)/[^\s'\"]+", out.read_text())
    print(f"{name}: {result['seconds']} s, final reward {result['final_reward']} -> {out.relative_to(ROOT)}"
          + (f"; paths left in its outputs: {sorted(set(leftover))[:5]}" if leftover else ""))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help="notebook names (01_quickstart ...); all when none is given")
    args = ap.parse_args()
    names = args.names or [p.stem for p in sorted(SOURCES.glob("[0-9][0-9]_*.py"))]
    for name in names:
        execute(name.removesuffix(".py").removeprefix("example_notebooks/"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
