"""No full garbage collections while a spawned process starts (its imports and its actor's setup), nor over what the
kernel held when a run began while the run trains.

Python's cyclic collector runs a full (oldest-generation) collection every so often while objects pile up, and
each one walks every object the process holds. Starting a service's process creates hundreds of thousands of
long-lived objects (torch, transformers, vLLM: ~680,000 objects after vLLM's import), so a full collection grows
to half a second, and a start makes a dozen: with ``gc.callbacks`` watching the quickstart on two busy cores, the
Generator's process spent 4.1 s of its 19 s start in them and the trainer's 1.1 s, freeing
almost nothing (759 objects in the 9 that ``import vllm`` alone makes). The Generator is the last process to
be ready, so those seconds are seconds of ``%forge_spawn``.

:func:`pause`, called first by the spawned process's bootstrap (``forge_nb.system.processes.proclogs.bootstrap``, before
the actor's classes and what they import are loaded), keeps the young generations collecting (cycles made and
dropped during the start are still freed) and stops only the full collections. :func:`keep_what_is_loaded`
freezes what the imports made before a library that collects on its own starts (vLLM's engine asks for three
full collections). :func:`settle`, called when an actor's ``setup`` returns or raises
(``forge_nb.service._actor_side``), makes the one full collection the start still owes, then ``gc.freeze()``
moves what survived (modules, the model, the engine) out of every later collection, as vLLM's engine does after
its own start (``vllm.utils.gc_utils.freeze_gc_heap``), and puts the thresholds back. A process whose actors
have no ``setup`` settles on a timer instead, and a child forked meanwhile collects as usual. In the quickstart,
four runs alternated with the code before: the spawn took 14.3-16.7 s against 16.6-20.6 s (medians 15.6 and
19.8), steps per second unchanged.

The kernel has the same cost while a run trains: it imported torch, monarch and the run's modules, and each of its
full collections walked them (~270,000 objects: 120-150 ms, one in the quickstart's first 30 training steps in
every run of ``bench/vs_trl.py``, and more later). :func:`hold_kernel_heap`, called as a run's parts are made
(``forge_nb.controller.lifecycle.build``), freezes what the kernel holds then; the run's shutdown ends the hold,
and the end of the last live run's hold unfreezes it, so what the kernel made before a run is collectable again
once no run trains (the next full collection walks it all, as it would have).

Considered: ``gc.disable()`` for the start (young cycles, e.g. tracebacks and torch.compile's graphs, would pile
up until the end), and ``gc.freeze()`` alone after the imports (the imports' collections come before it). In the
kernel, ``gc.freeze()`` for good (the cycles a notebook's cells drop before a run would never be freed).
"""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Callable

#: Seconds after :func:`pause` when a process that ran no actor ``setup`` settles anyway.
SETTLE_AFTER_S = 180.0

_lock = threading.Lock()
_saved: tuple[int, int, int] | None = None  # the thresholds to put back; None when not paused
_timer: threading.Timer | None = None
_fork_hook = False  # registered once per process
_kernel_holds = 0  # live runs holding the kernel's heap frozen (hold_kernel_heap)


def pause(settle_after_s: float = SETTLE_AFTER_S) -> None:
    """Stop full collections in this process until :func:`settle` (at the latest ``settle_after_s`` from now)."""
    global _saved, _timer, _fork_hook
    with _lock:
        if _saved is not None:
            return
        _saved = gc.get_threshold()
        young, middle = _saved[0], _saved[1]
        gc.set_threshold(young, middle, 2**31 - 1)  # generation 2 is collected when its count passes this
        _timer = threading.Timer(settle_after_s, settle)
        _timer.daemon = True
        _timer.name = "forge_nb.startup-gc"
        _timer.start()
        if not _fork_hook:
            os.register_at_fork(after_in_child=_forked)
            _fork_hook = True


def _forked() -> None:
    """In a child forked while paused: its timer did not come along, so it collects as usual from the start."""
    global _saved, _timer, _lock
    _lock = threading.Lock()  # the parent's may have been held by another thread at the fork
    if _saved is not None:
        gc.set_threshold(*_saved)
    _saved, _timer = None, None


def paused() -> bool:
    """Whether this process is still starting (full collections held back)."""
    return _saved is not None


def keep_what_is_loaded() -> None:
    """While paused: freeze what the process holds now (what it imported), so that the full collections a
    library asks for while it starts walk only what came after. vLLM's engine asks for three as it starts:
    0.6-0.7 s each over the whole heap on two busy cores, 0.07 s after this. The imports' few leftover
    cycles stay, as the modules do."""
    with _lock:
        if _saved is not None:
            gc.freeze()


def settle() -> None:
    """The start is over: one full collection, what survived frozen, the thresholds back. Idempotent."""
    global _saved, _timer
    with _lock:
        if _saved is None:
            return
        saved, _saved = _saved, None
        if _timer is not None:
            _timer.cancel()
        _timer = None
        gc.collect()
        gc.freeze()
        gc.set_threshold(*saved)


def hold_kernel_heap() -> Callable[[], None]:
    """In the kernel, as a run's parts are made: freeze what the kernel holds, out of the full collections made
    while the run trains. Returns the function that ends this hold (the run's shutdown; idempotent): when no hold
    is left, the kernel's heap is unfrozen (see the module docstring)."""
    global _kernel_holds
    with _lock:
        gc.freeze()
        _kernel_holds += 1
    ended = False

    def release() -> None:
        global _kernel_holds
        nonlocal ended
        with _lock:
            if ended:
                return
            ended = True
            _kernel_holds -= 1
            if _kernel_holds == 0:
                gc.unfreeze()

    return release
