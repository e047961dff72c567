"""``%forge_dashboard --side`` in a real IPython shell: its options and the messages without a run or sidecar.

The side panel itself (sidecar's JupyterLab extension) is checked in a real JupyterLab by
test_open_in_jupyterlab.py; here no run is spawned.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

from forge_nb.magics import help_text

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def ip() -> Iterator[InteractiveShell]:
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "forge_nb")
    yield shell
    shell.run_line_magic("unload_ext", "forge_nb")


def usage_error(ip: InteractiveShell, cell: str) -> str:
    result = ip.run_cell(cell)
    error = result.error_in_exec or result.error_before_exec
    assert isinstance(error, UsageError), f"{cell!r} gave {error!r}, not a UsageError"
    return str(error)


def test_side_is_a_documented_option(ip: InteractiveShell) -> None:
    assert "%forge_dashboard [--side]" in help_text()
    assert "--side" in ip.find_line_magic("forge_dashboard").__doc__
    assert "no run yet" in usage_error(ip, "%forge_dashboard --side")  # parsed; then it needs a run
    assert "no run named 'nope'" in usage_error(ip, "%forge_dashboard --side --name nope")
    assert "unrecognized arguments: --left" in usage_error(ip, "%forge_dashboard --left")


def test_side_without_sidecar_says_how_to_install_it(ip: InteractiveShell, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "sidecar", None)  # as if not installed: importing it raises ImportError
    message = usage_error(ip, "%forge_dashboard --side")
    assert "pip install 'sidecar>=0.8'" in message and "without --side" in message, message
    assert "no run yet" in usage_error(ip, "%forge_dashboard")  # the in-cell dashboard does not need it


def test_side_in_a_terminal_ipython_says_there_is_no_page_for_a_panel(ip: InteractiveShell, capsys) -> None:
    from forge_nb.magics._runs import Runs

    class Toy:  # only its name and state are read before the message
        name, state = "toy", "running"

    runs = Runs.of(ip)
    run = Toy()
    runs.add(run)
    try:
        result = ip.run_cell("%forge_dashboard --side")
        assert result.success, result.error_in_exec
        out = capsys.readouterr().out
        assert out.startswith("no side panel here: this IPython is not a Jupyter kernel") and "'toy'" in out, out
        assert "beside the notebook" not in out
    finally:
        runs.by_name.pop("toy", None)
        runs.seen.pop(id(run), None)
        runs.current = None
