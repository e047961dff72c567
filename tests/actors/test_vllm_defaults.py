"""The defaults a Generator gives vLLM on CPU that need no engine to check: the KV cache's size, the dtype."""

from __future__ import annotations

import json

from forge_nb.actors.engine.worker import CPU_KV_MAX, CPU_KV_MIN, CPU_KV_SEQS, checkpoint_dtype, cpu_kv_cache_bytes
from forge_nb.models import TinyModelConfig, build_tiny_model


def test_the_tiny_model_gets_a_small_kv_cache_and_a_large_model_the_cap(tmp_path) -> None:
    tiny = build_tiny_model(tmp_path / "tiny", TinyModelConfig())
    assert cpu_kv_cache_bytes(str(tiny), 16) == CPU_KV_MIN  # 2 layers x 2 heads x 64: ~2 KiB a token

    # Qwen3-1.7B's shape (its config.json's fields; no weights needed): 28 layers, 8 KV heads of 128
    qwen = tmp_path / "qwen3-1.7b"
    qwen.mkdir()
    (qwen / "config.json").write_text(json.dumps({
        "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
        "hidden_size": 2048}))
    per_token = 2 * 28 * 8 * 128 * 4
    assert cpu_kv_cache_bytes(str(qwen), 8) == per_token * 8 * CPU_KV_SEQS  # between the bounds: counted
    assert cpu_kv_cache_bytes(str(qwen), 4096) == CPU_KV_MAX


def test_what_cannot_be_counted_gets_the_cap(tmp_path) -> None:
    assert cpu_kv_cache_bytes(str(tmp_path / "missing"), 16) == CPU_KV_MAX
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"num_hidden_layers": 2}}))
    assert cpu_kv_cache_bytes(str(tmp_path), 16) == CPU_KV_MAX
    tiny = build_tiny_model(tmp_path / "tiny", TinyModelConfig())
    assert cpu_kv_cache_bytes(str(tiny), None) == CPU_KV_MAX  # no context length: no count


def test_a_float32_checkpoint_is_named_so_others_are_left_to_vllm(tmp_path) -> None:
    """What make_engine_args reads to keep a float32 checkpoint in float32 on CPU (the engine that then
    samples with the trainer's logprobs: tests/actors/test_generator.py)."""
    assert checkpoint_dtype(str(build_tiny_model(tmp_path / "tiny", TinyModelConfig()))) == "float32"
    for name, config in (("old", {"torch_dtype": "float32"}), ("bf16", {"dtype": "bfloat16"}), ("none", {}),
                         ("odd", {"dtype": {"text": "float32"}})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(config))
    assert [checkpoint_dtype(str(tmp_path / n)) for n in ("old", "bf16", "none", "odd", "missing")] == [
        "float32", "bfloat16", None, None, None]
