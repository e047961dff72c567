"""One real quickstart run (a vLLM CPU generator, a trainer) with the mismatch measured and masked, dynamic sampling
and a periodic pass@k evaluation: drift injected into the generator shows in mismatch/kl, the masked share is the
injected tail, the run still learns, only groups with a reward spread train, and evaluations hold one version.

The tests share the run and go in file order; each leaves it paused.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import torch

import forge_nb
from forge_nb.config import LoopConfig, RolloutConfig, TrainerConfig
from forge_nb.controller.episodes import generate_episode
from forge_nb.rl import Episode, collate

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(900), pytest.mark.asyncio(loop_scope="module")]

HOT = 1.2  # the drifting generator's temperature; the trainer scores at 1.0
CAP = 1.25  # the mask's band in the drift test: [1 / CAP, CAP]
GROUPS: dict[str, list[float]] = {}  # every group the episode functions made: its rewards, by episode id
BASELINE: dict[str, float] = {}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def run(tmp_path_factory):
    cfg = forge_nb.quickstart(
        run_dir=str(tmp_path_factory.mktemp("mismatch")),
        trainer=TrainerConfig(optimizer=forge_nb.quickstart().trainer.optimizer, loss="grpo",
                              loss_config={"beta": 0.0, "mismatch_correction": "token_mask"}),
        loop=LoopConfig(mode="async", rollout_loops=8, sync_interval=2, eval_every=40, eval_k=2, eval_prompts=8),
        rollout=RolloutConfig(dynamic_sampling=True))
    run = await forge_nb.spawn(cfg, progress=False)

    async def recorded(handle: Any, sample: dict[str, Any]) -> list[Episode]:
        group = await generate_episode(handle, sample)
        for episode in group:
            GROUPS[episode.episode_id] = [e.reward for e in group]
        return group

    run.episode_fn = recorded
    yield run
    await run.shutdown()


def _mean(rows: list[dict[str, Any]], key: str) -> float:
    values = [r[key] for r in rows if key in r and math.isfinite(r[key])]
    assert values, f"no row has {key}"
    return statistics.fmean(values)


async def test_mismatch_is_measured_and_small_when_engine_and_trainer_agree(run):
    rows = await run.step(12)
    for key in ("mismatch/kl", "mismatch/ratio_p1", "mismatch/ratio_p50", "mismatch/ratio_p99", "mismatch/ratio_min",
                "mismatch/ratio_max", "mismatch/frac_outside", "mismatch/frac_masked"):
        assert all(key in r for r in rows), key
    # float32 engine and trainer: the staleness of async episodes is all that separates them
    assert _mean(rows, "mismatch/kl") < 0.05 and _mean(rows, "mismatch/frac_masked") < 0.05
    assert 0.9 < _mean(rows, "mismatch/ratio_p50") < 1.1
    same = [r["mismatch/kl_same_version"] for r in rows if "mismatch/kl_same_version" in r]
    assert same and max(same) < 1e-3  # the episodes of the weights being trained: the engine's numerics alone
    BASELINE["kl"] = statistics.fmean(same)
    # the explorer's per-token view: trained episodes carry the trainer's ratio of each of their tokens
    shown = [e for e in run.episodes(n=500) if "token_ratios" in e]
    assert shown and all(0 < len(e["token_ratios"]) <= run.config.max_res_tokens for e in shown)


class _Hotter:
    """The run as an episode function sees it, with the generator sampling at HOT."""

    def __init__(self, run: Any):
        self._run = run

    def __getattr__(self, name: str) -> Any:
        return getattr(self._run, name)

    @property
    def sampling_overrides(self) -> dict[str, Any]:
        return {**self._run.sampling_overrides, "temperature": HOT}


async def test_drift_raises_mismatch_and_the_mask_takes_the_injected_tail(run):
    async def drifting(handle: Any, sample: dict[str, Any]) -> list[Episode]:
        group = await generate_episode(_Hotter(handle), sample)
        for episode in group:
            GROUPS[episode.episode_id] = [e.reward for e in group]
        return group

    # on-policy from here: every trained episode comes from the version it trains, so the drift is all that differs
    run.set(mismatch_cap=CAP, mismatch_floor=1 / CAP, max_policy_age=0)
    run.episode_fn = drifting
    run.clear_buffer("drift injected from here on")
    rows = await run.step(10)
    rows = rows[2:]  # episodes made before the switch may still have been in flight
    assert _mean(rows, "mismatch/kl") > 10 * max(BASELINE["kl"], 1e-4)
    # the injected tail, measured apart: the trainer's logprobs (temperature 1) of answers sampled at HOT
    groups = [await drifting(run, run.task.sample()) for _ in range(8)]
    batch = collate([e for g in groups for e in g])
    trainer_lp = (await run.trainer.forward.call(batch.tokens, batch.request_len))[0]
    ratio = torch.exp(trainer_lp - batch.generator_logprobs)[batch.response_mask]
    tail = float(((ratio > CAP) | (ratio < 1 / CAP)).float().mean())
    assert tail > 0.02, "the drift injected no tail to mask"
    masked = _mean(rows, "mismatch/frac_masked")
    assert masked == pytest.approx(_mean(rows, "mismatch/frac_outside"), abs=1e-6)  # one band, one set of tokens
    assert masked == pytest.approx(tail, abs=0.12)


async def test_the_run_learns_with_the_correction_on(run):
    run.set(mismatch_correction="token_truncate", mismatch_cap=2.0, mismatch_floor=0.0, max_policy_age=3)
    rows: list[dict[str, Any]] = []
    for _ in range(8):  # until the last 20 steps average 0.8, at most 8 x 40 steps
        rows += await run.step(40)
        if _mean(rows[-20:], "reward/mean") >= 0.8:
            break
    assert _mean(rows[-20:], "reward/mean") >= 0.8, [round(r["reward/mean"], 2) for r in rows[-20:]]
    assert "mismatch/frac_truncated" in rows[-1] and _mean(rows, "mismatch/kl") > 0


async def test_dynamic_sampling_trains_only_groups_with_a_reward_spread(run):
    ledger = run.ledger()
    assert ledger["balanced"] and ledger["zero_variance"] > 0  # the task saturated: equal groups were dropped
    gate = run.controller.gate
    assert ledger["zero_variance"] == gate.totals["episodes_dropped"]
    rows = run.metrics.rows
    assert sum(r.get("groups/dropped", 0) for r in rows) <= gate.totals["groups_dropped"]
    assert sum(r.get("groups/generated", 0) for r in rows) <= gate.totals["groups_generated"]
    assert any(r.get("frac_reward_zero_std", 0) > 0 for r in rows)
    # every episode that entered the buffer (so every one trained) came from a group with unequal rewards
    kept = run.episodes(n=2000)
    assert kept and all(max(GROUPS[e["episode_id"]]) > min(GROUPS[e["episode_id"]]) for e in kept
                        if e["episode_id"] in GROUPS)


async def test_evaluations_hold_one_version_and_report_pass_at_k(run):
    periodic = run.metrics.events_frame("eval")
    assert len(periodic) >= 1 and {"eval/avg@2", "eval/pass@1", "eval/pass@2"} <= set(periodic.columns)
    # each periodic evaluation's values are in its step's row, in the run directory's file as in memory
    on_disk = {r["step"]: r for r in map(json.loads, Path(run.dir.path, "metrics.jsonl").read_text().splitlines())}
    for _, event in periodic.iterrows():
        step = int(event["step"])
        in_memory = next(r for r in reversed(run.metrics.rows) if r["step"] == step)
        assert on_disk[step]["eval/avg@2"] == event["eval/avg@2"] == in_memory["eval/avg@2"]
    values = await run.evaluate(k=4, n=8)
    assert values["version"] == run.version and values["k"] == 4 and values["prompts"] == 8
    assert 0 <= values["eval/pass@1"] <= values["eval/pass@2"] <= values["eval/pass@4"] <= 1
    last = run.metrics.events_frame("eval").iloc[-1]
    assert last["version"] == run.version and last["eval/pass@4"] == values["eval/pass@4"]
    with pytest.raises(ValueError, match=r"evaluate\(k=0\)"):
        await run.evaluate(k=0)
    with pytest.raises(ValueError, match=r"no longer stored"):
        await run.evaluate(k=2, version=run.version - 1)
    # an episode function as the answerer (how a verifiers env is evaluated): k is the run's group size
    played = await run.evaluate(run.task.eval_prompts(4), episode_fn=generate_episode)
    assert played["k"] == run.config.group_size == 4 and "eval/pass@4" in played and played["version"] == run.version
    with pytest.raises(ValueError, match=r"group_size=4 answers per sample"):
        await run.evaluate(k=3, episode_fn=generate_episode)
    run.start()  # from a running run: it parks for the evaluation and goes on
    values = await run.evaluate(["a", "b"], k=2)
    assert run.state == "running" and values["prompts"] == 2
    run.pause()
