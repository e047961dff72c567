"""The docs site, built once per session into a temporary folder, as `sphinx-build -W` builds it."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True, slots=True)
class Build:
    html: Path
    returncode: int
    output: str
    seconds: float


@pytest.fixture(scope="session")
def docs_build(tmp_path_factory: pytest.TempPathFactory) -> Build:
    pytest.importorskip("myst_nb", reason="the docs extra is not installed (scripts/setup.sh installs it)")
    html = tmp_path_factory.mktemp("docs") / "html"
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
                           str(ROOT / "docs"), str(html)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    return Build(html, done.returncode, done.stdout + done.stderr, time.monotonic() - start)
