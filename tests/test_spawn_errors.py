"""A run that cannot come up says why, and leaves nothing running: no mesh, no torchstore."""

from __future__ import annotations

import os

import pytest
import torch

import forge_nb
from forge_nb.config import GeneratorConfig
from forge_nb.system.processes.procs import live_children
from forge_nb.system.runtime import registry, spawning, warm


async def test_a_model_that_does_not_exist_is_named_and_leaves_no_process(runtime, tmp_path):
    # the trainer's processes start first (controller.lifecycle.prestart); the model is looked for after: they stop
    before = {p.pid for p in live_children(os.getpid(), recursive=True)}
    cfg = forge_nb.quickstart(model="/nonexistent/forge-nb-model", run_dir=str(tmp_path / "run"))
    with pytest.raises(FileNotFoundError, match="/nonexistent/forge-nb-model"):
        await forge_nb.spawn(cfg, progress=False)
    assert registry.meshes() == [] and warm.kept() == []
    assert {p.pid for p in live_children(os.getpid(), recursive=True)} <= before


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has the GPU the test asks for")
async def test_gpus_that_do_not_exist_are_refused_before_anything_spawns(runtime, tmp_path):
    from forge_nb import weights

    cfg = forge_nb.quickstart(generator=GeneratorConfig(num_replicas=2, with_gpus=True), run_dir=str(tmp_path / "run"))
    with pytest.raises(forge_nb.ResourceError, match=r"run 'quickstart' \(generator 2\) asks for 2 GPU.*no CUDA"):
        await forge_nb.spawn(cfg, progress=False)
    assert registry.meshes() == [] and not weights.store_running()  # not even torchstore was started
    assert not (tmp_path / "run").exists()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
async def test_more_gpus_than_are_free_are_refused_and_a_mesh_holding_them_is_named(runtime, tmp_path):
    """The CUDA side of the refusal above: more GPUs than the machine has, then GPUs another mesh holds."""
    from forge_nb import weights

    n = torch.cuda.device_count()
    cfg = forge_nb.quickstart(generator=GeneratorConfig(num_replicas=n + 1, with_gpus=True),
                              run_dir=str(tmp_path / "run"))
    with pytest.raises(forge_nb.ResourceError, match=rf"asks for {n + 1} GPU\(s\) but {n} of the {n} visible are free"):
        await forge_nb.spawn(cfg, progress=False)
    assert registry.meshes() == [] and not weights.store_running()
    assert not (tmp_path / "run").exists()

    holder = await spawning.spawn_mesh("holder", n, with_gpus=True)
    try:
        with pytest.raises(forge_nb.ResourceError, match=r"0 of the .* visible are free \(in use by holder"):
            await spawning.spawn_mesh("another", 1, with_gpus=True)
        assert [m.name for m in registry.meshes()] == ["holder"]
    finally:
        await holder.stop()


async def test_a_run_that_fails_to_come_up_leaves_no_run_directory(runtime, tmp_path):
    from tests.light_actors import LightGenerator

    cfg = forge_nb.quickstart(run_dir=str(tmp_path / "run"), max_res_tokens=4)
    with pytest.raises(RuntimeError, match="service 'trainer' failed to start: .*unexpected keyword argument"):
        # a generator in the trainer's place: its constructor refuses the trainer's arguments
        await forge_nb.spawn(cfg, progress=False, actors={"policy": LightGenerator, "trainer": LightGenerator})
    assert registry.meshes() == []
    assert not (tmp_path / "run").exists()


def test_a_corrupt_config_json_says_what_is_wrong(tmp_path):
    from forge_nb.rundir import RunDir

    (tmp_path / "config.json").write_text('{"name": "quickstart", ')
    with pytest.raises(ValueError, match=r"config.json' is not valid JSON .* line 1"):
        _ = RunDir.open(tmp_path).config


class _Payload:
    def __reduce__(self):
        import pathlib

        return (pathlib.Path.touch, (pathlib.Path(self.marker),))


def test_a_state_file_in_the_run_directory_cannot_run_code(tmp_path):
    from forge_nb.rundir import RunDir

    (tmp_path / "config.json").write_text("{}")
    marker = tmp_path / "pwned"
    payload = _Payload()
    payload.marker = str(marker)
    torch.save({"step": 1, "x": payload}, tmp_path / "state.pt")
    with pytest.raises(Exception, match="Weights only load failed"):
        RunDir.open(tmp_path).load_state()
    assert not marker.exists()
