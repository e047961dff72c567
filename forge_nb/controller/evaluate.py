"""Evaluations pinned to one weight version: k answers per held-out prompt, avg@k and unbiased pass@k.

``run.evaluate(prompts_or_task, k=, version=)``, ``loop.eval_every`` and ``%forge_eval`` all come here. The
run's generators are made to hold one version for the whole evaluation: the training loop is parked at a step
boundary (``loop.eval_every`` evaluates from inside it; ``run.evaluate`` pauses a running run and resumes it
after), the version is loaded (``WeightSync.settle``), and every answer is checked to come from it (each
Completion carries ``generator_version``). A run keeps the weights of its current version only (older ones are
dropped after each load), so ``version`` is that one: another is refused, with what to do instead.

The answers come from the generators directly (``policy.generate``, scored by the run's reward functions), or from
an episode function given as ``episode_fn`` (the held-out prompts are its samples, each played as one group of the
run's group size, scored as it scores): ``verifiers_episode(env)`` makes a verifiers environment the eval set, with
samples ``[{"vf_task": i} ...]`` naming its held-out tasks.

An answer is correct when its reward reaches ``correct_at`` (1.0: the toy task's whole pattern, a verified math
answer). For each prompt with ``c`` correct of ``k`` answers, pass@j is Chen et al. 2021's ("Evaluating Large
Language Models Trained on Code", eq. 1) unbiased estimator ``1 - C(k - c, j) / C(k, j)``, averaged over prompts,
for j = 1, 2, 4, ... up to k; avg@k is the mean reward of all answers. k = 1 samples greedily (temperature 0), as
the periodic evaluation always has; k > 1 samples at the run's sampling temperature unless ``temperature=``.

The values are an "eval" event (with the version, the step that trained it, k and the prompts) and, for the
periodic evaluation, also the step's row; the dashboard draws each eval metric as a curve over those steps.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from forge_nb.controller.context import RolloutContext
from forge_nb.rl import score

__all__ = ["eval_step", "evaluate_pinned", "pass_at_k", "resolve_prompts"]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one prompt with ``c`` correct among ``n`` samples: 1 - C(n - c, k) / C(n, k)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k(n={n}, c={c}, k={k}): needs 0 <= c <= n and 1 <= k <= n")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def _ks(k: int) -> list[int]:
    """1, 2, 4, ... below k, and k itself."""
    return sorted({2**i for i in range(k.bit_length()) if 2**i < k} | {k})


def resolve_prompts(run: RolloutContext, prompts: Any, n: int | None, *, samples: bool = False) -> list[dict[str, Any]]:
    """The held-out prompts as ``{"request", "target"}`` dicts: from the run's task (None), a task-like object
    (``eval_prompts(n)``), or a list of such dicts or of plain prompt strings (no target). ``samples``: the dicts are
    an episode function's samples, which need no "request" (a verifiers env's ``{"vf_task": i}``)."""
    count = n if n is not None else run.config.loop.eval_prompts
    if prompts is None:
        prompts = run.task
    if hasattr(prompts, "eval_prompts"):
        return list(prompts.eval_prompts(count))
    if isinstance(prompts, str | bytes) or not isinstance(prompts, Sequence):
        raise ValueError(f"evaluate(prompts={prompts!r}): give a task (an object with eval_prompts(n)), a list of "
                         "{'request': ..., 'target': ...} dicts or of prompt strings, or None for the run's task")
    out = [{"request": p, "target": None} if isinstance(p, str) else dict(p) for p in prompts]
    if not out or (not samples and any("request" not in p for p in out)):
        raise ValueError("evaluate(prompts=[...]): every prompt needs a 'request' (and a 'target' for rewards that "
                         "compare with one); got " + repr(prompts)[:200])
    return out


def check_eval_args(k: Any, version: Any, current: int) -> None:
    """ValueErrors naming the argument for k < 1 and a version the run no longer (or not yet) stores."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"evaluate(k={k!r}): k is the number of answers per prompt, an integer >= 1 (1: greedy)")
    if version is not None and version != current:
        when = "is not trained yet" if isinstance(version, int) and version > current else "is no longer stored"
        raise ValueError(f"evaluate(version={version!r}): that version {when}; the run keeps the weights of its "
                         f"current version ({current}) only. Evaluate it (version=None), or resume a checkpoint of "
                         "the version you want in a run of its own (forge_nb.resume) and evaluate there")


def _check_versions(versions: set[Any], version: int) -> None:
    if others := versions - {version}:
        raise RuntimeError(f"evaluate: answers came from version(s) {sorted(others, key=str)}, not the pinned "
                           f"{version}; a weight load ran during the evaluation")


async def _played(run: RolloutContext, episode_fn: Any, sample: dict[str, Any], version: int) -> list[float]:
    """The rewards of one group an episode function plays for ``sample``: one per answer (an agent's trajectory
    of several segments is one answer); a quarantined answer (its reward raised) counts 0."""
    group = await episode_fn(run, sample)
    _check_versions({e.completion.generator_version for e in group if e.completion is not None}, version)
    answers: dict[str, float] = {}
    for i, episode in enumerate(group):
        metadata = (episode.completion.metadata if episode.completion is not None else None) or {}
        reward = 0.0 if episode.quarantine or episode.reward is None else float(episode.reward)
        answers.setdefault(str(metadata.get("trajectory", i)), reward)
    return list(answers.values())


async def evaluate_pinned(run: RolloutContext, prompts: list[dict[str, Any]], *, k: int, version: int,
                          temperature: float | None = None, correct_at: float = 1.0,
                          episode_fn: Any = None) -> dict[str, float]:
    """avg@k and pass@j of ``prompts`` on generators that hold ``version`` (the caller parked the run and
    loaded it); a RuntimeError if any answer came from another version. ``episode_fn``: each prompt is a sample
    that episode function plays as a group (its answers are the k: the run's group size), scored as it scores."""
    if episode_fn is not None:
        rewards = await asyncio.gather(*(_played(run, episode_fn, s, version) for s in prompts))
        return _measures(rewards, min(len(rs) for rs in rewards), correct_at)
    if temperature is None:
        temperature = 0.0 if k == 1 else run.sampling_overrides.get("temperature", run.config.sampling().temperature)
    if k > 1 and temperature == 0:
        raise ValueError(f"evaluate(k={k}, temperature=0): k greedy answers are one answer k times; sample them "
                         "(temperature > 0) or use k=1")
    reward_fns = list(run.reward_fns)

    async def one(sample: dict[str, Any]) -> list[float]:
        completions = await run.policy.generate.route(sample["request"], n=k, temperature=temperature)
        _check_versions({c.generator_version for c in completions}, version)
        results = [await score(reward_fns, sample["request"], c.text, sample.get("target")) for c in completions]
        return [r.total for r in results]

    return _measures(await asyncio.gather(*(one(s) for s in prompts)), k, correct_at)


def _measures(rewards: list[list[float]], k: int, correct_at: float) -> dict[str, float]:
    """avg@k over every answer and pass@j (j = 1, 2, 4 .. k) of each prompt's answers, averaged over prompts."""
    if k < 1:
        raise RuntimeError("evaluate: a prompt got no answer")
    flat = [r for rs in rewards for r in rs]
    out = {f"eval/avg@{k}": sum(flat) / max(len(flat), 1)}
    for j in _ks(k):
        out[f"eval/pass@{j}"] = sum(pass_at_k(len(rs), sum(r >= correct_at for r in rs), j)
                                    for rs in rewards) / len(rewards)
    if k == 1:
        out["eval/reward"] = out["eval/avg@1"]  # the periodic evaluation's name before avg@k
    return out


def step_of(ctl: Any, version: int) -> int:
    """The step whose training made ``version`` (the latest row with it), or the current step."""
    for row in reversed(ctl.metrics.rows):
        if row.get("version") == version:
            return int(row["step"])
    return ctl.step


async def eval_step(ctl: Any, settle: Callable[[], Awaitable[None]]) -> dict[str, float]:
    """``loop.eval_every``'s evaluation, from the training loop after its step and before the step's row is
    recorded: this step's version, loaded by ``settle`` (the controller's, which leaves a trainer that died to the
    next step boundary). Recorded as an "eval" event; its values go into the step's row too."""
    every = ctl.config.loop
    await settle()
    prompts = resolve_prompts(ctl.context, None, every.eval_prompts)
    values = await evaluate_pinned(ctl.context, prompts, k=every.eval_k, version=ctl.sync.version)
    ctl.metrics.event("eval", step=ctl.step, version=ctl.sync.version, k=every.eval_k, prompts=len(prompts), **values)
    return values


async def evaluate_run(ctl: Any, prompts: Any, *, k: int, version: int | None, n: int | None,
                       temperature: float | None, correct_at: float, episode_fn: Any = None) -> dict[str, float]:
    """``run.evaluate``: park a running run at a step boundary, load its version, evaluate, resume it."""
    check_eval_args(k, version, ctl.sync.version)
    if episode_fn is not None:
        group = ctl.config.group_size
        if k not in (1, group) or not callable(episode_fn):
            raise ValueError(f"evaluate(episode_fn={episode_fn!r}, k={k}): an episode function (async (run, sample) -> "
                             f"group) plays the run's group_size={group} answers per sample; leave k out or give "
                             f"k={group}")
        k = group
    samples = resolve_prompts(ctl.context, prompts, n, samples=episode_fn is not None)
    was_running = ctl.running
    if was_running:
        ctl.pause()
        await ctl.no_step_in_flight()
    try:
        await ctl.sync.settle()
        pinned = ctl.sync.version
        values = await evaluate_pinned(ctl.context, samples, k=k, version=pinned, temperature=temperature,
                                       correct_at=correct_at, episode_fn=episode_fn)
    finally:
        if was_running:
            ctl.start()
    ctl.metrics.event("eval", step=step_of(ctl, pinned), version=pinned, k=k, prompts=len(samples), **values)
    return {"version": pinned, "k": k, "prompts": len(samples), **values}
