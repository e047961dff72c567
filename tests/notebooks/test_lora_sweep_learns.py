"""The LoRA sweep notebook, executed as written (its own 200 steps): four LoRA runs with four learning rates share one
base model's generator and trainer process (issue 64), and every run's reward rises."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.notebooks.test_notebooks import ROOT
from tests.notebooks.test_quickstart_ends_well import run_as_written

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(1200),
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM (the cpu or gpu extra)")]


def test_the_lora_sweep_notebook_trains_four_runs_on_one_base(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    result, nb, lines = run_as_written("10_lora_sweep.py", tmp_path)
    printed = [line.split("] ", 1)[1] for line in lines]  # without the cell-number prefix
    names = ["lr_5e-4", "lr_1e-3", "lr_1.5e-3", "lr_2e-3"]
    assert f"runs on one base: {names}" in printed, printed
    assert any(p.startswith("run 'lr_2e-3' is up (policy x1, trainer x1; shared with 'lr_5e-4', 'lr_1e-3', "
                            "'lr_1.5e-3')") for p in printed), printed  # what %forge_spawn --on says
    # one generator process and one trainer process serve all four
    for prefix in ("generator processes: ", "trainer processes: "):
        (line,) = [p for p in printed if p.startswith(prefix)]
        pids = json.loads(line[len(prefix):].replace("'", '"'))
        assert len({tuple(v) for v in pids.values()}) == 1 and set(pids) == set(names), line
    for name in names:
        (run_dir,) = [Path(d) for d in result["run_dirs"] if json.loads((Path(d) / "config.json").read_text())
                      .get("name") == name]
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        rewards = [r["reward/mean"] for r in rows if "reward/mean" in r]
        assert len(rewards) >= 200, (name, len(rewards))
        first, last = sum(rewards[:10]) / 10, sum(rewards[-25:]) / 25
        # every learning rate of the sweep learns on the shared base
        assert first <= 0.35 and last >= first + 0.3, (name, first, last)
    assert any(p.startswith("lr_5e-4 trained on: ") and "'lr_5e-4', 'lr_1e-3', 'lr_1.5e-3']" in p for p in printed)
