"""GRPO on GSM8K: Qwen3 on GPUs (the seeds' recipe), or a tiny local model on CPU to try the workflow."""

from __future__ import annotations

import string
from typing import Any

from forge_nb.config import GeneratorConfig, LoopConfig, OptimizerConfig, RunConfig, TrainerConfig, TrainingConfig
from forge_nb.models import TinyModelConfig


def gsm8k_qwen3(model: str = "Qwen/Qwen3-1.7B", *, data_files: str | None = None, **overrides: Any) -> RunConfig:
    """The torchforge ``apps/grpo/qwen3_1_7b`` recipe: 8 answers per question, MathReward + ThinkingReward,
    a reference model for the KL penalty, generators and trainer on GPUs, AdamW as torchtitan sets it up there
    (``OptimizerConfig``'s defaults: weight decay 0.1, beta2 0.95). ``data_files`` points at local GSM8K-format
    jsonl instead of the hub."""
    fields: dict[str, Any] = dict(
        name="gsm8k", model=model, task="gsm8k",
        task_args={"data_files": data_files} if data_files else {},
        group_size=8, max_req_tokens=512, max_res_tokens=512, batch_size=16, max_policy_age=1,
        use_reference=True,
        generator=GeneratorConfig(num_replicas=1, with_gpus=True, sampling_params={"temperature": 1.0}),
        trainer=TrainerConfig(with_gpus=True, optimizer=OptimizerConfig(lr=1e-6), loss="grpo",
                              loss_config={"beta": 0.04}, training=TrainingConfig(dtype="bfloat16")),
        loop=LoopConfig(rollout_loops=2, checkpoint_every=50),
    )
    fields.update(overrides)
    return RunConfig(**fields)


def gsm8k_tiny(data_files: str, **overrides: Any) -> RunConfig:
    """The same workflow on CPU: a tiny character-level Qwen3 over printable ASCII and local GSM8K rows.

    It will not learn arithmetic; it shows the pipeline (math rewards, reference KL, weight sync) end to
    end on a laptop before the GPU run."""
    alphabet = "".join(ch for ch in string.printable if ch not in "\t\r\x0b\x0c")
    fields: dict[str, Any] = dict(
        name="gsm8k-tiny", model="tiny", tiny=TinyModelConfig(alphabet=alphabet, max_position_embeddings=512),
        task="gsm8k", task_args={"data_files": data_files}, group_size=4, max_req_tokens=256, max_res_tokens=16,
        batch_size=8, use_reference=True,
        generator=GeneratorConfig(num_replicas=1, engine_args={"dtype": "float32"}),
        trainer=TrainerConfig(optimizer=OptimizerConfig(lr=1e-3, weight_decay=0.0, beta2=0.999), loss="grpo",
                              loss_config={"beta": 0.04}),
        loop=LoopConfig(rollout_loops=1),
    )
    fields.update(overrides)
    return RunConfig(**fields)
