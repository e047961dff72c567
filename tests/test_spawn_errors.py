"""A run that cannot come up says why, and leaves nothing running: no mesh, no torchstore."""

from __future__ import annotations

import pytest
import torch

import forge_nb
from forge_nb.config import GeneratorConfig


async def test_a_model_that_does_not_exist_is_named_before_anything_spawns(runtime, tmp_path):
    cfg = forge_nb.quickstart(model="/nonexistent/forge-nb-model", run_dir=str(tmp_path / "run"))
    with pytest.raises(FileNotFoundError, match="/nonexistent/forge-nb-model"):
        await forge_nb.spawn(cfg, progress=False)
    assert runtime.meshes() == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has the GPU the test asks for")
async def test_gpus_that_do_not_exist_fail_the_spawn_and_what_started_is_stopped(runtime, tmp_path):
    cfg = forge_nb.quickstart(generator=GeneratorConfig(num_replicas=1, with_gpus=True), run_dir=str(tmp_path / "run"))
    with pytest.raises(RuntimeError, match=r"service 'policy' failed to start: .*no CUDA"):
        await forge_nb.spawn(cfg, progress=False)
    # the trainer had started, and so had torchstore: both are gone again
    assert runtime.meshes() == []
