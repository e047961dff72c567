"""RunAssembly: a run's parts close phase by phase, in the order each phase registered them; one that fails to
close does not keep the others open, and its error is raised at the end."""

from __future__ import annotations

import pytest

from forge_nb.controller.lifecycle.assembly import PHASES, RunAssembly


async def test_parts_close_phase_by_phase_and_a_failure_leaves_the_rest_closing() -> None:
    closed: list[str] = []

    async def trainer() -> None:
        raise RuntimeError("the trainer would not stop")

    async def policy() -> None:
        closed.append("policy")

    assembly = RunAssembly("r")
    assembly.add("log", "kernel log", lambda: closed.append("kernel log"))  # made first, closed last
    assembly.add("services", "policy", policy)
    assembly.add("services", "trainer", trainer)
    assembly.add("weights", "weights", lambda: closed.append("weights"))
    assembly.add("fronts", "OpenAI endpoint", lambda: closed.append("OpenAI endpoint"))
    assembly.add("loops", "loops", lambda: closed.append("loops"))  # made last, closed first
    assert [phase for phase, _ in assembly.parts()] == ["loops", "fronts", "services", "services", "weights", "log"]
    with pytest.raises(RuntimeError, match="would not stop"):
        await assembly.close()
    assert closed == ["loops", "OpenAI endpoint", "policy", "weights", "kernel log"]
    await assembly.close()  # once only
    assert len(closed) == 5
    with pytest.raises(RuntimeError, match="shut down"):
        assembly.add("fronts", "a late endpoint", lambda: None)
    with pytest.raises(ValueError, match="one of"):
        RunAssembly("r").add("nowhere", "x", lambda: None)
    assert PHASES[0] == "loops" and PHASES[-1] == "log"


async def test_a_failed_build_closes_what_it_made_and_raises_nothing_of_its_own() -> None:
    closed: list[str] = []

    async def trainer() -> None:
        raise RuntimeError("the trainer would not stop")

    assembly = RunAssembly("r")
    assembly.add("services", "trainer", trainer)
    assembly.add("weights", "weights", lambda: closed.append("weights"))
    await assembly.close_after_failure()  # the build's own error is the one its caller raises
    assert closed == ["weights"] and assembly.closed
