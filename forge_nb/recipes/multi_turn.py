"""The CPU multi-turn example: the quickstart's tiny model and services, playing EchoEnv (``forge_nb.envs``)."""

from __future__ import annotations

from typing import Any

from forge_nb.config import RunConfig
from forge_nb.recipes.quickstart import quickstart

#: EchoEnv's game in the example: 3 turns, each answered with the letter twice (notebook 08, the bench).
ECHO = {"turns": 3, "chars": 2}


def multi_turn_echo(**overrides: Any) -> RunConfig:
    """The run of ``example_notebooks/08_multi_turn.py`` and ``bench/multi_turn.py``; the caller serves the
    environment and sets the episode function::

        env = await EnvPool.options(num_replicas=2).as_service(EchoEnv, **ECHO)
        run = await forge_nb.spawn(multi_turn_echo())
        run.episode_fn = multi_turn_episode(env, max_turns=ECHO["turns"], turn_tokens=ECHO["chars"])

    Its trajectories hold 3 answers of 2 tokens and 2 letters between them: 8 response tokens, 12 allowed.
    Groups of 8 (the quickstart has 4), so two seeds per batch of 16; the rest is the quickstart's, lr 7e-4
    too. Trial runs (session 16, 2 CPU cores, 300 steps, last-10 mean reward): groups of 8 ended at 0.93
    (lr 7e-4; 0.8 by step 140) and 0.99 (lr 1e-3); groups of 4 at 0.99, 0.89, 0.88 and 0.79 (lr 7e-4, the
    last under the test suite's load) and 0.70 (lr 1e-3). In the runs that stalled, entropy had collapsed
    with letters still answered wrong by every sample of their group, so no gradient reached them (the
    quickstart's docstring tells the same story); eight samples of each letter make that rarer.
    """
    return quickstart(**({"name": "multi-turn", "max_res_tokens": 12, "group_size": 8} | overrides))
