"""A LoRA run end to end (real vLLM generator with vLLM's LoRA, the real trainer with peft's): adapters alone move
from trainer to generators, the trainer's base model is the KL term's reference (no ReferenceModel service), and
a generator replica killed mid-run comes back serving the run's adapter, and the run checkpoints and resumes in a
fresh Run from its directory."""

from __future__ import annotations

import os
import signal

import pytest
from safetensors.torch import load_file

import forge_nb
from forge_nb.controller.episodes import BaseInTrainer

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(600), pytest.mark.asyncio]

LORA = {"trainer.lora": {"rank": 8, "alpha": 16}, "trainer.optimizer.lr": 2e-3, "generator.num_replicas": 1,
        "trainer.loss_config": {"beta": 0.02}}  # a KL term: its reference is the base, in the trainer


async def test_a_lora_run_moves_adapters_only_and_resumes_from_its_checkpoint(tmp_path):
    cfg = forge_nb.quickstart(name="lora-run", run_dir=str(tmp_path / "run"))
    run = await forge_nb.spawn(cfg, overrides=LORA, progress=False)
    try:
        assert isinstance(run.ref_model, BaseInTrainer) and set(run.services) == {"policy", "trainer"}
        rows = await run.step(6)
        pushed = [r["weights/pushed_mb"] for r in rows if "weights/pushed_mb" in r]
        whole_mb = sum(t.numel() * t.element_size() for t in load_file(f"{run.model}/model.safetensors").values())
        whole_mb /= 2**20
        assert pushed and all(0 < mb < 0.15 * whole_mb for mb in pushed), (pushed, whole_mb)  # the adapters alone
        assert all(r["kl/k3"] >= 0 for r in rows) and any(r["kl/k3"] > 0 for r in rows[2:])  # policy vs its base
        (replica,) = run.policy.replicas
        killed = replica.mesh.pids[0]
        os.kill(killed, signal.SIGKILL)  # its respawn loads the run's current adapter (catch-up) and serves it
        rows = await run.step(3)
        assert len(rows) == 3 and replica.mesh.pids[0] != killed and run.ledger()["balanced"]
        assert await run.policy.get_version.fanout() == [run.version]
        await run.checkpoint()
        version, step = run.version, run.current_step
        assert await run.policy.get_version.fanout() == [version]
    finally:
        await run.shutdown()
    again = await forge_nb.resume(run.dir.path, progress=False)
    try:
        assert again.current_step == step and again.version == version
        assert (await again.trainer.info.call())[0]["step"] == step
        rows = await again.step(2)
        assert [r["step"] for r in rows] == [step + 1, step + 2] and again.ledger()["balanced"]
    finally:
        await again.shutdown()
