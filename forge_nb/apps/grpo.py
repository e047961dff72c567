"""torchforge's ``apps.grpo.main`` names, so ``from apps.grpo.main import ...`` becomes an import from here.

The classes live where forge_nb keeps them (actors in ``forge_nb.actors``, types and ``collate`` in
``forge_nb.rl``); this module only gathers them under the documents' names:

- ``DatasetActor``, ``RewardActor``, ``ComputeAdvantages``: the CPU actors of the GRPO app;
- ``Episode``, ``Group`` and ``collate`` (torchforge's collate, ``forge_nb.rl.collate_seed``: one
  ``inputs``/``targets`` dict pair per data-parallel rank).
"""

from forge_nb.actors.advantages import ComputeAdvantages
from forge_nb.actors.dataset import DatasetActor
from forge_nb.actors.reward import RewardActor
from forge_nb.rl.types import Episode, Group
from forge_nb.rl.types import collate_seed as collate

__all__ = ["ComputeAdvantages", "DatasetActor", "Episode", "Group", "RewardActor", "collate"]
