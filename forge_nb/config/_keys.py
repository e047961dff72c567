"""What the trainer and the reference model accept in torchforge's sections, for checking YAML at load time.

The trainer validates its sections when it sets up (``forge_nb.actors._trainer_config.read_section``), in
another process, after the services spawned. A YAML typo should fail when the file loads, so the config
layer needs the same key sets. ``forge_nb.config`` sits below ``forge_nb.actors`` in the import graph and
cannot import the dataclasses, so the sets are written out here; tests/test_config_yaml.py checks that
they equal the trainer's (its dataclass fields, its seed-only keys and aliases, its seed sections).
"""

from __future__ import annotations

# Degrees of parallelism forge_nb's trainer does not implement (it is FSDP only): accepted at 1.
MUST_BE_ONE = frozenset({
    "data_parallel_replicate_degree", "tensor_parallel_degree", "pipeline_parallel_degree",
    "context_parallel_degree", "expert_parallel_degree",
})

TRAINER_SECTION_KEYS: dict[str, frozenset[str]] = {
    "optimizer": frozenset({"name", "lr", "eps", "weight_decay", "beta1", "beta2",
                            "implementation", "early_step_in_backward"}),
    "training": frozenset({"max_norm", "dtype", "local_batch_size", "engine", "temperature", "seed", "dist_timeout_s",
                           "gradient_accumulation_steps",
                           "seq_len", "steps", "gc_freq", "gc_debug", "global_batch_size", "mixed_precision_param",
                           "mixed_precision_reduce", "enable_cpu_offload", "dataset", "dataset_path",
                           "deterministic"}),
    "lr_scheduler": frozenset({"warmup_steps", "decay_ratio", "decay_type", "min_lr_factor", "lr_min"}),
    "checkpoint": frozenset({"folder", "interval", "resume", "keep_last", "enable", "initial_load_path",
                             "initial_load_in_hf", "last_save_in_hf", "async_mode", "initial_load_model_only",
                             "export_dtype", "exclude_from_loading", "last_save_model_only"}),
    "parallelism": frozenset({"dp_shard", "master_port", "data_parallel_shard_degree", "disable_loss_parallel",
                              "enable_async_tensor_parallel", "fsdp_reshard_after_forward"}) | MUST_BE_ONE,
}
"""RLTrainer's sections and every key each takes (forge_nb's fields, and torchtitan keys it ignores)."""

TRAINER_SEED_SECTIONS = frozenset({
    "job", "compile", "activation_checkpoint", "comm", "quantize", "memory_estimation", "float8",
    "state_dict_key", "use_dcp", "dcp_path", "debug", "validation",
})
"""torchtitan sections RLTrainer takes as keyword arguments (and ignores: they steer torchtitan's engine)."""

DTYPES = ("bfloat16", "float16", "float32")
"""The trainer's ``training.dtype`` values."""
