"""A verifiers Toolset for test_verifiers: an MCP server that verifiers starts (python -m tests.agents.vf_tools)."""

from __future__ import annotations

import verifiers.v1 as vf


class Calc(vf.Toolset[vf.ToolsetConfig]):
    """Its tool reaches the model as ``calc_add``."""

    @vf.tool
    async def add(self, input: str) -> str:  # noqa: A002 (the simple syntax's one argument)
        """The sum of the whitespace-separated integers in ``input``."""
        return str(sum(int(x) for x in input.split()))


if __name__ == "__main__":
    Calc.run()
