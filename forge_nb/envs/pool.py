"""EnvPool: an environment service whose replicas each hold one environment object per trajectory."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from monarch.actor import endpoint

from forge_nb.actors.coder import StepResult
from forge_nb.service.actor import ForgeActor
from forge_nb.system.monarch_compat import await_maybe

__all__ = ["EnvPool", "TextEnv"]


class TextEnv(Protocol):
    """What EnvPool hosts: ``reset`` and ``step`` may be plain or async methods."""

    def reset(self, seed: int | None = None) -> str: ...

    def step(self, action: str) -> StepResult | tuple[str, float, bool]: ...


class EnvPool(ForgeActor):
    """``EnvPool.options(num_replicas=2).as_service(factory, **kwargs)``: ``factory(**kwargs)`` makes one
    environment per trajectory (a class, or any picklable callable; define it in an importable module, as
    the processes import it by name).

    Endpoints: ``reset(trajectory, seed)`` -> the first observation, ``step(trajectory, action)`` ->
    :class:`StepResult`, ``close(trajectory)``. ``step`` on a trajectory this replica does not hold (its
    replica died and the call moved here) is a KeyError that says so: the episode drops the trajectory.
    """

    def __init__(self, factory: Callable[..., Any], max_open: int = 4096, **kwargs: Any):
        if not callable(factory):
            raise TypeError(f"EnvPool(factory={factory!r}): pass a class or function that makes an environment")
        self.factory, self.kwargs, self.max_open = factory, kwargs, max_open
        self.envs: dict[str, Any] = {}

    @endpoint
    async def reset(self, trajectory: str, seed: int | None = None) -> str:
        if trajectory not in self.envs and len(self.envs) >= self.max_open:
            raise RuntimeError(f"EnvPool holds {self.max_open} open trajectories: close() finished ones "
                               "(multi_turn_episode does), or raise max_open")
        env = self.envs[trajectory] = self.factory(**self.kwargs)
        return await await_maybe(env.reset(seed))

    @endpoint
    async def step(self, trajectory: str, action: str) -> StepResult:
        try:
            env = self.envs[trajectory]
        except KeyError:
            raise KeyError(f"trajectory {trajectory!r} is not open on this replica (was its replica restarted?); "
                           "call reset() first") from None
        result = await await_maybe(env.step(action))
        if isinstance(result, StepResult):
            return result
        observation, reward, done, *info = result  # the documents' (observation, reward, done)
        return StepResult(observation=observation, reward=float(reward), done=bool(done),
                          info=dict(info[0]) if info else {})

    @endpoint
    async def close(self, trajectory: str) -> None:
        env = self.envs.pop(trajectory, None)
        if env is not None and hasattr(env, "close"):
            await await_maybe(env.close())

    @endpoint
    async def open_trajectories(self) -> int:
        return len(self.envs)
