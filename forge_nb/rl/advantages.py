"""Advantages from the rewards of one group: group-relative (GRPO, Dr. GRPO) and leave-one-out (RLOO).

All of these compare each completion to its siblings for the same prompt, so no value model is needed.
The functions take the rewards of one group and return one advantage per member; `assign_advantages`
reads and writes `Episode` objects, leaving quarantined episodes (whose reward function failed) out of
the statistics and giving them advantage 0 so they cannot push the policy anywhere.

A group with a single usable member gets advantage 0: it has no sibling to compare against.

`batch_baseline` serves episodes that reach a replay buffer with a reward but no advantage (the
documents' `Episode(prompt_ids=, response_ids=, reward=)`): REINFORCE with the mean reward of the
sampled batch as baseline.

torch is imported where the advantages are computed: a RunConfig checks its `advantage` against
:data:`ADVANTAGE_METHODS` without it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import torch

    from forge_nb.rl.types import Episode

__all__ = [
    "ADVANTAGE_METHODS",
    "AdvantageMethod",
    "assign_advantages",
    "batch_baseline",
    "group_relative",
    "leave_one_out",
]

AdvantageMethod = Literal["grpo", "dr_grpo", "rloo"]
ADVANTAGE_METHODS: tuple[str, ...] = ("grpo", "dr_grpo", "rloo")


def _as_rewards(rewards: Sequence[float] | torch.Tensor) -> torch.Tensor:
    import torch
    tensor = torch.as_tensor(rewards)
    if tensor.dim() != 1:
        raise ValueError(f"rewards must be 1-D (one group), got shape {tuple(tensor.shape)}")
    return tensor if tensor.is_floating_point() else tensor.to(torch.float32)


def group_relative(
    rewards: Sequence[float] | torch.Tensor, *, scale_by_std: bool = True, eps: float = 1e-4
) -> torch.Tensor:
    """GRPO advantage `(r_i - mean(r)) / (std(r) + eps)` (Shao et al. 2024).

    `std` is the unbiased sample standard deviation, as in torchforge's seed. With `scale_by_std=False`
    this is Dr. GRPO's `r_i - mean(r)` (Liu et al. 2025), which does not favour groups whose rewards
    barely differ.
    """
    import torch
    r = _as_rewards(rewards)
    if r.numel() < 2:
        return torch.zeros_like(r)
    centred = r - r.mean()
    return centred / (r.std() + eps) if scale_by_std else centred


def leave_one_out(rewards: Sequence[float] | torch.Tensor) -> torch.Tensor:
    """RLOO advantage `r_i - mean_{j != i} r_j` (Ahmadian et al. 2024), which is `n/(n-1) (r_i - mean)`."""
    import torch
    r = _as_rewards(rewards)
    n = r.numel()
    if n < 2:
        return torch.zeros_like(r)
    return (r - (r.sum() - r) / (n - 1)).to(r.dtype)


def assign_advantages(
    group: Sequence[Episode],
    method: AdvantageMethod = "grpo",
    *,
    scale_by_std: bool = True,
    eps: float = 1e-4,
) -> list[float]:
    """Write `episode.advantage` for every member of `group` and return the advantages.

    `method`: "grpo" (mean and std; `scale_by_std` applies), "dr_grpo" (mean only) or "rloo".
    Quarantined episodes get 0 and do not enter the statistics of the others.
    """
    import torch
    if method not in ADVANTAGE_METHODS:
        raise ValueError(f"unknown advantage method {method!r}; choose one of {list(ADVANTAGE_METHODS)}")
    usable = [ep for ep in group if ep.quarantine is None]
    for ep in usable:
        if ep.reward is None:
            raise ValueError(
                f"Episode {ep.episode_id!r} has no reward and is not quarantined; score it (e.g. with "
                "forge_nb.rl.score) before computing advantages"
            )
    rewards = torch.tensor([float(ep.reward) for ep in usable], dtype=torch.float64)  # type: ignore[arg-type]
    if method == "rloo":
        values = leave_one_out(rewards)
    else:
        values = group_relative(rewards, scale_by_std=scale_by_std and method == "grpo", eps=eps)
    by_id = {id(ep): float(v) for ep, v in zip(usable, values.tolist(), strict=True)}
    for ep in group:
        ep.advantage = by_id.get(id(ep), 0.0)
    return [ep.advantage for ep in group]  # type: ignore[misc]


def batch_baseline(episodes: Sequence[Episode]) -> int:
    """Give every episode that has no advantage `reward - mean(reward)`, the mean taken over those
    episodes; returns how many were filled. Episodes that already have an advantage are left alone.

    This is REINFORCE with a batch-mean baseline, applied by `ReplayBuffer.sample` to what it samples:
    the episodes of one sample need not share a prompt, so it is not GRPO's group-relative advantage
    (compute that per group with `assign_advantages` before adding, as forge_nb's loops do). The reward is
    not divided by a standard deviation. A quarantined episode gets 0 and stays out of the mean; a sample
    with one such episode gives it 0, so sample at least two to learn anything.
    """
    missing = [ep for ep in episodes if ep.advantage is None]
    usable = [ep for ep in missing if ep.quarantine is None]
    for ep in usable:
        if ep.reward is None:
            raise ValueError(
                f"Episode {ep.episode_id!r} has neither a reward nor an advantage; set Episode(reward=...) "
                "from the reward actor's evaluate_response"
            )
    rewards = [float(ep.reward) for ep in usable]  # type: ignore[arg-type]
    mean = sum(rewards) / len(rewards) if rewards else 0.0
    for ep in missing:  # identity, not ==: dataclass equality would compare tensors
        ep.advantage = 0.0 if ep.quarantine is not None else float(ep.reward) - mean  # type: ignore[arg-type]
    return len(missing)
