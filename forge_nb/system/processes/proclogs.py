"""Where spawned processes' output goes: a log file per mesh, not the notebook cell; and reading it back.

A process the kernel spawns inherits the kernel's stdout and stderr, which ipykernel forwards to
whichever cell ran last: vLLM, monarch, torch and triton then print hundreds of lines into cells
that have nothing to do with them. :func:`bootstrap` runs first in every spawned process (monarch's
``bootstrap`` hook) and points its stdout and stderr at ``<log_dir>/<mesh>.log`` (vLLM's engine
processes, its children, inherit that). A run's meshes log into ``<run_dir>/logs``; meshes spawned
outside a run into :func:`default_log_dir`. What the user must act on still reaches the cell: an
actor's exception travels back to the caller with its traceback. In the kernel itself, a
:class:`KernelLog` writes what forge_nb and torchstore log (a loop that failed, with its traceback)
to ``<run_dir>/logs/kernel.log`` while the run lives; without it Python's last-resort handler would
print those records into whichever cell ran last. :func:`read` is what ``run.logs()`` and
``%forge_logs`` show.

Considered: monarch's ``ProcMesh.logging_option(stream_to_client=False)`` (it stops monarch's own
forwarding of Python logging, not the inherited file descriptors that carry vLLM's and the
engines' output), and redirecting in each actor's ``__init__`` (too late for the process's first
lines, and every actor class would need it).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import math
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from forge_nb.system.processes import startup_gc

#: What a level keeps of a log (a line matching it, plus the traceback lines that follow an error).
_TRACEBACK = r"Traceback \(most recent call last\)"
LEVELS = {
    "error": re.compile(rf"\b(ERROR|CRITICAL|FATAL)\b|{_TRACEBACK}|^\w*(Error|Exception)\b"),
    "warning": re.compile(rf"\b(WARNING|WARN|ERROR|CRITICAL|FATAL)\b|{_TRACEBACK}|^\w*(Error|Exception|Warning)\b"),
}


def default_log_dir() -> Path:
    """This kernel's folder for the logs of meshes spawned outside a run (owner-only)."""
    folder = Path(tempfile.gettempdir()) / "forge_nb-logs" / str(os.getpid())
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    return folder


#: The kernel's loggers whose records go to a run's kernel.log (not the cells).
KERNEL_LOGGERS = ("forge_nb", "torchstore")
KERNEL_LOG = "kernel.log"


class _FullDiskQuiet(logging.FileHandler):
    """A log file whose disk is full drops the record, and says so once, on the logger's other handlers'
    terms, instead of logging's traceback in the cell for each one (``forge_nb.metrics`` keeps the rows)."""

    said = False

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 (logging's name)
        from forge_nb.system.diskspace import is_no_space

        error = sys.exc_info()[1]
        if error is None or not is_no_space(error):
            super().handleError(record)
        elif not self.said:
            self.said = True
            sys.stderr.write(f"forge_nb: the disk of {self.baseFilename} is full: its log records are dropped\n")

    def close(self) -> None:
        """Closed on a full disk too: the records still buffered are lost, as said (a run shuts down anyway)."""
        from forge_nb.system.diskspace import is_no_space

        try:
            super().close()
        except OSError as error:
            if not is_no_space(error):
                raise


#: A line of the kernel's code writes at most REPEATS records to a run's kernel.log per REPEAT_PERIOD_S seconds;
#: the next one that is written says how many were left out.
REPEATS, REPEAT_PERIOD_S = 5, 10.0


def repeats_summarised(period_s: float = REPEAT_PERIOD_S) -> logging.Filter:
    """A filter that lets at most ``REPEATS`` records of one line of code through per ``period_s`` seconds and
    says how many it left out: log-rate-limit's ``StreamRateLimitFilter`` (a stdlib ``logging.Filter``), one
    stream per file and line. The next record of that line after the period carries "(and N more like this
    ...)"; a line that went quiet has its count added to the next record of any line once two periods passed.
    A rollout loop that fails the same way thousands of times a second (an agent broken before its first
    call) then writes a few lines, not hundreds of megabytes. Considered: one stream per message text (messages
    that differ only by an id or a value would each pass), and logging's own ``handlers.MemoryHandler`` (it
    buffers, it does not count)."""
    from log_rate_limit import StreamRateLimitFilter

    return StreamRateLimitFilter(
        period_sec=period_s, allow_next_n=REPEATS - 1, default_stream_id="file_line_no",
        summary_msg="(and {numskip} more like this from the same line, left out of this log)",
        expire_offset_sec=int(math.ceil(period_s)), expire_check_sec=1,
        expire_msg="\n(and {numskip} more like this from {stream_id}, left out of this log)")


def drop_actor_prefix(handler: logging.Handler) -> None:
    """Take monarch's actor filter off ``handler``: once a monarch context exists, monarch adds to every handler a
    filter that prefixes each record's message with ``[actor=<name>]`` (and rewrites the record, so a record that
    passes two such handlers reads ``[actor=<root>] [actor=<root>]``). In the kernel the name is always
    ``<root>``: it says nothing."""
    for f in list(handler.filters):
        if type(f).__name__ == "_ActorFilter" and type(f).__module__.startswith("monarch"):
            handler.removeFilter(f)


#: The run whose work the current asyncio task does, None for kernel-wide work (:func:`run_context`).
CURRENT_RUN: contextvars.ContextVar[str | None] = contextvars.ContextVar("forge_nb_current_run", default=None)


def run_context(run: str) -> contextvars.Context:
    """A copy of the current context in which ``CURRENT_RUN`` is ``run``: a task made with it (and every task it
    makes) logs as that run's (``loop.create_task(coro, context=run_context(name))``). One per task: a context
    cannot be entered by two tasks at once."""
    context = contextvars.copy_context()
    context.run(CURRENT_RUN.set, run)
    return context


class _OwnRecords(logging.Filter):
    """A run's records and kernel-wide ones; not another run's (the loggers are the kernel's, shared)."""

    def __init__(self, run: str):
        super().__init__()
        self.run = run

    def filter(self, record: logging.LogRecord) -> bool:
        return CURRENT_RUN.get() in (None, self.run)


class KernelLog:
    """While a run lives, what the kernel's forge_nb and torchstore loggers record, in ``<folder>/kernel.log``.

    A handler on those loggers (records still propagate to handlers the user put on the root logger);
    the levels stay as the user set them (warnings and errors by default), repeats are summarised
    (:func:`repeats_summarised`). With ``run``, it takes that run's records (those of tasks made in its
    :func:`run_context`) and kernel-wide ones, not those of the other runs of the kernel. ``close()`` takes it
    off."""

    def __init__(self, folder: Path, run: str | None = None):
        # made here: a run on another's base has no processes of its own that would make its logs folder
        Path(folder).mkdir(parents=True, exist_ok=True)
        self.path = Path(folder) / KERNEL_LOG
        self.handler = _FullDiskQuiet(self.path, delay=True, encoding="utf-8")
        self.handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        if run is not None:
            self.handler.addFilter(_OwnRecords(run))
        self.handler.addFilter(repeats_summarised())
        for name in KERNEL_LOGGERS:
            logging.getLogger(name).addHandler(self.handler)
        drop_actor_prefix(self.handler)

    def close(self) -> None:
        for name in KERNEL_LOGGERS:
            logging.getLogger(name).removeHandler(self.handler)
        self.handler.close()


@contextlib.contextmanager
def native_stderr_to(path: Path) -> Iterator[None]:
    """Point this process's file descriptor 2 at ``path`` (appended to) for the block, then back.

    For native code that writes to the descriptor itself, where ``sys.stderr`` and logging do not reach:
    ipykernel forwards what lands on a kernel's descriptor 2 into the cell that runs. monarch's runtime
    announces its log file so when this process's first monarch context is made ("Monarch internal logs
    are being written to ..."), a line in the spawn cell that nobody needs to act on."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.dup2(fd, 2)
        finally:
            os.close(fd)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def bootstrap(env: dict[str, str], log_file: str | None) -> None:
    """Runs first in every spawned process: no full garbage collections until its actor is set up
    (:mod:`forge_nb.system.processes.startup_gc`), its environment, a thread lock for its progress bars, then its
    output into ``log_file``."""
    startup_gc.pause()
    os.environ.update(env)
    _thread_lock_for_progress_bars()
    if log_file is not None:
        output_to(log_file)


def output_to(log_file: str) -> None:
    """This process's descriptors 1 and 2 (and so ``sys.stdout`` and ``sys.stderr``) appended to ``log_file``,
    line-buffered; left as they are when the file cannot be opened."""
    try:  # on another host of a job the folder may not exist yet; if it cannot be made, monarch keeps the output
        os.makedirs(os.path.dirname(log_file), mode=0o700, exist_ok=True)
        fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    except OSError:
        return
    for stream, target in ((sys.stdout, 1), (sys.stderr, 2)):
        stream.flush()
        os.dup2(fd, target)
    os.close(fd)
    for stream in (sys.stdout, sys.stderr):  # a log read while the run goes on should be current
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(line_buffering=True)


def _thread_lock_for_progress_bars() -> None:
    """tqdm guards its bars with a multiprocessing lock, made at a process's first bar (vLLM's and
    transformers' weight loading): a named semaphore in /dev/shm and, as monarch's procs start processes
    with spawn, a resource tracker process to unlink it (~70 ms of CPU and 13 MB, per proc). A proc's bars
    write into its own log file, so a thread lock does (tqdm's ``set_lock``); processes the proc starts make
    their own."""
    try:
        import threading

        from tqdm import tqdm
    except ImportError:
        return
    tqdm.set_lock(threading.RLock())


def read(paths: list[Path], n: int = 40, level: str | None = None) -> list[str]:
    """The last ``n`` lines of the logs ``paths`` (each prefixed with its mesh's name), or with ``level``
    ("warning" or "error") the last ``n`` that match it, with the traceback lines that follow an error."""
    if level is not None and level not in LEVELS:
        raise ValueError(f"level={level!r}: use one of {sorted(LEVELS)} (or none for every line)")
    out: list[str] = []
    for path in sorted(paths):
        try:
            lines = path.read_text(errors="replace").splitlines()
        except OSError:
            continue
        if level is not None:
            lines = _matching(lines, LEVELS[level])
        out += [f"[{path.stem}] {line}" for line in lines]
    return out[-n:] if n > 0 else out


def _matching(lines: list[str], pattern: re.Pattern[str]) -> list[str]:
    kept, in_traceback = [], False
    for line in lines:
        if pattern.search(line):
            kept.append(line)
            in_traceback = "Traceback" in line
        elif in_traceback and (line.startswith((" ", "\t")) or not line.strip()):
            kept.append(line)
        else:
            in_traceback = False
    return kept
