"""A real IPython shell with ``%load_ext forge_nb``, shared by the shell tests of the magics."""

from __future__ import annotations

import pytest
from IPython.core.interactiveshell import InteractiveShell


@pytest.fixture(scope="module")
def ip():
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "forge_nb")
    yield shell
    shell.run_cell("%forge_shutdown --all")
    shell.run_line_magic("unload_ext", "forge_nb")
