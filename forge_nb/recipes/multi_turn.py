"""Multi-turn recipes: EchoEnv on CPU (the quickstart's tiny model), and Qwen3 playing a TextArena game on GPUs."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from forge_nb.config import GeneratorConfig, LoopConfig, OptimizerConfig, RunConfig, TrainerConfig, TrainingConfig
from forge_nb.recipes.quickstart import quickstart

#: EchoEnv's game in the example: 3 turns, each answered with the letter twice (notebook 08, the bench).
ECHO = {"turns": 3, "chars": 2}

#: How :func:`guess_the_number_qwen3`'s episodes are played (``multi_turn_episode(env, **GUESS_EPISODE)``):
#: TextArena's GuessTheNumber-v0 (1 to 20, 10 guesses, "higher"/"lower" after each) framed by Qwen3's chat
#: template with its thinking off, so each turn is one short answer.
GUESS_EPISODE: dict[str, Any] = {
    "max_turns": 10,
    "turn_tokens": 32,
    "system_prompt": "You are playing a guessing game. Answer each turn with one guess in square brackets, like [7].",
    "chat_template_kwargs": {"enable_thinking": False},
}


def multi_turn_echo(**overrides: Any) -> RunConfig:
    """The run of ``example_notebooks/08_multi_turn.py`` and ``bench/multi_turn.py``; the caller serves the
    environment and sets the episode function::

        env = await EnvPool.options(num_replicas=2).as_service(EchoEnv, **ECHO)
        run = await forge_nb.spawn(multi_turn_echo())
        run.episode_fn = multi_turn_episode(env, max_turns=ECHO["turns"], turn_tokens=ECHO["chars"])

    Its trajectories hold 3 answers of 2 tokens and 2 letters between them: 8 response tokens, 12 allowed.
    Groups of 8 (the quickstart has 4) and batches of 32, so four seeds per step, and lr 5e-4; the rest is the
    quickstart's. Why (``bench/multi_turn.py``, two CPU cores, 300 steps): in the runs that stalled, entropy had
    collapsed with letters still answered wrong by every sample of their group, so no gradient reached them (the
    quickstart's docstring tells the same story). Eight samples of each letter and four episodes' letters a step
    make that rarer: with batches of 16 the notebook's run once ended at 0.66 (two letters stuck); with 32, seeds
    0-2 ended at 0.98-1.00. On a machine half as fast, where the generator is the bottleneck and every trained
    episode is one version old, lr 7e-4 left two runs of five at 0.80-0.90 for 100 steps or more with a letter
    half-learned; with lr 5e-4 six runs ended at 0.935-0.997 at step 300 (0.8 by step 75-150).
    ``max_policy_age=2`` (what the quickstart uses) evicted 1% of episodes instead of ~5% but learned less per
    step: 0.840 and 0.845 at 300. The trial runs behind these choices are in ``bench/HISTORY.md``.
    """
    base = quickstart()
    return quickstart(**({"name": "multi-turn", "max_res_tokens": 12, "group_size": 8, "batch_size": 32,
                          "max_policy_age": 1,  # 2 learned less per step (see above)
                          # four rollout loops and a load after every step, as measured (the quickstart's load
                          # every other step needs max_policy_age >= 2)
                          "loop": LoopConfig(mode="async", rollout_loops=4),
                          "trainer": replace(base.trainer, optimizer=replace(base.trainer.optimizer, lr=5e-4))}
                         | overrides))


def guess_the_number_qwen3(model: str = "Qwen/Qwen3-1.7B", **overrides: Any) -> RunConfig:
    """Qwen3 learns TextArena's GuessTheNumber on GPUs: a real multi-turn task with a hub model::

        env = await EnvPool.options(num_replicas=2).as_service(TextArenaEnv, env_id="GuessTheNumber-v0")
        run = await forge_nb.spawn(guess_the_number_qwen3())
        run.episode_fn = multi_turn_episode(env, **GUESS_EPISODE)

    The conversation is in Qwen3's chat template (the game's messages as user turns, the guesses as the
    assistant's; ``forge_nb.envs.chat``). A game earns 1 for a win and otherwise how close the last guess
    was, so an untrained model's binary search that runs out of turns still has a gradient. Response
    budget: 10 guesses of at most 32 tokens and the game's short hints between them fit in 1024 tokens.
    The rest follows the GSM8K recipe (``gsm8k_qwen3``): groups of 8, lr 1e-6 with torchtitan's AdamW, bf16
    trainer, one generator and the trainer each on a GPU. Not yet run on a GPU here: the lent GPU machines have no
    vLLM and no hub access (docs/concepts/gpus.md).
    """
    fields: dict[str, Any] = dict(
        name="guess-the-number", model=model, group_size=8, max_req_tokens=256, max_res_tokens=1024,
        batch_size=16, max_policy_age=1,
        generator=GeneratorConfig(num_replicas=1, with_gpus=True, sampling_params={"temperature": 1.0}),
        trainer=TrainerConfig(with_gpus=True, optimizer=OptimizerConfig(lr=1e-6), loss="grpo",
                              loss_config={"beta": 0.0}, training=TrainingConfig(dtype="bfloat16")),
        loop=LoopConfig(rollout_loops=4, checkpoint_every=50),
    )
    fields.update(overrides)
    return RunConfig(**fields)
