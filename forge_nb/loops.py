"""The rollout and training loops a Run keeps as named asyncio tasks, and the default episode function.

::

    task.sample() ──> episode_fn(run, sample) ──> run.accept(group) ──> ReplayBuffer
      (N rollout loops: generate, score, reference logprobs, advantages)        │ sample(version)
                                                                                 v
    generators <── update_weights.fanout(v) <── trainer.push_weights(v) <── trainer.train_step(batch)
                                  (one training loop; hot changes applied between steps)

Backpressure: in "async" mode rollouts run ahead of training by at most ``max_policy_age + 1``
batches (more would only be evicted as stale, and on a small machine they take the trainer's CPU);
the buffer drops episodes older than ``max_policy_age`` versions. In "sync" mode rollouts stop once
a batch is collected and wait for the training step and weight update (lockstep). Both modes use
the same episode function, which a user may replace: ``async def my_episode(run, sample) -> list[Episode]``.

Each loop checks ``run`` at its boundaries: a paused run stops rollouts after their in-flight
generation and training after the current step. A loop that raises stops the run with its error
(``Run._loop_done``); nothing here swallows an exception.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from typing import TYPE_CHECKING, Any

import torch

from forge_nb.metrics import summarize
from forge_nb.rl import Episode, assign_advantages, collate, score
from forge_nb.service import ReplicaDied

if TYPE_CHECKING:
    from forge_nb.run import Run


async def generate_episode(run: Run, sample: dict[str, Any]) -> list[Episode]:
    """One GRPO group, as in the seeds: generate, score, reference logprobs, group advantages."""
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
        (await score(reward_fns, prompt, episode.completion.text, target)).apply_to(episode)
    if run.ref_model is not None:
        input_ids = torch.stack([torch.cat([e.request_tensor, e.response_tensor]) for e in group])
        ref = await run.ref_model.forward.route(input_ids, cfg.max_req_tokens)
        for episode, logprobs in zip(group, ref, strict=True):
            episode.ref_logprobs = logprobs
    assign_advantages(group, method=cfg.advantage)
    return group


async def rollout_loop(run: Run, index: int) -> None:
    """Sample a prompt, make a group, hand it to the run; forever, pausing when the run pauses."""
    while True:
        await run.wait_until_running()
        await run.collect_allowed.wait()
        sample = run.task.sample()
        rewinds = run.rewinds
        group = await run.episode_fn(run, sample)
        run.accept(group, rewinds_before=rewinds)


async def training_loop(run: Run) -> None:
    """Train on a batch, push the weights, update every generator; one step at a time."""
    try:
        await _train_forever(run)
    finally:  # cancelled mid-step or failed: either way no step is in flight any more
        run.training_idle.set()


async def _train_forever(run: Run) -> None:
    cfg = run.config
    waited_since = time.monotonic()
    starved_reported = False
    while True:
        if not await _step_boundary(run):
            continue
        batch = run.replay_buffer.sample(curr_policy_version=run.version)
        if batch is None:
            run.training_idle.set()  # nothing sampled: waiting for a batch is a safe place to stop
            run.collect_allowed.set()  # stale episodes were just evicted: room for fresh ones
            if not starved_reported and time.monotonic() - waited_since > cfg.loop.starved_after_s:
                run.metrics.event("starved", waited_s=round(time.monotonic() - waited_since, 1),
                                  message="the trainer has waited for a batch; are the generators healthy?")
                starved_reported = True
            # wake up by the starvation deadline at the latest, so a trainer that waits forever says so
            waited = time.monotonic() - waited_since
            patience = 1.0 if starved_reported else max(0.05, cfg.loop.starved_after_s - waited)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(run.batch_ready.wait(), patience)
            run.batch_ready.clear()
            continue
        sync = cfg.loop.mode == "sync"
        if not sync:
            run.collect_allowed.set()  # a batch left the buffer: rollouts may refill it while we train
        wait_s = time.monotonic() - waited_since
        await train_one_step(run, [e for shard in batch for e in shard], wait_s)
        if sync:
            run.collect_allowed.set()  # lockstep: the next batch is generated by the new weights
        waited_since, starved_reported = time.monotonic(), False
        if run.step_budget_spent():
            continue
        if cfg.loop.max_steps is not None and run.current_step >= cfg.loop.max_steps:
            run.metrics.event("done", message=f"reached loop.max_steps={cfg.loop.max_steps}")
            run.pause()


async def _step_boundary(run: Run) -> bool:
    """What the RL and SFT training loops do between steps: park (``training_idle`` set, so ``stop()``
    may cancel the loop) until the run is running; from then on a step may be in flight, so ``stop()``
    waits for it instead. A trainer that died meanwhile rewinds the run first (False: start over);
    otherwise the queued hot changes are applied and the step may begin (True)."""
    run.training_idle.set()
    await run.wait_until_running()
    run.training_idle.clear()
    if await run.recover_trainer_if_it_died():
        return False
    await run.apply_changes()
    return True


async def train_one_step(run: Run, episodes: list[Episode], wait_s: float) -> dict[str, Any]:
    """train_step -> push_weights -> update_weights.fanout, with the step's metrics recorded."""
    t0 = time.perf_counter()
    episode_metrics = _episode_metrics(run, episodes)  # policy age against the version that trains them
    run.count("in_step", len(episodes))  # the ledger balances while the step runs, too
    try:
        results = await run.trainer.train_step.call(collate(episodes))
    except ReplicaDied as error:  # the step is lost with its process; rewind to the last checkpoint
        run.settle_step("trainer_died", len(episodes))
        await run.recover_trainer(str(error))
        return {}
    except Exception:  # the trainer raised: the run stops with this error (Run._loop_done)
        run.settle_step("failed_step", len(episodes))
        raise
    out = dict(results[0].metrics)
    t1 = time.perf_counter()
    if _skipped(run, out):
        run.settle_step("skipped_step", len(episodes))
    else:
        run.settle_step("trained", len(episodes))
        if not await _publish(run, out, t1):
            return {}
    out.update(episode_metrics)
    out["tokens_per_s/generate"] = run.take_generated_tokens_per_s()
    for name, value in run.replay_buffer.counters().items():
        out[f"buffer/{name}"] = value
    return await _record_step(run, out, t0, t1, wait_s)


def _skipped(run: Run, out: dict[str, Any]) -> bool:
    """Whether the trainer skipped the step (non-finite loss or gradient); records a "skip" event if so."""
    if not out.get("skipped"):
        return False
    reason = next((k.split("/", 1)[1] for k in out if k.startswith("skipped/")), "non-finite")
    run.metrics.event("skip", step=run.current_step + 1, reason=reason, loss=out.get("loss"))
    return True


async def _publish(run: Run, out: dict[str, Any], t1: float) -> bool:
    """Push the trained weights as the next version and load them on every generator; False when the
    trainer died before its push (the run has then rewound to its last checkpoint)."""
    version = run.version + 1
    try:
        await run.trainer.push_weights.call(version)
    except ReplicaDied as error:  # trained but not pushed: the checkpoint is the truth
        await run.recover_trainer(str(error))
        return False
    t2 = time.perf_counter()
    await run.policy.update_weights.fanout(version)
    run.set_version(version)
    out["time/push_s"], out["time/update_s"] = t2 - t1, time.perf_counter() - t2
    out["weight_sync_s"] = time.perf_counter() - t1
    await run.drop_old_weights()
    return True


async def _record_step(run: Run, out: dict[str, Any], t0: float, t1: float, wait_s: float) -> dict[str, Any]:
    """Count the step, record its row (timings, version, buffer, training tokens/s), then the run's
    periodic work (evaluation, checkpoint)."""
    run.current_step += 1
    out.update({"time/wait_batch_s": wait_s, "time/train_s": t1 - t0, "time/step_s": time.perf_counter() - t0,
                "version": run.version, "buffer/size": len(run.replay_buffer)})
    out["tokens_per_s/train"] = (out.get("tokens") or 0) / max(t1 - t0, 1e-9)
    run.metrics.record(run.current_step, out)
    await run.after_step()
    return out


async def sft_loop(run: Run) -> None:
    """Supervised steps on ``run.sft_data`` (see ``forge_nb.sft``), with the RL loop's controls: it pauses
    at step boundaries, honours ``run.step(n)`` and ``run.set(lr=...)``, pushes every step's weights."""
    try:
        while True:
            if not await _step_boundary(run):
                continue
            await sft_one_step(run, run.sft_data.next_batch())
            run.step_budget_spent()
    finally:
        run.training_idle.set()


async def sft_one_step(run: Run, batch: dict[str, torch.Tensor]) -> dict[str, Any]:
    """trainer.sft_step -> push_weights -> update_weights.fanout; the row carries ``sft=1``."""
    t0 = time.perf_counter()
    try:
        results = await run.trainer.sft_step.call(batch)
    except ReplicaDied as error:
        await run.recover_trainer(str(error))
        return {}
    out = {**results[0].metrics, "sft": 1.0}
    t1 = time.perf_counter()
    if not _skipped(run, out) and not await _publish(run, out, t1):
        return {}
    return await _record_step(run, out, t0, t1, 0.0)


def _episode_metrics(run: Run, episodes: list[Episode]) -> dict[str, float]:
    rewards = [e.reward for e in episodes if e.reward is not None]
    out = summarize(rewards, "reward")
    names = {name for e in episodes for name in e.rewards}
    for name in sorted(names):
        values = [e.rewards[name] for e in episodes if name in e.rewards]
        out[f"reward/{name}"] = sum(values) / len(values)
    lengths = [len(e.completion.token_ids) for e in episodes if e.completion is not None]
    out.update({k: v for k, v in summarize(lengths, "response_len").items() if k.endswith(("mean", "max"))})
    ages = [run.version - (e.policy_version or 0) for e in episodes]
    out.update({k: v for k, v in summarize(ages, "policy_age").items() if k.endswith(("mean", "max"))})
    return out


async def evaluate(run: Run, n: int) -> dict[str, float]:
    """Greedy answers on the task's held-out prompts; mean reward under ``eval/reward``."""
    prompts = run.task.eval_prompts(n)

    async def one(sample: dict[str, Any]) -> float:
        (completion,) = await run.policy.generate.route(sample["request"], n=1, temperature=0.0)
        result = await score(run.reward_fns, sample["request"], completion.text, sample.get("target"))
        return result.total

    rewards = await asyncio.gather(*(one(s) for s in prompts))
    return {"eval/reward": sum(rewards) / max(len(rewards), 1)}
