"""Every example notebook runs top to bottom in a real kernel, with a small step budget."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "example_notebooks").glob("[0-9][0-9]_*.py"))

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(900)]


def _runner():
    spec = importlib.util.spec_from_file_location("run_notebook", ROOT / "scripts" / "run_notebook.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_notebook_source_converts():
    runner = _runner()
    assert len(NOTEBOOKS) == 7
    for path in NOTEBOOKS:
        nb = runner.to_notebook(path.read_text())
        kinds = [c.cell_type for c in nb.cells]
        assert kinds[0] == "markdown" and "code" in kinds, path.name
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert not cell.source.startswith("# %%"), path.name


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes(path, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    runner = _runner()
    result = runner.execute(path, tmp_path / "outputs", steps=3, timeout=600)
    nb = json.loads(Path(result["notebook"]).read_text())
    errors = [o for c in nb["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors, errors[0]
    assert result["report"] and Path(result["report"]).stat().st_size > 10_000
    assert result["final_reward"] is not None and 0.0 <= result["final_reward"] <= 1.0
    rows = (Path(result["run_dir"]) / "metrics.jsonl").read_text().splitlines()
    assert len(rows) >= 3
