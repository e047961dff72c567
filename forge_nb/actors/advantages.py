"""ComputeAdvantages: the documents' advantage actor, a thin shell over ``forge_nb.rl.assign_advantages``.

A process for a six-line computation is what STYLE.md warns against; it exists so that the documents'
``ComputeAdvantages.options(procs=1).as_actor()`` and ``await compute_advantages.compute.call_one(group)``
run. forge_nb's own loops call ``assign_advantages`` in the kernel.
"""

from __future__ import annotations

from monarch.actor import endpoint

from forge_nb.rl.advantages import ADVANTAGE_METHODS, AdvantageMethod, assign_advantages
from forge_nb.rl.types import Group
from forge_nb.service.actor import ForgeActor

__all__ = ["ComputeAdvantages"]


class ComputeAdvantages(ForgeActor):
    """Group-relative advantages of one group of episodes (torchforge's ``compute(group)``).

    Args:
        method: "grpo" (torchforge's ``(r - mean) / (std + 1e-4)``, the default), "dr_grpo" or "rloo".
    """

    def __init__(self, method: AdvantageMethod = "grpo") -> None:
        if method not in ADVANTAGE_METHODS:
            raise ValueError(f"unknown advantage method {method!r}; choose one of {list(ADVANTAGE_METHODS)}")
        self.method: AdvantageMethod = method

    @endpoint
    async def compute(self, group: Group) -> list[float]:
        """One advantage per episode of ``group``, in order; the caller sets ``episode.advantage``.

        Unlike torchforge's, a group of one gets 0 (not NaN) and a quarantined episode gets 0 and stays
        out of the others' statistics. The episodes here are copies: the caller's are not changed.
        """
        return assign_advantages(list(group), self.method)
