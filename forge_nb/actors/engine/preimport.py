"""vLLM's import in a generator's process, started with the process, without what a CPU generator never uses.

A run's first step waits for its generators: on CPU their chain from process start to the first generation is
~14 s of imports (torch, transformers, vLLM and what they import) and ~1-3 s of engine build, one core's worth of
serial work (``bench/HISTORY.md``, "A core for the generator while a run starts"). :func:`start` runs the
imports in a thread from the actor's ``__init__``, so they overlap the kernel writing the model.

Two optional packages come with that import only because they are installed, and a CPU generator never uses them
(``-X importtime`` of the generator's imports on the project's 2-core machine, out of ~14 s):

- ``opentelemetry.exporter.otlp`` (~0.56 s, with grpc): vLLM's tracing module imports OpenTelemetry's OTLP
  exporters when they import; they export spans only when the engine is given ``otlp_traces_endpoint``.
- ``triton`` (~0.21 s): ``torch._dynamo`` imports it when installed (vLLM imports inductor and with it dynamo);
  vLLM's CPU build then disables it ("Triton is installed, but doesn't include CPU backend"), and torch
  compiles for a CPU with C++, not triton. It is installed for torchtitan's model code and xgrammar.

While vLLM imports, those names are hidden the way Python documents for it: ``sys.modules[name] = None``
makes ``import name`` raise ``ModuleNotFoundError`` and ``importlib.util.find_spec(name)`` return ``None``,
which both libraries treat as not installed. Afterwards the entries are removed again, so a later import in
the process finds the packages as usual. Considered: a ``sys.meta_path`` finder that refuses the names (vLLM
calls ``find_spec("triton")``, which a refusing finder turns into an error rather than ``None``), and
uninstalling the packages (torchtitan and xgrammar require triton; monarch imports OpenTelemetry).
transformers' import-time ``importlib.metadata.packages_distributions()`` (0.5-0.9 s) answers from this machine's
cache inside the thread (:mod:`forge_nb.system.dist_cache`).

Kept out of what vLLM's own configuration needs: a traces endpoint keeps the exporters, a CUDA device or a
triton with a CPU backend keeps triton. ``FORGE_NB_VLLM_LEAN=0`` imports vLLM as it comes: nothing hidden, and
transformers computes ``packages_distributions()`` itself.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
import os
import sys
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from forge_nb.system import dist_cache

#: What a generator's setup() imports; imported here in the order vLLM's engine imports them.
ENGINE_MODULES = ("vllm.v1.engine.llm_engine", "vllm.v1.engine.async_llm", "vllm.renderers.inputs.preprocess")
CPU_WORKER = "vllm.v1.worker.cpu_worker"


def lean() -> bool:
    """Whether the import leaves out what the generator does not use (``FORGE_NB_VLLM_LEAN``, default on)."""
    return os.environ.get("FORGE_NB_VLLM_LEAN", "1") != "0"


def unused_optional(engine_args: Mapping[str, Any] | None, *, cuda: bool) -> list[str]:
    """The optional packages a generator with these engine arguments will not use and has not imported."""
    if not lean():
        return []
    args = engine_args if isinstance(engine_args, Mapping) else {}  # anything else: setup() refuses it
    names = []
    if not args.get("otlp_traces_endpoint"):
        names.append("opentelemetry.exporter.otlp")
    if not cuda and not _triton_has_cpu_backend():
        names.append("triton")
    return [name for name in names if name not in sys.modules]


def _triton_has_cpu_backend() -> bool:
    """Whether the installed triton ships a CPU backend (looked up on disk: importing triton is the cost)."""
    try:
        spec = importlib.util.find_spec("triton")
    except (ImportError, ValueError):
        return False
    places = spec.submodule_search_locations if spec is not None else None
    return any((Path(place) / "backends" / "cpu").is_dir() for place in places or ())


class _HiddenTritonNote(logging.Filter):
    """torch notes each triton op vLLM registers when it cannot import triton; here that is by design."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Triton not available" not in record.getMessage()


@contextlib.contextmanager
def hidden(names: list[str]) -> Iterator[None]:
    """``import name`` fails as if not installed, for each of ``names``, inside the block."""
    for name in names:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]
    note, torch_triton = _HiddenTritonNote(), logging.getLogger("torch._library.triton")
    if "triton" in names:
        torch_triton.addFilter(note)
    try:
        yield
    finally:
        torch_triton.removeFilter(note)  # a filter never added is no error
        for name in names:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]


def import_engine(hide: list[str], *, cuda: bool) -> None:
    """Import the vLLM modules a generator's setup needs, with ``hide`` hidden; an error is left for setup's
    own import to raise, with its traceback where the user sees it."""
    modules = ENGINE_MODULES if cuda else (*ENGINE_MODULES, CPU_WORKER)
    cached = dist_cache.cached_packages_distributions() if lean() else contextlib.nullcontext()
    with hidden(hide), cached:
        for module in modules:
            try:
                importlib.import_module(module)
            except Exception:
                return


def start(engine_args: Mapping[str, Any] | None) -> threading.Thread:
    """Start vLLM's import in a daemon thread; join it before using vLLM (one thread imports at a time)."""
    import torch

    cuda = torch.cuda.is_available()
    thread = threading.Thread(target=import_engine, args=(unused_optional(engine_args, cuda=cuda),),
                              kwargs={"cuda": cuda}, name="forge_nb.vllm-import", daemon=True)
    thread.start()
    return thread
