"""The CPU quickstart: a tiny Qwen3 built locally learns the toy task with GRPO on one vLLM generator service."""

from __future__ import annotations

from typing import Any

from forge_nb.config import GeneratorConfig, LoopConfig, OptimizerConfig, RunConfig, TrainerConfig
from forge_nb.models import TinyModelConfig


def quickstart(**overrides: Any) -> RunConfig:
    """A run that fits two CPU cores: reward rises from ~0.1 towards 1 within minutes and stays there.

    Keyword arguments replace top-level fields (``quickstart(name="mine", batch_size=32)``).

    Why lr=7e-4 and group_size=4 (``bench/learning_curve.py``, 250 steps): with lr=3e-3 and groups of 8 (2 prompts
    a step) entropy fell to ~0.005 by step 125 and some letters ended with every sample the same wrong answer:
    advantage 0, no gradient, unsolved for good (last-50 reward 0.59, 3 of 8 letters at 0). Groups of 4 put 4
    prompts in each batch of 16, so every letter gets a gradient often, and a smaller step slows the collapse:
    lr=1e-3 ended well in 4 runs of 5 (one left a letter at 0), lr=7e-4 in every run, 0.8 reached by step ~80. An
    entropy bonus (the losses' ``entropy_coef``) made it worse here: once most groups are solved their advantages
    are 0, the bonus is the only gradient left, Adam scales it up, and solved letters were knocked back to 0 (0.05
    and 0.1 each left a letter unsolved on seed 0).

    Why one generator replica (``bench/vs_trl.py``): on two cores each replica takes a share of the CPU the trainer
    needs and loads every version; two replicas trained 13.7 steps/s, one 20.4. Its eight rollout loops keep their
    groups in the one engine's batch. Replicas are one setting away: ``%forge_spawn quickstart --replicas 2``.

    Why max_policy_age=3 (``bench/vs_trl.py`` and ``bench/learning_curve.py``): the generator loads version v while
    the trainer trains step v+1, so what it generates meanwhile is two versions behind the step that trains it, and
    with ``sync_interval=2`` (below) a version serves two steps, 2.5 versions old on average. With an age limit of
    1, 30-34% of all episodes were evicted as stale, on the two cores the trainer shares; with 3 none are, and the
    learning curve holds (last-50 reward 0.986-0.988, no letter unsolved, 0.8 at step 73-80).

    Why sync_interval=2 and eight rollout loops: vLLM's engine costs about as much per engine step for 32
    sequences as for 16 (22 against 14-19 ms of CPU a batch, ``bench/engine_cpu.py``), but a weight load drains
    it, so with a load every step its batches held one step's 16. Loading every other version lets one batch of
    eight groups serve two steps, with half the loads and messages: 55-64 steps/s against 48-53, 26-31 ms of CPU a
    step against 34-37, in 3 alternated pairs; none evicted, 0.8 reached at step 74-82 as before. The runs behind
    each choice are in ``bench/HISTORY.md``.
    """
    fields: dict[str, Any] = dict(
        name="quickstart",
        model="tiny",
        tiny=TinyModelConfig(alphabet="abcdefgh"),
        task="toy",
        group_size=4,  # 4 prompts in each batch of 16: every letter is trained often (see above)
        max_req_tokens=4,
        max_res_tokens=4,
        batch_size=16,
        max_policy_age=3,  # version v loads while v+1 trains and serves two steps (see above)
        # float32 like the trainer, so generator logprobs (the ratio's denominator) match its own.
        # one replica: its engine batches every group (see above)
        generator=GeneratorConfig(num_replicas=1, engine_args={"dtype": "float32"},
                                  sampling_params={"temperature": 1.0, "top_p": 1.0}),
        # 3e-3 collapsed (see above); AdamW without weight decay and with torch's beta2, as it was tuned
        trainer=TrainerConfig(optimizer=OptimizerConfig(lr=7e-4, weight_decay=0.0, beta2=0.999), loss="grpo",
                              loss_config={"beta": 0.0}),
        # eight groups in flight at once, one engine batch for two steps, a load every other step (see above)
        loop=LoopConfig(mode="async", rollout_loops=8, sync_interval=2),
    )
    fields.update(overrides)
    return RunConfig(**fields)
