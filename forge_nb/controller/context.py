"""RolloutContext: what an episode function may use of its run, typed, handed to ``episode_fn(run, sample)``.

The rollout loops call ``await episode_fn(context, sample)``. The context names what a rollout reads under the
Run's own attribute names (``run.policy``, ``run.ref_model``, ``run.config``, ``run.pad_id``, ``run.reward_fns``,
``run.sampling_overrides``, ``run.task``, ``run.model``, ``run.name``, ``run.version``, ``run.openai``), so an
episode function written against the Run (``async def fn(run, sample)``, reading those names) runs unchanged on
it, while the code of the floors below the Run never holds the Run itself.

What a cell changes while the run trains is read live: ``sampling_overrides`` and ``version`` are properties over
the run's hot changes and weight versions, and ``reward_fns`` lives here (``run.reward_fns`` reads and assigns
this list). The OpenAI endpoint an agent talks to is started by the Run (``Run.serve_openai``), which hands its
starter in when it is made (``serve_openai_with``); ``openai_endpoint()`` returns the endpoint, started on first use.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what the context reads from: only its owners import them (an episode module loads no service)
    from forge_nb.agents.server import OpenAIEndpoint
    from forge_nb.config import RunConfig
    from forge_nb.controller.hot import HotChanges
    from forge_nb.controller.weight_sync import WeightSync
    from forge_nb.rl.rewards import RewardFn
    from forge_nb.rl.types import Episode

__all__ = ["EpisodeFn", "RolloutContext"]


class RolloutContext:
    """What an episode function may use of one run (see the module docstring)."""

    def __init__(self, *, config: RunConfig, task: Any, policy: Any, ref_model: Any, model: str, pad_id: int,
                 hot: HotChanges, sync: WeightSync) -> None:
        self.config, self.name, self.task, self.model, self.pad_id = config, config.name, task, model, pad_id
        self.policy = policy  # the generator service: ``policy.generate.route(prompt, **sampling_overrides)``
        self.ref_model = ref_model  # None without a reference model; a LoRA run's may be its trainer's base
        self.reward_fns: list[RewardFn] = list(task.reward_fns)  # what a cell assigns to run.reward_fns
        self.openai: OpenAIEndpoint | None = None  # the run's OpenAI-compatible endpoint, once started
        self._hot, self._sync = hot, sync
        self._serve: Callable[[], Awaitable[OpenAIEndpoint]] | None = None

    @property
    def sampling_overrides(self) -> dict[str, Any]:
        """Sampling values ``run.set`` changed (temperature, top_p, max_tokens), for ``policy.generate``."""
        return self._hot.sampling

    @property
    def version(self) -> int:
        """The weight version every healthy generator has."""
        return self._sync.version

    def serve_openai_with(self, serve: Callable[[], Awaitable[OpenAIEndpoint]]) -> None:
        """How this run starts its OpenAI endpoint with its defaults: the Run's, given when the Run is made."""
        self._serve = serve

    async def openai_endpoint(self) -> OpenAIEndpoint:
        """The run's OpenAI-compatible endpoint, started on first use (``forge_nb.agents.OpenAIEndpoint``)."""
        if self.openai is not None and self.openai.serving:
            return self.openai
        if self._serve is None:
            raise RuntimeError(f"run {self.name!r} has no OpenAI endpoint to start: give the episode function one "
                               "(agent_episode(agent, endpoint=...)), or play it on a run made by forge_nb.spawn")
        return await self._serve()


EpisodeFn = Callable[[RolloutContext, dict[str, Any]], Awaitable[list["Episode"]]]  # a string: rl.types imports torch
"""``async def fn(run: RolloutContext, sample: dict) -> list[Episode]``: what the rollout loops call for a group."""
