"""SandboxedPythonCoder: run untrusted Python in a separate, limited process; and the environment contract.

The coder actor is what verifiable-reward tasks call to execute a model's code: each ``execute`` runs
``python -I`` in a fresh temporary directory with an empty environment, CPU-time and address-space
limits (``resource.setrlimit``), no stdin, and a wall-clock timeout after which the whole process
group is killed. It returns what a reward function needs: stdout, stderr, exit code, and whether it
timed out. It is CPU-only: spawn it as a service of several replicas
(``SandboxedPythonCoder.options(num_replicas=4).as_service()``).

Custom environments follow a two-endpoint contract as ``ForgeActor`` subclasses: ``reset(seed)``
returns the first observation and ``step(action)`` returns a :class:`StepResult`. ``PythonTaskEnv``
below is a small example on top of the sandbox.
"""

from __future__ import annotations

import asyncio
import os
import resource
import signal
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from monarch.actor import endpoint

from forge_nb.service.actor import ForgeActor


@dataclass(kw_only=True, slots=True)
class ExecResult:
    """What ``execute`` returns. It unpacks as the documents' ``stdout, stderr = await
    coder.execute.route(code)``; ``exit_code`` and ``timed_out`` say the rest."""

    stdout: str
    stderr: str
    exit_code: int | None
    timed_out: bool

    def __iter__(self) -> Iterator[str]:
        return iter((self.stdout, self.stderr))


@dataclass(kw_only=True, slots=True)
class StepResult:
    """What ``Environment.step`` returns."""

    observation: Any
    reward: float
    done: bool
    info: dict[str, Any] = field(default_factory=dict)


def _limit(cpu_s: int, memory_mb: int) -> None:
    """Runs in the child before exec: its own process group, CPU and memory caps."""
    os.setsid()
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
    memory = memory_mb * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))


class SandboxedPythonCoder(ForgeActor):
    """``await coder.execute.route(code)`` -> ExecResult; untrusted code never runs in this process."""

    def __init__(self, timeout_s: float = 5.0, cpu_s: int = 5, memory_mb: int = 512, max_output: int = 10_000):
        self.timeout_s, self.cpu_s, self.memory_mb, self.max_output = timeout_s, cpu_s, memory_mb, max_output

    @endpoint
    async def setup(self) -> None:
        """Validate the limits here, where an error reaches the caller of as_service()."""
        for name in ("timeout_s", "cpu_s", "memory_mb", "max_output"):
            if getattr(self, name) <= 0:
                raise ValueError(f"SandboxedPythonCoder {name}={getattr(self, name)}: must be > 0")

    @endpoint
    async def execute(self, code: str, stdin: str = "", timeout_s: float | None = None) -> ExecResult:
        """Run ``code`` with ``python -I`` under the limits; never raises for what the code does."""
        return await run_sandboxed(code, stdin, timeout_s or self.timeout_s, self.cpu_s, self.memory_mb,
                                   self.max_output)


async def run_sandboxed(code: str, stdin: str = "", timeout_s: float = 5.0, cpu_s: int = 5, memory_mb: int = 512,
                        max_output: int = 10_000) -> ExecResult:
    """The sandbox itself: a separate ``python -I`` process in a temporary directory, limited and timed."""
    if not isinstance(code, str):
        raise TypeError(f"execute(code) takes a string of Python, got {type(code).__name__}")
    with tempfile.TemporaryDirectory(prefix="forge-nb-sandbox-") as workdir:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-I", "-c", code, cwd=workdir, env={"PATH": "/usr/bin:/bin"},
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            preexec_fn=lambda: _limit(cpu_s, memory_mb),
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(stdin.encode()), timeout_s)
            timed_out = False
        except TimeoutError:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = await proc.communicate()
            timed_out = True
    return ExecResult(stdout=out.decode(errors="replace")[:max_output],
                      stderr=err.decode(errors="replace")[:max_output], exit_code=proc.returncode, timed_out=timed_out)


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

    def __init__(self, timeout_s: float = 5.0):
        self.timeout_s = timeout_s
        self.target: int | None = None

    @endpoint
    async def reset(self, seed: int | None = None) -> dict[str, Any]:
        import random

        self.target = random.Random(seed).randint(2, 99)
        return {"prompt": f"Write Python that prints {self.target} squared.", "target": self.target ** 2}

    @endpoint
    async def step(self, action: str) -> StepResult:
        if self.target is None:
            raise RuntimeError("call reset() before step()")
        result = await run_sandboxed(action, timeout_s=self.timeout_s)
        correct = result.stdout.strip() == str(self.target ** 2)
        return StepResult(observation=result.stdout, reward=float(correct), done=True,
                          info={"stderr": result.stderr[-500:], "timed_out": result.timed_out})
