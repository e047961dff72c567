"""The controller of a run: its loops (``Controller``), weight versions (``WeightSync``), books (``Ledger``),
hot changes (``HotChanges``) and the default episode function (``generate_episode``).

``forge_nb.Run`` is the user's handle over one Controller; nothing here imports the Run, the
magics or the widgets.
"""

from forge_nb.controller.core import Controller, EpisodeFn
from forge_nb.controller.episodes import evaluate, generate_episode
from forge_nb.controller.hot import HotChanges
from forge_nb.controller.ledger import Ledger
from forge_nb.controller.weight_sync import WeightSync

__all__ = ["Controller", "EpisodeFn", "HotChanges", "Ledger", "WeightSync", "evaluate", "generate_episode"]
