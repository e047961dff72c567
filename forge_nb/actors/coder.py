"""SandboxedPythonCoder: run model-written Python inside a bubblewrap sandbox; and the environment contract.

The coder actor is what verifiable-reward tasks call to execute a model's code: each ``execute`` runs
``python -I -u`` in a fresh bubblewrap sandbox (new user, pid, network, mount, IPC and UTS namespaces, a
read-only interpreter, private size-capped ``/tmp`` and ``/dev/shm``, no home, no run directories, no
network) under limits on processes, memory, CPU time and wall time; see ``_sandbox`` for what the code can
see and why. It returns what a reward function needs: stdout, stderr (what was printed before a timeout
included), exit code, and whether it timed out. It is CPU-only: spawn it as a service of several replicas
(``SandboxedPythonCoder.options(num_replicas=4).as_service()``). Without ``bwrap`` on the machine it
refuses to start and says how to install it; ``isolation="none"`` opts out of isolation, with a warning.

Custom environments follow a two-endpoint contract as ``ForgeActor`` subclasses: ``reset(seed)``
returns the first observation and ``step(action)`` returns a :class:`StepResult`. ``PythonTaskEnv``
below is a small example on top of the sandbox.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from monarch.actor import endpoint

from forge_nb.actors._sandbox import INSTALL_HINT, ISOLATIONS, ExecResult, Isolation, missing_tools, run_sandboxed
from forge_nb.service.actor import ForgeActor

if TYPE_CHECKING:
    from forge_nb.service.service import ActorHandle, Service

__all__ = ["Environment", "ExecResult", "PythonTaskEnv", "SandboxedPythonCoder", "StepResult", "run_sandboxed"]

_UNISOLATED = ("SandboxedPythonCoder(isolation='none'): model-written code will run with CPU and memory limits "
               "only, as this machine's user, able to read your files and keys, the kernel's connection file and "
               "the run directories, and to reach the network. Use it only for code you trust; install bubblewrap "
               "(`apt-get install -y bubblewrap`) and drop isolation='none' for anything else.")


@dataclass(kw_only=True, slots=True)
class StepResult:
    """What ``Environment.step`` returns."""

    observation: Any
    reward: float
    done: bool
    info: dict[str, Any] = field(default_factory=dict)


def check_isolation(isolation: str) -> None:
    """Raise when ``isolation`` is unknown or cannot run here; warn when it is ``"none"``."""
    if isolation not in ISOLATIONS:
        raise ValueError(f"isolation={isolation!r}: use 'bwrap' (the default) or 'none' (no isolation)")
    if isolation == "none":
        warnings.warn(_UNISOLATED, RuntimeWarning, stacklevel=3)
    elif missing := missing_tools():
        raise RuntimeError(f"{INSTALL_HINT} (missing: {', '.join(missing)})")


class SandboxedPythonCoder(ForgeActor):
    """``await coder.execute.route(code)`` -> ExecResult; untrusted code never runs in this process.

    Limits per execution: ``timeout_s`` wall clock, ``cpu_s`` CPU seconds and ``memory_mb`` address space per
    process, ``max_procs`` processes and threads, ``tmp_mb`` MiB for each of ``/tmp`` and ``/dev/shm``, and
    ``max_output`` characters kept of stdout and of stderr.
    """

    def __init__(self, timeout_s: float = 5.0, cpu_s: int = 5, memory_mb: int = 512, max_output: int = 10_000, *,
                 max_procs: int = 32, tmp_mb: int = 64, isolation: Isolation = "bwrap"):
        self.timeout_s, self.cpu_s, self.memory_mb, self.max_output = timeout_s, cpu_s, memory_mb, max_output
        self.max_procs, self.tmp_mb, self.isolation = max_procs, tmp_mb, isolation

    @classmethod
    async def as_service(cls, *args: Any, **kwargs: Any) -> Service:
        check_isolation(kwargs.get("isolation", "bwrap"))  # here, so the warning reaches the user's cell
        return await super().as_service(*args, **kwargs)

    @classmethod
    async def as_actor(cls, *args: Any, **kwargs: Any) -> ActorHandle:
        check_isolation(kwargs.get("isolation", "bwrap"))
        return await super().as_actor(*args, **kwargs)

    @endpoint
    async def setup(self) -> None:
        """Validate the limits and the sandbox here, where an error reaches the caller of as_service()."""
        for name in ("timeout_s", "cpu_s", "memory_mb", "max_output", "max_procs", "tmp_mb"):
            if getattr(self, name) <= 0:
                raise ValueError(f"SandboxedPythonCoder {name}={getattr(self, name)}: must be > 0")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the caller's process warned already
            check_isolation(self.isolation)
        if self.isolation == "bwrap":  # bwrap can be present yet refused (user namespaces disabled)
            probe = await run_sandboxed("print(6 * 7)", timeout_s=max(self.timeout_s, 10.0))
            if probe.stdout != "42\n":
                raise RuntimeError(
                    "SandboxedPythonCoder: bubblewrap is installed but could not start a sandbox here "
                    f"(exit {probe.exit_code}): {probe.stderr.strip()[-800:]}\nUser namespaces may be disabled: "
                    "check `sysctl user.max_user_namespaces` (must be > 0), "
                    "`sysctl kernel.apparmor_restrict_unprivileged_userns` (must be 0) and, in a container, "
                    "its seccomp profile; or pass isolation='none' for trusted code only.")

    @endpoint
    async def execute(self, code: str, stdin: str = "", timeout_s: float | None = None) -> ExecResult:
        """Run ``code`` in a fresh sandbox under the limits; never raises for what the code does."""
        return await run_sandboxed(code, stdin, timeout_s or self.timeout_s, self.cpu_s, self.memory_mb,
                                   self.max_output, max_procs=self.max_procs, tmp_mb=self.tmp_mb,
                                   isolation=self.isolation)


class Environment(ForgeActor):
    """Base of custom environments: override ``reset`` and ``step`` (both endpoints)."""

    @endpoint
    async def reset(self, seed: int | None = None) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must define reset(seed) -> observation")

    @endpoint
    async def step(self, action: Any) -> StepResult:
        raise NotImplementedError(f"{type(self).__name__} must define step(action) -> StepResult")


class PythonTaskEnv(Environment):
    """Asks for a program printing a target number; reward 1 when its output is exactly that number."""

    def __init__(self, timeout_s: float = 5.0, *, isolation: Isolation = "bwrap"):
        self.timeout_s, self.isolation = timeout_s, isolation
        self.target: int | None = None

    @endpoint
    async def setup(self) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            check_isolation(self.isolation)

    @endpoint
    async def reset(self, seed: int | None = None) -> dict[str, Any]:
        import random

        self.target = random.Random(seed).randint(2, 99)
        return {"prompt": f"Write Python that prints {self.target} squared.", "target": self.target ** 2}

    @endpoint
    async def step(self, action: str) -> StepResult:
        if self.target is None:
            raise RuntimeError("call reset() before step()")
        result = await run_sandboxed(action, timeout_s=self.timeout_s, isolation=self.isolation)
        correct = result.stdout.strip() == str(self.target ** 2)
        return StepResult(observation=result.stdout, reward=float(correct), done=True,
                          info={"stderr": result.stderr[-500:], "timed_out": result.timed_out})
