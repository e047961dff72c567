"""The CPU quickstart: a tiny Qwen3 built locally learns the toy task with GRPO on two generator replicas."""

from __future__ import annotations

from typing import Any

from forge_nb.config import GeneratorConfig, LoopConfig, RunConfig, TrainerConfig
from forge_nb.models import TinyModelConfig


def quickstart(**overrides: Any) -> RunConfig:
    """A run that fits two CPU cores: reward rises from ~0.1 towards 1 within minutes.

    Keyword arguments replace top-level fields (``quickstart(name="mine", batch_size=32)``).
    """
    fields: dict[str, Any] = dict(
        name="quickstart",
        model="tiny",
        tiny=TinyModelConfig(alphabet="abcdefgh"),
        task="toy",
        group_size=8,
        max_req_tokens=4,
        max_res_tokens=4,
        batch_size=16,
        max_policy_age=1,
        # float32 like the trainer, so generator logprobs (the ratio's denominator) match its own.
        generator=GeneratorConfig(num_replicas=2, engine_args={"dtype": "float32"},
                                  sampling_params={"temperature": 1.0, "top_p": 1.0}),
        trainer=TrainerConfig(lr=3e-3, loss="grpo", loss_config={"beta": 0.0}),
        loop=LoopConfig(mode="async", rollout_loops=2),
    )
    fields.update(overrides)
    return RunConfig(**fields)
