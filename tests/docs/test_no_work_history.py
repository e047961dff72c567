"""The package's modules say what the code does and why, as it is now: no numbered history of the work that led
there (our tracker's issue numbers, numbered sessions or rounds). That history is in ``bench/HISTORY.md`` and the
commit messages. An upstream project's issue (``TRL #5975``, ``vLLM issue 1234``) is a fact about that project and
may stay."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NUMBERED = re.compile(r"\b(?:issues?|sessions?|rounds?)\s+#?\d+|(?:^|[\s(\[])#\d{1,5}\b", re.IGNORECASE)
#: Projects whose issue numbers a comment may cite, as the word just before the number.
UPSTREAM = re.compile(r"\b(trl|vllm|torch|pytorch|monarch|torchstore|torchtitan|peft|transformers|setuptools|pip|"
                      r"ipykernel|ipython|ipywidgets|jupyter\w*|anywidget|panel|bokeh|uplot|python|cpython|bpo|"
                      r"verifiers|openai|textarena|openenv|fastmcp|mcp|slurm|huggingface|datasets|plotly|"
                      r"psutil|aiohttp|sidecar|jupytext|playwright|chromium)\W{0,3}$", re.IGNORECASE)


def numbered_history(text: str) -> list[str]:
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for match in NUMBERED.finditer(line):
            if not UPSTREAM.search(line[: match.start()].rstrip(" (")[-20:] + " "):
                found.append(f"{number}: {line.strip()[:140]}")
    return found


def test_the_pattern_tells_our_history_from_upstream_issues():
    assert numbered_history("the store's volume in the kernel (issue 34)")
    assert numbered_history("measured in session 49, below")
    assert numbered_history("fixed in #64")
    assert not numbered_history("TRL #5975 keeps the old logits; vLLM issue 1234 too")
    assert not numbered_history("color:#666; a round trip of 2 ms")


def test_no_module_carries_numbered_work_history():
    files = [p for p in (ROOT / "forge_nb").rglob("*") if p.suffix in (".py", ".js") and "vendor" not in p.parts]
    found = {str(p.relative_to(ROOT)): hits for p in files if (hits := numbered_history(p.read_text()))}
    assert not found, ("numbered work history in docstrings or comments (keep what the code does and why; the "
                       f"history goes to bench/HISTORY.md or a commit message): {found}")
