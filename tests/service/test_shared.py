"""A service several runs share (``forge_nb.service.shared``), on real monarch meshes: each share's calls carry its
own keyword arguments, a respawned replica runs every share's catch-up, and the service stops with its last share."""

from __future__ import annotations

import os
import signal

import pytest

from forge_nb.service.shared import SharedService
from tests.actors_for_tests import Squarer
from tests.waiting import waiter

pytestmark = pytest.mark.timeout(180)

_until = waiter(timeout=30.0, interval=0.05)


async def test_shares_add_their_keywords_catch_up_in_turn_and_the_service_goes_with_the_last(runtime):
    svc = await Squarer.options(num_replicas=1, restart_backoff=0.1).as_service()
    shared = SharedService(svc)
    left: list[str] = []

    async def leave() -> None:
        left.append("b")

    a = shared.share("a")
    b = shared.share("b", inject={"square": {"offset": 100}}, leave=leave)
    try:
        assert await a.square.route(3) == 9 and await b.square.route(3) == 109
        assert await b.square.fanout(2) == [104]  # every adverb of the endpoint gets the share's keywords
        assert shared.names == ["a", "b"] and b.replicas is svc.replicas and b.status() == svc.status()

        caught: list[str] = []

        async def hook(name: str, replica) -> None:
            caught.append(f"{name}:{replica.index}")

        a.set_catch_up(lambda r: hook("a", r))
        b.set_catch_up(lambda r: hook("b", r))
        os.kill(svc.replicas[0].mesh.pids[0], signal.SIGKILL)
        assert await _until(lambda: caught == ["a:0", "b:0"] and svc.replicas[0].healthy), caught

        await b.shutdown()  # b leaves: its leave() runs, the service stays for a
        assert left == ["b"] and svc.replicas[0].healthy and shared.names == ["a"]
        assert await a.square.route(4) == 16
        await a.shutdown()  # the last share: the service stops with it
        assert [r.state for r in svc.replicas] == ["stopped"]
    finally:
        await svc.shutdown()
