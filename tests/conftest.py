"""Shared fixtures: real monarch meshes on CPU, cleaned up after every test."""

from __future__ import annotations

import os

import pytest

from forge_nb.system.processes.procs import pid_alive
from forge_nb.system.runtime import lifecycle as _lifecycle

# As `%load_ext forge_nb` does in a notebook: start forge_nb before any test module imports monarch,
# so monarch's own supervision runs at its ~1 s setting.
_lifecycle.ensure_started()

# Tests never reach a model hub; everything they load is built locally.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# Each test's runs start from processes of their own, as tests that count, kill or time processes expect;
# tests/run/test_warm.py keeps them warm between runs (forge_nb.system.runtime.warm), as a kernel does by
# default.
os.environ.setdefault("FORGE_NB_KEEP_WARM_S", "0")
# Actor classes defined under tests/ travel by reference: spawned procs must be able to import them.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in [_ROOT, os.environ.get("PYTHONPATH")] if p)


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


requires_cuda = pytest.mark.skipif("not __import__('torch').cuda.is_available()", reason="needs CUDA")


@pytest.fixture
async def runtime():
    """The forge_nb runtime started, with every mesh a test spawned stopped (and its pids gone) afterwards. Tests
    call the runtime's modules themselves (``forge_nb.system.runtime.spawning``, ``.registry``...)."""
    from forge_nb.system.runtime import registry

    _lifecycle.ensure_started()
    yield
    leftovers = registry.meshes()
    pids = [p for m in leftovers for p in m.pids]
    await registry.stop_all(timeout=10)
    assert not [p for p in pids if pid_alive(p)], "a test left processes running"


@pytest.fixture
async def no_store(runtime, tmp_path, monkeypatch):
    """No torchstore and no store lease before or after (another test's may linger in this process)."""
    from forge_nb import weights

    monkeypatch.setenv("FORGE_NB_SHM_DIR", str(tmp_path / "shm"))
    await weights.shutdown_store()
    yield
    await weights.shutdown_store()


# -- ending the test process ---------------------------------------------------------------------------
# monarch 0.7's exit-time teardown can turn a passing session into exit status 1, printing nothing (see
# lifecycle.end_process). So the session ends here, with pytest's own status, once everything pytest
# does at the end (the summary, the other plugins' unconfigure) is done.
_session = pytest.StashKey[pytest.Session]()


def pytest_sessionfinish(session: pytest.Session) -> None:
    session.config.stash[_session] = session


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    session = config.stash.get(_session, None)
    if session is not None:
        capture = config.pluginmanager.getplugin("capturemanager")
        if capture is not None:
            capture.stop_global_capturing()
        _lifecycle.end_process(int(session.exitstatus))
