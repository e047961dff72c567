"""The controller of a run: its loops (``Controller``), weight versions (``WeightSync``), books (``Ledger``),
hot changes (``HotChanges``) and the default episode function (``generate_episode``).

``forge_nb.Run`` is the user's handle over one Controller; nothing here imports the Run, the
magics or the widgets, nor holds a Run: episode functions get the run's ``RolloutContext`` (its policy,
reference, config, rewards and sampling, under the Run's names; ``forge_nb.controller.context``).

A run's loops (``forge_nb.controller.core``), one step's path through them:

::

      task.sample()                                       (N rollout loops, "rollout<i>")
           │
           v
      episode_fn(run, sample) ──> gate.admit ──> accept(group) ──> ReplayBuffer ──sample(version)──┐
      generate, score, ref logprobs,   │  zero-variance groups (dynamic sampling), quarantined,    │
      advantages                       v  rolled back: counted, dropped                            v
                                     Ledger                                     trainer.train_step(batch)   ("train")
                                                                            │
      generators <── update_weights.fanout(v) <── push_weights(v) <── WeightSync.publish(v+1)
                                           (every ``loop.sync_interval``-th v; held in between)
                                                                            │
                                              hot changes, eval, checkpoint at the step boundary

Backpressure: what each loop consumes, what it waits for, and what unblocks it.

===============  ===================  =============================================  ==========================
loop             consumes             waits for                                      unblocked by
===============  ===================  =============================================  ==========================
rollout<i>       a task sample        ``running`` (pause), ``collect_allowed``        resume; a batch leaving
                                      (buffer full: one batch in sync mode,           the buffer (async) or the
                                      ``max_policy_age + 1`` batches in async mode);  step's weight sync (sync);
                                      with ``loop.sync_interval`` > 1, a group that   the generators' next load
                                      would be too old when trained (``loop``'s       (at most 1 s)
                                      ``would_be_too_old``)
train            a batch              ``running``; ``batch_ready`` (buffer short;     resume; accept(); at most
                                      stale episodes just evicted frees room)         ``starved_after_s``; with
                                                                                      dynamic sampling, the whole
                                                                                      groups it has after
                                                                                      ``refill_timeout_s``
sft              ``sft_data`` batches ``running``                                     resume
===============  ===================  =============================================  ==========================
"""

from __future__ import annotations

import importlib
from typing import Any

# Loaded when first used: ``forge_nb.controller.state`` (read by the widgets, which must not load torch or
# monarch) imports this package first.
_EXPORTS = {"Controller": "core", "EpisodeFn": "context", "evaluate_pinned": "evaluate", "generate_episode": "episodes",
            "HotChanges": "hot", "Ledger": "intake.ledger", "RolloutContext": "context", "WeightSync": "weight_sync"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'forge_nb.controller' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"forge_nb.controller.{module}"), name)
    globals()[name] = value
    return value
