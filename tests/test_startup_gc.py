"""A spawned process makes no full garbage collections while it starts; once set up, it collects as usual."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from forge_nb.system.runtime import spawning
from tests.actors_for_tests import GcProbe

pytestmark = pytest.mark.timeout(120)

_DEFAULT = (700, 10, 10)  # CPython's thresholds, what a spawned process starts with


async def test_a_spawned_process_holds_full_collections_until_its_actor_is_set_up(runtime):
    mesh = await spawning.spawn_mesh("gc-probe", 1)
    try:
        probe = mesh.spawn("gc-probe", GcProbe)
        assert (await probe.gc_state.call_one())["paused"] is True  # spawned, not yet set up
        await probe.setup.call_one()
        state = await probe.gc_state.call_one()
    finally:
        await mesh.stop()
    assert state["during_setup"]["paused"] is True
    young, middle, oldest = state["during_setup"]["threshold"]
    assert (young, middle) == _DEFAULT[:2] and oldest > 10**6  # young cycles still collected, no full ones
    assert state["paused"] is False and tuple(state["threshold"]) == _DEFAULT
    assert state["frozen"] > 10_000  # what the start loaded is out of every later collection


async def test_a_preloaded_process_freezes_what_it_imported_before_its_actor_is_set_up(runtime):
    """The full collection that ends the setup walks what the setup made, not what the preload imported
    (``ProcInfo.preload``, the trainer's processes started first)."""
    mesh = await spawning.spawn_mesh("gc-preload", 1, preload=("email.mime.text", "json"))
    try:
        await mesh.preloading
        probe = mesh.spawn("gc-probe", GcProbe)
        state = await probe.gc_state.call_one()
    finally:
        await mesh.stop()
    assert state["paused"] is True  # still starting: no setup yet
    assert state["frozen"] > 10_000  # before any setup, only the preload froze anything


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_process_whose_actors_have_no_setup_settles_on_the_timer():
    out = _run("""
        import gc, time
        from forge_nb.system.processes import startup_gc
        startup_gc.pause(settle_after_s=0.3)
        startup_gc.pause()  # a second call changes nothing
        print(startup_gc.paused(), gc.get_threshold()[2] > 10**6)
        time.sleep(2)
        print(startup_gc.paused(), gc.get_threshold(), gc.get_freeze_count() > 0)
    """)
    assert out.splitlines() == ["True True", f"False {_DEFAULT} True"]


def test_settle_collects_the_cycles_the_start_dropped_before_freezing_the_rest():
    out = _run("""
        import gc, weakref
        from forge_nb.system.processes import startup_gc
        class Node: pass
        startup_gc.pause()
        startup_gc.keep_what_is_loaded()
        kept = gc.get_freeze_count()
        a, b = Node(), Node()
        a.other, b.other = b, a
        gone = weakref.ref(a)
        for _ in range(50): gc.collect(1)  # young collections move the cycle into the oldest generation
        del a, b
        for _ in range(50): gc.collect(1)  # which no young collection and no automatic one reaches
        print(kept > 0, gone() is not None)
        startup_gc.settle()
        startup_gc.settle()  # once only
        print(gone() is None, gc.get_freeze_count() >= kept, startup_gc.paused())
        frozen, later = gc.get_freeze_count(), [Node() for _ in range(1000)]
        startup_gc.keep_what_is_loaded()  # after the start it freezes nothing more
        print(gc.get_freeze_count() == frozen)
    """)
    assert out.splitlines() == ["True True", "True True False", "True"]


def test_setup_settles_the_process_even_when_it_raises():
    out = _run("""
        import asyncio
        from forge_nb.service import ForgeActor
        from forge_nb.system.processes import startup_gc
        from monarch.actor import endpoint
        class Fails(ForgeActor):
            @endpoint
            async def setup(self):
                raise ValueError("no model")
        startup_gc.pause()
        try:
            asyncio.run(Fails.setup._method(Fails.__new__(Fails)))
        except ValueError:
            pass
        print(startup_gc.paused())
    """)
    assert out == "False"


def test_a_child_forked_during_the_start_collects_as_usual():
    out = _run("""
        import gc, os
        from forge_nb.system.processes import startup_gc
        startup_gc.pause()
        pid = os.fork()
        if pid == 0:  # no timer thread came along: the child must not stay paused
            os._exit(0 if not startup_gc.paused() and gc.get_threshold() == (700, 10, 10) else 3)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status), startup_gc.paused())
    """)
    assert out == "0 True"


def test_the_kernels_heap_stays_frozen_until_the_last_runs_hold_ends():
    """Two runs live in one kernel: the first's shutdown (twice, as a retried one) leaves the heap frozen for the
    second; the second's unfreezes it, so nothing made before the runs stays out of the collector's reach."""
    out = _run("""
        import gc
        from forge_nb.system.processes import startup_gc

        first = startup_gc.hold_kernel_heap()
        frozen = gc.get_freeze_count()
        second = startup_gc.hold_kernel_heap()
        first()
        first()
        during = gc.get_freeze_count()
        second()
        print(frozen > 1000, during >= frozen, gc.get_freeze_count())
    """)
    assert out == "True True 0"
