"""vLLM inspects a model class it has not cached in the engine's own process on CPU (``engine.inproc``).

vLLM's way, a Python process of its own that imports vLLM again, took 10 s of a first ``%forge_spawn`` on two
cores. Here the same class is inspected both ways, from an empty cache each time: what the engine's process
learns and caches must be what vLLM's subprocess learns.
"""

from __future__ import annotations

import os

from forge_nb.actors.engine.inproc import inspect_models_here


def test_a_model_class_is_inspected_here_as_vllm_would_in_a_process_of_its_own(tmp_path, monkeypatch):
    from vllm.model_executor.models import registry

    qwen3 = registry.ModelRegistry.models["Qwen3ForCausalLM"]
    in_subprocess = registry._run_in_subprocess

    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "theirs"))
    theirs = qwen3.inspect_model_cls()  # vLLM's own way: a new process

    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "ours"))
    with inspect_models_here():
        assert registry._run_in_subprocess(os.getpid) == os.getpid()  # what it runs, runs in this process
        ours = qwen3.inspect_model_cls()
    assert registry._run_in_subprocess is in_subprocess  # vLLM's own again afterwards

    assert ours == theirs
    assert ours.architecture == "Qwen3ForCausalLM" and ours.is_text_generation_model
    cached = sorted(p.name for p in (tmp_path / "ours" / "modelinfos").iterdir())
    assert cached == sorted(p.name for p in (tmp_path / "theirs" / "modelinfos").iterdir()) != []
