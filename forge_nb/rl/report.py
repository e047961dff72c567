"""Per-prompt success: from ``run.episodes(n)`` rows, the mean reward of each prompt's recent samples.

A run's mean reward can hide prompts that the policy never learned: when all of a group's samples are
the same wrong answer, every advantage is 0 and that prompt gets no gradient again. This view shows them:

    for row in forge_nb.rl.report.per_prompt(run.episodes(800)):
        print(row["prompt"], row["mean_reward"], row["samples"])

Pure python (no pandas), so a notebook, a test or a bench script can use it on the rows as they come.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["per_prompt", "unsolved"]

SOLVED_AT = 0.75
"""A prompt counts as solved when the mean reward of its recent samples is at least this."""


def per_prompt(rows: Iterable[Mapping[str, Any]], last: int = 32) -> list[dict[str, Any]]:
    """One row per prompt, worst first: prompt, target, samples (how many of its newest were averaged,
    at most ``last``), mean_reward, best (its highest reward) and solved (mean_reward >= SOLVED_AT).

    ``rows`` are episode rows, newest last, as ``run.episodes(n)`` returns them; rows without a reward
    (quarantined) are skipped.
    """
    if isinstance(last, bool) or not isinstance(last, int) or last < 1:
        raise ValueError(f"per_prompt(last={last!r}): the number of newest samples per prompt, an int >= 1")
    rewards: dict[str, list[float]] = {}
    targets: dict[str, Any] = {}
    for row in rows:
        reward, prompt = row.get("reward"), row.get("prompt")
        if reward is None or prompt is None:
            continue
        rewards.setdefault(prompt, []).append(float(reward))
        targets[prompt] = row.get("target")
    out = []
    for prompt, values in rewards.items():
        recent = values[-last:]
        mean = sum(recent) / len(recent)
        out.append({"prompt": prompt, "target": targets[prompt], "samples": len(recent),
                    "mean_reward": mean, "best": max(recent), "solved": mean >= SOLVED_AT})
    return sorted(out, key=lambda r: (r["mean_reward"], r["prompt"]))


def unsolved(rows: Iterable[Mapping[str, Any]], last: int = 32) -> list[dict[str, Any]]:
    """The rows of ``per_prompt`` whose prompt is not solved (empty when every prompt is)."""
    return [r for r in per_prompt(rows, last) if not r["solved"]]
