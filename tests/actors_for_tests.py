"""Small actors the tests spawn in real monarch procs (importable there by module path)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from monarch.actor import Actor, endpoint

from forge_nb.system.monarch_compat import async_endpoints


@async_endpoints
class Mixed(Actor):
    """A sync and an async endpoint side by side: monarch alone refuses this class."""

    @endpoint
    def add(self, a: int, b: int) -> int:
        return a + b

    @endpoint
    async def add_later(self, a: int, b: int) -> int:
        return a + b


class StoreUser(Actor):
    @endpoint
    async def pid(self) -> int:
        return os.getpid()

    @endpoint
    async def checksum(self, key: str) -> float:
        from forge_nb.weights.torchstore import ts

        sd = await ts.get_state_dict(key)
        return float(sum(v.sum() for v in sd.values()))

    @endpoint
    async def write(self, key: str, value: float) -> None:
        import torch

        from forge_nb.weights.torchstore import ts

        await ts.put_state_dict({"w": torch.full((5, 5), value)}, key)


class Sleeper(Actor):
    @endpoint
    async def sleep(self, seconds: float) -> float:
        import asyncio

        await asyncio.sleep(seconds)
        return seconds


# -- service tests -------------------------------------------------------------------------------

from forge_nb.service import ForgeActor  # noqa: E402


class Squarer(ForgeActor):
    """``square`` and its batch form (``batched_endpoints``), counting the messages each one received."""

    batched_endpoints = {"square": "square_many"}

    def __init__(self) -> None:
        self.messages = {"square": 0, "square_many": 0}
        self.batches: list[list[int]] = []

    @endpoint
    async def square(self, x: int, offset: int = 0) -> int:
        self.messages["square"] += 1
        return _square(x, offset)

    @endpoint
    async def square_many(self, xs: list[int], offset: int = 0) -> list[int | Exception]:
        self.messages["square_many"] += 1
        self.batches.append(list(xs))
        out: list[int | Exception] = []
        for x in xs:
            try:
                out.append(_square(x, offset))
            except ValueError as e:
                out.append(e)
        return out

    @endpoint
    async def received(self) -> dict[str, Any]:
        return {"messages": dict(self.messages), "batches": self.batches}


class OwnSquare(Squarer):
    """Overrides ``square`` only: its service must not send ``square_many`` for it."""

    @endpoint
    async def square(self, x: int, offset: int = 0) -> int:
        return -x


def _square(x: int, offset: int) -> int:
    if x < 0:
        raise ValueError(f"negative: {x}")
    return x * x + offset


class Worker(ForgeActor):
    """Sleeps, then records the request in a separate Ledger actor, so retries can be audited."""

    def __init__(self, ledger=None, crash_marker: str | None = None):
        self.ledger = ledger
        self.crash_marker = crash_marker
        self.setups = 0

    @endpoint
    async def setup(self) -> None:
        if self.crash_marker and os.path.exists(self.crash_marker):
            os._exit(3)  # a replica that cannot come back
        self.setups += 1

    @endpoint
    def pid(self) -> int:  # a sync endpoint beside async ones
        return os.getpid()

    @endpoint
    async def where(self) -> tuple[str | None, int, int]:
        """(the job host forge_nb placed this proc on, its pid, its session: a ProcessJob host's worker)."""
        return os.environ.get("FORGE_NB_HOST"), os.getpid(), os.getsid(0)

    @endpoint
    async def work(self, request_id: int, delay: float = 0.0) -> int:
        import asyncio

        await asyncio.sleep(delay)
        if self.ledger is not None:
            await self.ledger.record.call_one(request_id, os.getpid())
        return os.getpid()

    @endpoint
    async def fail(self, message: str) -> None:
        raise ValueError(message)

    @endpoint
    async def slow_in(self, pid: int, seconds: float) -> int:
        """Answers at once, except in process ``pid``, which takes ``seconds`` (a hang, when long)."""
        import asyncio

        if os.getpid() == pid:
            await asyncio.sleep(seconds)
        return os.getpid()

    @endpoint
    async def get_setups(self) -> int:
        return self.setups

    @endpoint
    async def load(self, version: int) -> int:
        self.version = version
        return version

    @endpoint
    async def get_loaded(self) -> int:
        return getattr(self, "version", -1)


class Ledger(ForgeActor):
    def __init__(self):
        self.records: list[tuple[int, int]] = []

    @endpoint
    async def record(self, request_id: int, pid: int) -> None:
        self.records.append((request_id, pid))

    @endpoint
    async def all(self) -> list[tuple[int, int]]:
        return list(self.records)


class WeightsReader(Actor):
    @endpoint
    async def checksums(self, version: int) -> dict[str, float]:
        from forge_nb import weights

        return {k: float(v.float().sum()) for k, v in (await weights.load_state_dict(version)).items()}

    @endpoint
    async def checksums_open(self, version: int) -> tuple[dict[str, float], int]:
        """Checksums through ``open_version`` (the generators' path), and how many files it keeps mapped."""
        from forge_nb import weights
        from forge_nb.weights import shm

        with await weights.open_version(version) as state_dict:
            sums = {k: float(v.float().sum()) for k, v in state_dict.items()}
        return sums, len(shm._reader_maps)

    @endpoint
    async def checksums_on_gpu(self, version: int) -> tuple[dict[str, float], int]:
        """Copy ``version`` into GPU tensors as a GPU generator does; the checksums, and how many of this
        process's mappings are page-locked for CUDA."""
        import torch

        from forge_nb import weights
        from forge_nb.weights import shm

        torch.cuda.init()
        with await weights.open_version(version) as state_dict:
            on_gpu = {k: v.to("cuda") for k, v in state_dict.items()}
        return {k: float(v.float().sum()) for k, v in on_gpu.items()}, len(shm._pinned)

    @endpoint
    async def hold(self, version: int) -> None:
        """Load ``version`` and keep its views alive, as a slow consumer would."""
        from forge_nb import weights

        self.held = await weights.load_state_dict(version)

    @endpoint
    async def held_checksums(self) -> dict[str, float]:
        return {k: float(v.float().sum()) for k, v in self.held.items()}

    @endpoint
    async def release(self) -> None:
        del self.held


class Parent(Actor):
    """Starts a child process of its own, as a vLLM generator starts its engine and workers."""

    @endpoint
    async def start_child(self) -> int:
        import subprocess

        self.child = subprocess.Popen(["sleep", "600"])
        return self.child.pid


# -- the TorchForge documents' custom environment, and actors whose construction fails ----------------

from forge_nb import ForgeActor as DocActor  # noqa: E402  # the documents' import, changed as issue 18 allows


class CustomEnv(DocActor):
    """rl_workflows.md's environment as written there: ``__init__`` calls its own ``reset`` endpoint."""

    def __init__(self, goal: int = 3):
        self.goal = goal
        self.state = self.reset()

    @endpoint
    async def reset(self):
        """Reset environment to initial state."""
        self.position = 0
        return self.position

    @endpoint
    async def step(self, action):
        """Execute action and return (observation, reward, done)."""
        self.position += action
        done = self.position >= self.goal
        return self.position, (1.0 if done else 0.0), done

    @endpoint
    async def initial_state(self):
        return self.state

    @endpoint
    async def restart(self):
        """An endpoint awaiting another one of its own actor, as ``await self.reset()``."""
        return await self.reset(), self.describe()

    @endpoint
    def describe(self) -> str:  # a sync endpoint, called on ``self``, stays synchronous
        return f"goal={self.goal}"


def _check_size(size: int) -> None:
    if size > 10:
        raise ValueError(f"size={size} is too large for this environment")


class BadInitEnv(ForgeActor):
    """Raises in ``__init__`` (one call deep, so the traceback has a frame of the user's own)."""

    def __init__(self, size: int = 100):
        _check_size(size)

    @endpoint
    async def reset(self):
        return 0


class BadSetupEnv(ForgeActor):
    @endpoint
    async def setup(self) -> None:
        raise KeyError("no such task: 'tic-tac-toe'")


class WaitingInitEnv(ForgeActor):
    """Calls an endpoint from ``__init__`` that has to wait (the documents' pattern with real I/O)."""

    def __init__(self):
        self.state = self.reset()

    @endpoint
    async def reset(self):
        import asyncio

        await asyncio.sleep(0.01)
        return 0


# -- the documents' data-side actors (tests/actors/test_seed_data_actors.py) ------------------------

from forge_nb.rl.grading import RewardActor as _GradingRewardActor  # noqa: E402


class ExactAnswerGrader(_GradingRewardActor):
    """The skill card's form: a RewardActor subclass that only defines grade()."""

    def grade(self, prompt: str, completion: str, metadata: dict) -> float:
        return 1.0 if completion.strip() == str(metadata.get("answer", "")) else 0.0


def flaky_reward(prompt: str, response: str, target: object) -> float:
    """1.0, except that it raises on "CRASH" and returns NaN on "NAN" in the response."""
    if "CRASH" in response:
        raise RuntimeError("grader crashed")
    return float("nan") if "NAN" in response else 1.0


# -- trainer with a TorchForge-signature loss (the skill card's Workflow 2 CustomLoss) ---------------------

import torch  # noqa: E402

from forge_nb.rl.loss.ops import aggregate, compute_kl, compute_logprobs, compute_ratio  # noqa: E402


class CustomLoss:
    """The TorchForge skill card's CustomLoss, with `forge` imports changed to `forge_nb`."""

    def __init__(self, clip_range: float = 0.2, beta: float = 0.1):
        self.clip_range = clip_range
        self.beta = beta

    def __call__(
        self,
        logits: torch.Tensor,
        target_ids: torch.Tensor,
        advantages: torch.Tensor,
        generator_logprobs: torch.Tensor,
        loss_mask: torch.Tensor,
        ref_logprobs: torch.Tensor,
    ) -> tuple[torch.Tensor, dict]:
        logprobs = compute_logprobs(logits, target_ids)
        ratio = compute_ratio(logprobs, generator_logprobs, loss_mask)
        clipped_ratio = torch.clamp(ratio, 1 - self.clip_range, 1 + self.clip_range)
        pg_loss = -torch.min(ratio * advantages, clipped_ratio * advantages)
        kl = compute_kl(logprobs, ref_logprobs, loss_mask)
        loss = aggregate(pg_loss + self.beta * kl, loss_mask)
        metrics = {
            "pg_loss": aggregate(pg_loss, loss_mask).item(),
            "kl": kl.mean().item(),
            "ratio_mean": ratio.mean().item(),
        }
        return loss, metrics


class Printer(Actor):
    """Writes to its process's stdout and stderr, as vLLM and torch do."""

    @endpoint
    async def say(self, text: str) -> int:
        import sys

        print(f"stdout {text}")
        print(f"WARNING stderr {text}", file=sys.stderr)
        os.system(f"echo child-process {text}")  # a child process (like vLLM's engine) inherits the file
        return os.getpid()

    @endpoint
    async def bar(self, text: str) -> tuple[list[str], list[str]]:
        """A tqdm progress bar, as vLLM's and transformers' weight loading draw one -> (the named semaphores
        this process maps, the command lines of its children)."""
        import psutil
        from tqdm.auto import tqdm

        for _ in tqdm(range(3), desc=text):
            pass
        with open("/proc/self/maps") as f:
            semaphores = sorted({line.split(None, 5)[5].strip() for line in f if "/dev/shm/sem." in line})
        return semaphores, [" ".join(child.cmdline()) for child in psutil.Process().children()]


class SlowEchoEnv:
    """forge_nb.envs.EchoEnv whose steps take ``delay_s``: time to kill its replica mid-trajectory."""

    def __init__(self, delay_s: float = 0.5, **kwargs):
        from forge_nb.envs import EchoEnv

        self.env, self.delay_s = EchoEnv(**kwargs), delay_s

    def reset(self, seed=None):
        return self.env.reset(seed)

    async def step(self, action):
        await asyncio.sleep(self.delay_s)
        return self.env.step(action)


from forge_nb.actors.generator import Generator  # noqa: E402


def _break_model(worker: Any) -> None:
    """The model's forward raises from now on, so vLLM's next step fails inside vLLM. (Dropping the model, as
    this did, failed a request before any step when the engine had not served one yet: vLLM reads which tasks
    a model supports from it on the first request, and with no model it refused "generation" instead.)"""
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the test broke this engine's model")

    worker.model_runner.model.forward = broken


class BreakableGenerator(Generator):
    """A Generator whose vLLM engine a test breaks from outside: ``break_engine()`` asks the engine's
    worker (in the actor's process on CPU) to break its model, so vLLM's next step raises inside vLLM
    itself, the failure the Generator must survive by ending its process (the service respawns it)."""

    @endpoint
    async def break_engine(self) -> None:
        await self._require_engine("break_engine").collective_rpc(_break_model)


class GcProbe(ForgeActor):
    """How its process's garbage collector is set while its ``setup`` runs and after
    (forge_nb.system.processes.startup_gc)."""

    @endpoint
    async def setup(self) -> None:
        import gc

        from forge_nb.system.processes import startup_gc

        self.during_setup = {"paused": startup_gc.paused(), "threshold": gc.get_threshold()}

    @endpoint
    async def gc_state(self) -> dict[str, Any]:
        import gc

        from forge_nb.system.processes import startup_gc

        return {"during_setup": getattr(self, "during_setup", None), "paused": startup_gc.paused(),
                "threshold": gc.get_threshold(), "frozen": gc.get_freeze_count()}
