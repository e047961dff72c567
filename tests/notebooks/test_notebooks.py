"""Every example notebook runs top to bottom in a real kernel: here with a small step budget, or as written in a
test of its own (RUN_WHOLE)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "example_notebooks").glob("[0-9][0-9]_*.py"))
#: Executed as written by a test of their own, which checks more than a short run here would (the quickstart's
#: also checks what the short run below does: tests/notebooks/test_quickstart_ends_well.py).
RUN_WHOLE = {"01_quickstart", "08_multi_turn", "09_agents", "10_lora_sweep", "11_tinker"}

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(900)]


def assert_left_in_outputs(result: dict, outputs: Path, sources_before: set[Path]) -> None:
    """An executed example left its report and its run directories under ``outputs``, and nothing beside the
    notebook sources (``sources_before``: ``example_notebooks/`` listed before it ran)."""
    assert result["report"] and Path(result["report"]).stat().st_size > 10_000
    assert result["run_dirs"] and all(Path(d).is_relative_to(outputs) for d in result["run_dirs"])
    assert set((ROOT / "example_notebooks").iterdir()) == sources_before  # no runs/ beside the sources


def _runner():
    spec = importlib.util.spec_from_file_location("run_notebook", ROOT / "scripts" / "run_notebook.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_notebook_source_converts_with_one_parameters_cell_and_no_test_plumbing():
    runner = _runner()
    assert len(NOTEBOOKS) == 11
    for path in NOTEBOOKS:
        source = path.read_text()
        assert "FORGE_NB_" not in source and "os.environ" not in source, path.name  # reads like the README
        nb = runner.to_notebook(source)
        kinds = [c.cell_type for c in nb.cells]
        assert kinds[0] == "markdown" and "code" in kinds, path.name
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert not cell.source.startswith("# %%"), path.name
        (params,) = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
        assert params.source.startswith("STEPS = "), path.name
    quickstart = runner.to_notebook((ROOT / "example_notebooks" / "01_quickstart.py").read_text())
    assert "%forge_spawn quickstart" in [c.source for c in quickstart.cells]  # as in the README


def test_the_runner_s_work_folder_links_what_sits_beside_the_notebook_but_not_its_own_outputs(tmp_path):
    """Outputs kept beside the notebook (``--outputs <its folder>/out``) are not linked into the work folder
    inside them: such a link is a loop that globbing and copying the folder would follow for ever."""
    (tmp_path / "nb.py").write_text("# %%\n")
    (tmp_path / "data").mkdir()
    work = _runner().workdir(tmp_path / "nb.py", tmp_path / "out")
    assert work == tmp_path / "out" / "nb-work"
    assert sorted(p.name for p in work.iterdir()) == ["data"] and (work / "data").resolve() == tmp_path / "data"


def test_the_runner_overrides_the_parameters_cell_and_refuses_an_unknown_name():
    runner = _runner()
    nb = runner.to_notebook((ROOT / "example_notebooks" / "01_quickstart.py").read_text())
    at = next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", []))
    runner.inject_parameters(nb, STEPS=3)
    injected = nb.cells[at + 1]
    assert injected.metadata["tags"] == ["injected-parameters"] and injected.source.endswith("\nSTEPS = 3")
    namespace: dict = {}
    exec(nb.cells[at].source + "\n" + injected.source, namespace)  # the order the kernel runs them in
    assert namespace["STEPS"] == 3
    with pytest.raises(ValueError, match="not set in the notebook's parameters cell"):
        runner.inject_parameters(nb, STEP=3)
    del nb.cells[at]
    with pytest.raises(ValueError, match="tag exactly one"):
        runner.inject_parameters(nb, STEPS=3)


@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if p.stem not in RUN_WHOLE],
                         ids=[p.stem for p in NOTEBOOKS if p.stem not in RUN_WHOLE])
def test_notebook_executes(path, tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(ROOT)
    runner = _runner()
    before = set((ROOT / "example_notebooks").iterdir())
    result = runner.execute(path, tmp_path / "outputs", steps=3, timeout=600)
    # the kernel writes to the runner's terminal: over IPC and stopped by the runner, it has nothing to warn of
    assert "[IPKernelApp] WARNING" not in capfd.readouterr().err
    nb = json.loads(Path(result["notebook"]).read_text())
    errors = [o for c in nb["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors, errors[0]
    assert any("STEPS = 3" in "".join(c["source"]) for c in nb["cells"]
               if "injected-parameters" in c["metadata"].get("tags", []))
    assert result["final_reward"] is not None and 0.0 <= result["final_reward"] <= 1.0
    assert_left_in_outputs(result, tmp_path, before)
    rows = (Path(result["run_dir"]) / "metrics.jsonl").read_text().splitlines()
    assert len(rows) >= 3
