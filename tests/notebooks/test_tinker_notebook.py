"""The Tinker notebook, executed as written (its own 40 iterations): tinker-cookbook's first RL loop, in cells
against the ``tinker`` SDK, trains a training client's adapter on the served run's base while that run trains its
own with its loops; the Tinker loop's reward rises, its steps are rows of the client's run, the served run's ledger
stays balanced."""

from __future__ import annotations

import importlib.util
import re

import pytest

from tests.notebooks.test_notebooks import ROOT
from tests.notebooks.test_quickstart_ends_well import run_as_written

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(900),
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM (the cpu or gpu extra)")]


def test_the_tinker_notebook_trains_through_the_sdk_beside_the_served_runs_loops(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    result, nb, lines = run_as_written("11_tinker.py", tmp_path)
    printed = [line.split("] ", 1)[1] for line in lines]  # without the cell-number prefix
    assert any(p.startswith("run 'served' serves the Tinker API at http://127.0.0.1:") for p in printed), printed
    assert any("is run 'served-tinker-1' on the base of 'served': ['served', 'served-tinker-1']" in p
               for p in printed), printed
    (summary,) = [p for p in printed if p.startswith("Tinker loop: ")]
    first, last, rows = re.match(r"Tinker loop: reward ([\d.]+) over the first iterations, ([\d.]+) over the last; "
                                 r"(\d+) step rows", summary).groups()
    assert float(first) <= 0.3 and float(last) >= float(first) + 0.25 and int(rows) == 40, summary
    (served,) = [p for p in printed if p.startswith("served run 'served': step ")]
    assert int(re.search(r"step (\d+)", served).group(1)) > 0 and served.endswith("ledger balanced: True"), served
