"""The default episode function (one GRPO group, as in the seeds) and a batch's episode metrics.

An episode function is ``async def fn(run, sample) -> list[Episode]``; ``run`` is the run's
:class:`~forge_nb.controller.context.RolloutContext`, which has the Run's names for what a rollout reads:
``run.policy``, ``run.ref_model``, ``run.config``, ``run.pad_id``, ``run.reward_fns`` and
``run.sampling_overrides``. Replace it with ``run.episode_fn = my_fn``.
"""

from __future__ import annotations

import uuid
from types import SimpleNamespace
from typing import Any

import torch

from forge_nb.controller.context import RolloutContext
from forge_nb.metrics import summarize
from forge_nb.rl import Episode, assign_advantages, score
from forge_nb.rl.overlong import add_overlong_penalty


async def generate_episode(run: RolloutContext, sample: dict[str, Any]) -> list[Episode]:
    """One GRPO group: generate, score (with ``rollout.overlong_buffer``, DAPO's soft overlong penalty), reference
    logprobs, group advantages."""
    cfg = run.config
    prompt, target = sample["request"], sample.get("target")
    completions = await run.policy.generate.route(prompt, **run.sampling_overrides)
    group = [
        Episode(episode_id=uuid.uuid4().hex, pad_id=run.pad_id, request_len=cfg.max_req_tokens,
                response_len=cfg.max_res_tokens, target=target, completion=c)
        for c in completions
    ]
    reward_fns = list(run.reward_fns)  # one group, one set of reward functions, whatever a cell changes
    for episode in group:
        result = await score(reward_fns, prompt, episode.completion.text, target, timeout_s=cfg.reward_timeout_s)
        result.apply_to(episode)
    if cfg.rollout.overlong_buffer:  # DAPO's soft overlong penalty, before the advantages
        budget = run.sampling_overrides.get("max_tokens") or cfg.sampling().max_tokens
        add_overlong_penalty(group, budget, cfg.rollout.overlong_buffer, cfg.rollout.overlong_penalty)
    await add_ref_logprobs(run, group)
    assign_advantages(group, method=cfg.advantage)
    return group


class BaseInTrainer:
    """A LoRA run's reference model when it spawned no ReferenceModel service: the trainer's base model, its
    adapters off (``RLTrainer.forward(..., adapters=False)``), in the trainer's own process. It answers
    ``forward.route(input_ids, request_len)`` as the service does, so ``run.ref_model`` reads the same either
    way; no process nor copy of the model more. The run's own episode functions leave it to the trainer: a
    batch without reference logprobs gets the base's at its step, in one forward of the whole batch, instead of
    a call from the kernel for each group (``training.lora.with_base_reference``)."""

    def __init__(self, trainer: Any):
        self.trainer = trainer
        self.forward = SimpleNamespace(route=self._forward)

    async def _forward(self, input_ids: torch.Tensor, request_len: int) -> torch.Tensor:
        return (await self.trainer.forward.call(input_ids, request_len, adapters=False))[0]

    def __repr__(self) -> str:
        return "<the trainer's base model, its LoRA adapters off>"


async def add_ref_logprobs(run: RolloutContext, group: list[Episode]) -> None:
    """The reference model's logprobs of each episode's response, when the run has a ReferenceModel (a LoRA
    run's base is its trainer's, which computes them at the step: ``BaseInTrainer``)."""
    if run.ref_model is None or isinstance(run.ref_model, BaseInTrainer):
        return
    input_ids = torch.stack([torch.cat([e.request_tensor, e.response_tensor]) for e in group])
    ref = await run.ref_model.forward.route(input_ids, run.config.max_req_tokens)
    for episode, logprobs in zip(group, ref, strict=True):
        episode.ref_logprobs = logprobs


def episode_metrics(episodes: list[Episode], version: int) -> dict[str, float]:
    """Reward (total and per function), response length and policy age of a training batch, and the share of it the
    trainer sampled while the generators started (``rollout/from_trainer``, only when there is one)."""
    rewards = [e.reward for e in episodes if e.reward is not None]
    out = summarize(rewards, "reward")
    for name in sorted({name for e in episodes for name in e.rewards}):
        values = [e.rewards[name] for e in episodes if name in e.rewards]
        out[f"reward/{name}"] = sum(values) / len(values)
    lengths = [_policy_tokens(e) for e in episodes if e.completion is not None]
    out.update({k: v for k, v in summarize(lengths, "response_len").items() if k.endswith(("mean", "max"))})
    ages = [version - (e.policy_version or 0) for e in episodes]
    out.update({k: v for k, v in summarize(ages, "policy_age").items() if k.endswith(("mean", "max"))})
    served = [e for e in episodes if e.completion is not None and e.completion.metadata.get("served_by") == "trainer"]
    if served:  # sampled by the trainer while the generators started (controller.lifecycle.stand_in)
        out["rollout/from_trainer"] = len(served) / len(episodes)
    return out | turn_metrics(episodes)


def _policy_tokens(episode: Episode) -> int:
    """Response tokens the policy wrote (a multi-turn episode's observations are not its own)."""
    if episode.policy_mask is not None:
        return int(episode.policy_mask.sum())
    return len(episode.completion.token_ids)


def turn_metrics(episodes: list[Episode]) -> dict[str, float]:
    """Of multi-turn episodes (``completion.metadata["turns"]``): turns per episode, tool calls per episode
    and the share of them that succeeded; nothing for single-turn batches."""
    turns = [e.completion.metadata["turns"] for e in episodes
             if e.completion is not None and "turns" in (e.completion.metadata or {})]
    if not turns:
        return {}
    calls = [t["info"]["tool_ok"] for ts in turns for t in ts if "tool_ok" in t.get("info", {})]
    out = {"turns/mean": sum(map(len, turns)) / len(turns), "tools/calls": len(calls) / len(turns)}
    if calls:
        out["tools/success"] = sum(calls) / len(calls)
    return out


def episode_row(episode: Episode) -> dict[str, Any]:
    """What ``run.episodes()`` and the explorer show of an accepted episode; a multi-turn one also has
    ``turns``: each turn's action, observation (the environment's or a tool's), reward and info; an agent's
    (``agent_episode``) has ``trajectory`` (one id for the segments of one run of the agent) and ``segment``
    (0, 1, ... in the order the agent's conversation made them); one the trainer sampled while the generators
    started has ``served_by``: "trainer"."""
    completion = episode.completion
    row = {"episode_id": episode.episode_id, "prompt": completion.prompt if completion else None,
           "response": completion.text if completion else None, "target": episode.target,
           "reward": episode.reward, "advantage": episode.advantage,
           "version": completion.generator_version if completion else None, "quarantine": episode.quarantine}
    metadata = (completion.metadata if completion is not None else None) or {}
    for key in ("turns", "trajectory", "segment", "served_by"):  # an agent's trajectory, which segment; its sampler
        if key in metadata:
            row[key] = metadata[key]
    return row
