"""The TorchForge documents' code, read from ``../shared/seeds``, runs on forge_nb (issue 18).

Every Python block of the documents has a plan in ``tests/seeds/documents.py``: it runs here, with the import
changes and a local model and dataset, plus the fixes listed there with their reasons; or it is skipped
with the reason. The services blocks run in order in one namespace, as cells of one notebook would: the
fundamentals' ``asyncio.gather`` spawns the whole system (vLLM generator, trainer, reference model,
replay buffer, dataset, advantage and reward actors), then the documents' episode functions, RL steps and
loops run on it. The loops run forever in the documents; here each runs until the policy has moved on by
two versions, then is cancelled, as a user interrupts a cell.

``GIVEN`` holds the names the documents use without defining them, each with its reason.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import inspect
import json
import math
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import torch

from forge_nb import weights
from forge_nb.models import build_tiny_model
from forge_nb.system.runtime import lifecycle, registry
from tests.seeds.documents import PLANS, SEEDS, all_blocks, prepared

pytestmark = pytest.mark.skipif(not SEEDS.is_dir(), reason=f"the TorchForge documents are not at {SEEDS}")

GIVEN_REASONS = {
    "Episode": "the documents' episode functions build Episodes without importing the class",
    "reward": "rl_workflows.md calls the reward service `reward`; the fundamentals spawn it as reward_actor",
    "services": "the fundamentals' step functions take the services as a dict of the names they spawned",
    "prompt": "the adverb examples route a prompt they never define",
    "question": "likewise, under the name the fundamentals use",
    "target": "the fault-tolerance example scores against a target it never defines",
    "prompt1": "the session example's two prompts",
    "prompt2": "the session example's two prompts",
    "version": "the fanout example's weight version: the policy's current one",
    "input_ids": "the conceptual step reads input_ids and max_req_tokens that it never builds",
    "max_req_tokens": "likewise",
    "create_episode_from_response": "the fundamentals call it without defining it (the tutorial's own returns "
    "a dict); it builds the Episode from the response, score and reference logprobs",
    "create_episode": "the same helper, for the tutorial's step after its fix",
    "np": "the documents use numpy as np without importing it",
    "time": "the logging example uses time without importing it",
    "initial_state": "CustomEnv's skeleton returns state it leaves to the reader",
    "observation": "likewise",
    "reward=1.0": "CustomEnv's step returns a reward it leaves to the reader (its own namespace: `reward` is the "
    "reward service elsewhere)",
    "done": "likewise",
    "PolicyActor": "the 'start small' and concepts examples name the generator PolicyActor",
    "SandboxedCoder": "concepts.md's name for SandboxedPythonCoder",
    "SandboxedPythonCoder": "the code execution example uses it without importing it",
}


def skipped() -> list[tuple[str, int]]:
    return [key for key, plan in PLANS.items() if plan.run is None]


def test_every_block_has_a_plan_and_its_fixes_apply(tmp_path: Path) -> None:
    blocks = all_blocks()
    assert set(blocks) == set(PLANS), "a document gained or lost a code block: give it a plan"
    for key, plan in PLANS.items():
        code = prepared(key, str(tmp_path / "model"), str(tmp_path / "data.jsonl"))
        assert "from forge." not in code and "import forge\n" not in code, key
        compile(code, f"{key}", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        assert plan.run is not None or plan.reason, f"{key} is skipped without a reason"
        assert all(why for _, _, why in plan.fixes), f"{key} has a fix without a reason"
    # what is not run, and why, is part of the test's output
    print("\n".join(f"not run: {k[0]} block {k[1]}: {PLANS[k].reason}" for k in skipped()))


async def run_block(key: tuple[str, int], ns: dict[str, Any], model: str = "", dataset: str = "") -> None:
    """Run a prepared block in ``ns`` as a notebook cell: top-level await allowed."""
    code = compile(prepared(key, model, dataset), f"<{key[0]} block {key[1]}>", "exec",
                   flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True)  # not this module's __future__
    result = eval(code, ns)  # noqa: S307 - the documents' own code is what is under test
    if inspect.iscoroutine(result):
        await result


# -- blocks that need no service -------------------------------------------------------------------------


async def test_the_tutorials_plain_blocks_run(capsys: pytest.CaptureFixture[str]) -> None:
    ns: dict[str, Any] = {"__name__": "seed_tutorial"}
    for i in (0, 2, 3, 4, 5):
        await run_block(("rl_fundamentals_tutorial.rst", i), ns)
    # complete_rl_training_example is defined but, as the block says, not run: it awaits its mocks' plain
    # return values (a dict is not awaitable), so calling it fails whatever runs underneath
    assert inspect.iscoroutinefunction(ns["complete_rl_training_example"])
    out = capsys.readouterr().out
    assert "Example RL experience" in out and "Key Benefits" in out


def test_the_skill_cards_types_are_forge_nbs() -> None:
    import forge_nb.rl.types as types

    for i, name in ((3, "TextTrainBatch"), (4, "ForwardBackwardResult"), (5, "Completion")):
        ns: dict[str, Any] = {"__name__": "seed_types", "Tensor": torch.Tensor}
        code = "from dataclasses import dataclass\n" + prepared(("torchforge_skill_card.md", i), "", "")
        exec(compile(code, f"<skill card block {i}>", "exec", dont_inherit=True), ns)
        documented = set(ns[name].__dataclass_fields__)
        ours = set(getattr(types, name).__dataclass_fields__)
        assert documented <= ours, f"{name} lacks {documented - ours}"
    batch = types.TextTrainBatch(input_ids=torch.ones(1, 3, dtype=torch.long), target_ids=torch.ones(1, 3,
                                 dtype=torch.long), target_mask=torch.ones(1, 3), target_weights=torch.ones(1, 3))
    assert batch.input_ids.shape == (1, 3)
    done = types.Completion(text="ab", token_ids=[2, 3], logprobs=[-0.1, -0.2], metadata={"k": 1})
    assert done.text == "ab" and done.token_ids.tolist() == [2, 3]


async def test_the_skill_cards_loss_blocks_run() -> None:
    ns: dict[str, Any] = {"__name__": "seed_losses"}
    await run_block(("torchforge_skill_card.md", 1), ns)
    b, t, v = 2, 5, 11
    torch.manual_seed(0)
    logits = torch.randn(b, t, v, requires_grad=True)
    target_ids = torch.randint(0, v, (b, t))
    ns |= {
        # the application's values that the integration block reads
        "trainer_output": type("Out", (), {"logits": logits})(),
        "batch": type("Batch", (), {"target_ids": target_ids, "target_mask": torch.ones(b, t)})(),
        "advantages": torch.tensor([[1.0], [-1.0]]),
        "completions": type("C", (), {"logprobs": torch.log_softmax(logits.detach(), -1).gather(
            -1, target_ids.unsqueeze(-1)).squeeze(-1)})(),
        "ref_logprobs": torch.full((b, t), -2.0),
    }
    await run_block(("torchforge_skill_card.md", 2), ns)
    loss, metrics = ns["result"]
    assert loss.requires_grad and math.isfinite(loss.item())
    assert set(metrics) == {"pg_loss", "kl", "ratio_mean"} and metrics["ratio_mean"] == pytest.approx(1.0)
    loss.backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0
    for i, name in ((6, "GRPOLoss"), (7, "DAPOLoss")):
        await run_block(("torchforge_skill_card.md", i), ns)
        loss, metrics = ns["loss_fn"](logits=logits, target_ids=target_ids, advantages=ns["advantages"],
                                      generator_logprobs=ns["completions"].logprobs,
                                      loss_mask=torch.ones(b, t), ref_logprobs=ns["ref_logprobs"])
        assert math.isfinite(loss.item()) and metrics, name


async def test_gpu_requests_are_refused_before_anything_is_spawned(runtime: Any) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the refusal is what a machine without it does")
    from forge_nb import Policy, ResourceError
    from forge_nb.actors.coder import SandboxedPythonCoder
    from forge_nb.apps.grpo import RewardActor

    for key in (("rl_workflows.md", 10), ("concepts.md", 2)):
        ns = {"__name__": "seed_gpus", "PolicyActor": Policy, "SandboxedCoder": SandboxedPythonCoder,
              "RewardActor": RewardActor}
        with pytest.raises(ResourceError, match="GPU"):
            await run_block(key, ns)
        assert registry.meshes() == [], f"{key} spawned processes before refusing"


# -- the documents' RL code on real services ---------------------------------------------------------------

ALPHA = "abcdefgh"  # the tiny model's whole alphabet


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def system(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The fundamentals' spawn block, run as written (local model and dataset), and its namespace."""
    folder = tmp_path_factory.mktemp("seeds")
    model = str(build_tiny_model(folder / "tiny"))
    dataset = folder / "gsm8k.jsonl"
    rows = [{"question": f"{a}{b}", "answer": f"{b}{a}\n#### {i}"} for i, (a, b) in
            enumerate(zip(ALPHA, ALPHA[::-1], strict=True))]
    dataset.write_text("\n".join(json.dumps(r) for r in rows))
    lifecycle.ensure_started()
    ns: dict[str, Any] = {"__name__": "seed_system"}
    key = ("rl_fundamentals_part1.md", 5)
    code = prepared(key, model, str(dataset))
    if not torch.cuda.is_available():  # the same code on a GPU machine; here its GPUs are CPU procs
        code = code.replace("with_gpus=True", "with_gpus=False")
    try:
        result = eval(compile(code, f"<{key}>", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True), ns)
        if inspect.iscoroutine(result):
            await result
        ns.update(given(ns))
        yield ns
    finally:
        await weights.shutdown_store()  # the Generator and RLTrainer started it, as a kernel's first spawn does
        await registry.stop_all(timeout=30)
        assert registry.meshes() == []


def given(ns: dict[str, Any]) -> dict[str, Any]:
    """The names of ``GIVEN_REASONS``, made from the spawned system."""
    import time

    import numpy as np

    from forge_nb import Episode, SandboxedPythonCoder

    def create_episode(response: Any, score: float, ref_logprobs: Any, step: int) -> Episode:
        return Episode(prompt_ids=response.prompt_ids, response_ids=response.token_ids, reward=score,
                       ref_logprobs=torch.as_tensor(ref_logprobs).reshape(-1))

    names = ("dataloader", "policy", "trainer", "replay_buffer", "compute_advantages", "ref_model", "reward_actor")
    values = {
        "Episode": Episode, "reward": ns["reward_actor"], "services": {n: ns[n] for n in names},
        "prompt": "abc", "question": "abc", "target": "4", "prompt1": "ab", "prompt2": "cd", "version": 0,
        "create_episode_from_response": create_episode, "create_episode": create_episode,
        "np": np, "time": time, "SandboxedPythonCoder": SandboxedPythonCoder,
        "initial_state": "start", "observation": "abc", "done": True,
    }
    assert set(values) <= set(GIVEN_REASONS)
    return values


async def versions(ns: dict[str, Any]) -> list[int]:
    return await ns["policy"].get_version.fanout()


async def trainer_steps(ns: dict[str, Any]) -> int:
    return int((await ns["trainer"].info.call_one())["step"])


async def run_until_trained(ns: dict[str, Any], coro: Any, steps: int = 2, timeout: float = 240.0) -> None:
    """Run one of the documents' endless loops until the trainer took ``steps`` more optimizer steps, then
    cancel it (the loops number their own versions from 0, so the trainer's step count is the measure)."""
    start = await trainer_steps(ns)
    task = asyncio.ensure_future(coro)
    try:
        async with asyncio.timeout(timeout):
            while await trainer_steps(ns) < start + steps and not task.done():
                await asyncio.sleep(0.5)
        if task.done():
            task.result()  # an exception in the document's loop fails the test here
            raise AssertionError("the document's loop ended on its own")
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def on_the_system(test: Any) -> Any:
    """Marks a test that runs on the module's spawned system: heavy, its event loop, a generous bound."""
    for mark in (pytest.mark.heavy, pytest.mark.timeout(600), pytest.mark.asyncio(loop_scope="module")):
        test = mark(test)
    return test


@on_the_system
async def test_adverbs_and_a_failure_handler_run(system: dict[str, Any]) -> None:
    ns = system
    await run_block(("rl_fundamentals_part1.md", 4), ns)
    assert isinstance(ns["answer"], str)
    await run_block(("concepts.md", 3), ns)
    assert isinstance(ns["response"][0].text, str)
    await run_block(("concepts.md", 5), ns)
    assert ns["response1"][0].prompt_ids.tolist() and ns["response2"][0].prompt_ids.tolist()
    await run_block(("concepts.md", 1), ns)
    assert isinstance(ns["result"][0].text, str)
    await run_block(("rl_fundamentals_part1.md", 6), ns)
    assert isinstance(ns["score"], float)
    ns["version"] = max(await versions(ns))
    await run_block(("concepts.md", 4), ns)


@on_the_system
async def test_generate_episode_fills_the_replay_buffer(system: dict[str, Any]) -> None:
    ns = system
    await run_block(("rl_workflows.md", 0), ns)
    before = await ns["replay_buffer"].length.call_one()
    for _ in range(2):
        await ns["generate_episode"](ns["dataloader"], ns["policy"], ns["reward"], ns["replay_buffer"])
    assert await ns["replay_buffer"].length.call_one() == before + 2
    await run_block(("rl_workflows.md", 11), ns)  # the same function with timing prints
    await ns["generate_episode"](ns["dataloader"], ns["policy"], ns["reward"], ns["replay_buffer"])


@on_the_system
async def test_the_fundamentals_rl_steps_train_and_sync_weights(system: dict[str, Any]) -> None:
    ns = system
    await run_block(("rl_fundamentals_part1.md", 3), ns)
    await run_block(("rl_fundamentals_tutorial.rst", 0), ns)  # the tutorial's imports (Dict, Any, Optional)
    await run_block(("rl_fundamentals_tutorial.rst", 1), ns)
    await run_block(("rl_fundamentals_part1.md", 1), ns)
    # generate_episode's episodes (an earlier test) carry no reference logprobs, which these beta=0.1 steps need
    await ns["replay_buffer"].clear.call_one()
    start = max(await versions(ns))
    losses = []
    for step in range(start, start + 4):
        # the conceptual step first: it reads input_ids and max_req_tokens from a real response
        response = (await ns["policy"].generate.route("abc"))[0]
        ns["input_ids"] = torch.cat([response.prompt_ids, response.token_ids]).unsqueeze(0)
        ns["max_req_tokens"] = len(response.prompt_ids)
        await ns["conceptual_forge_rl_step"](ns["services"], step)
        loss = await ns["real_rl_training_step"](ns["services"], step)
        losses.append(loss)
    trained = [loss for loss in losses if loss is not None]
    assert trained, "no step found a batch in the replay buffer"
    assert all(math.isfinite(float(loss.loss if hasattr(loss, "loss") else loss[0].loss)) for loss in trained)
    assert min(await versions(ns)) > start
    loss = await ns["forge_rl_step"](ns["services"], max(await versions(ns)))
    assert loss is None or math.isfinite(float(loss[0].loss))


@on_the_system
async def test_the_workflows_loops_train(system: dict[str, Any]) -> None:
    ns = system
    await run_block(("rl_workflows.md", 0), ns)  # generate_episode, as the loops call it
    await run_block(("rl_workflows.md", 2), ns)
    # generate_episode stores no reference logprobs, and the trainer's GRPO loss has beta=0.1: the step is
    # refused with the reason, never trained against zero logprobs (a KL of ~100 in torchforge's collate)
    with pytest.raises(Exception, match="beta=0.1 needs ref_logprobs"):
        await run_until_trained(ns, ns["synchronous_rl"](2))
    await ns["trainer"].set_hparams.call(beta=0.0)  # what these loops need: no KL penalty
    await run_until_trained(ns, ns["synchronous_rl"](2))
    await run_block(("rl_workflows.md", 1), ns)
    await run_until_trained(ns, ns["async_rl_loop"](2))
    await run_block(("rl_workflows.md", 6), ns)  # two warmup episodes make one batch; no rollouts run after
    await run_until_trained(ns, ns["warmup_then_train"](2), steps=1)
    await run_block(("rl_workflows.md", 12), ns)  # its continuous_training also samples without a version
    task = asyncio.ensure_future(ns["continuous_training"]())
    rollouts = asyncio.ensure_future(ns["async_rl_loop"].__globals__["continuous_rollouts"]())
    try:
        await asyncio.sleep(0)
        async with asyncio.timeout(240):
            while not ns["recent_kls"]:
                if task.done():
                    task.result()
                await asyncio.sleep(0.5)
    finally:
        for t in (task, rollouts):
            t.cancel()
        await asyncio.gather(task, rollouts, return_exceptions=True)
    assert ns["recent_kls"]  # one entry per step (NaN: these episodes have no reference logprobs)


@on_the_system
async def test_environment_blocks_run_as_services(system: dict[str, Any]) -> None:
    ns = system
    await run_block(("rl_workflows.md", 3), ns)  # SandboxedPythonCoder service and its episode function
    await ns["generate_episode"]()
    stdout, stderr = await ns["coder"].execute.route("print(6 * 7)")
    assert (stdout, stderr) == ("42\n", "")
    env_ns = ns | {"reward": 1.0}  # the skeleton's step returns a `reward` it leaves to the reader
    await run_block(("rl_workflows.md", 5), env_ns)  # CustomEnv as a service, stepped until done
    assert (env_ns["obs"], env_ns["reward"], env_ns["done"]) == ("abc", 1.0, True)
    assert isinstance(env_ns["action"], str)
    await run_block(("torchforge_skill_card.md", 0), ns)  # a RewardActor subclass that grades
    from forge_nb.apps.grpo import RewardActor

    graded = await RewardActor.options(procs=1).as_service(reward_functions=[ns["MathReward"]()])
    assert await graded.evaluate_response.route(prompt="q", response=r"so \boxed{4}", target="4") == 1.0
    assert await graded.evaluate_response.route(prompt="q", response=r"so \boxed{5}", target="4") == 0.0
    await graded.shutdown()


@on_the_system
async def test_the_skill_cards_custom_loss_trains_a_run_and_reaches_its_metrics_and_dashboard(
        system: dict[str, Any], tmp_path: Path) -> None:
    """Workflow 2: the card's CustomLoss, defined from the document itself in a cell, passed to a run's
    trainer. Its beta of 0.1 needs a reference model (a config without one is refused, naming it)."""
    import dataclasses

    import forge_nb
    from forge_nb.widgets import Dashboard

    await registry.stop_all(timeout=30)  # the documents' system is done with; free the cores for this run
    ns: dict[str, Any] = {"__name__": "seed_custom_loss"}
    await run_block(("torchforge_skill_card.md", 1), ns)
    base = forge_nb.quickstart(run_dir=str(tmp_path))
    trainer = dataclasses.replace(base.trainer, loss=ns["CustomLoss"](), loss_config={})
    with pytest.raises(ValueError, match="beta=0.1, which needs reference logprobs"):
        dataclasses.replace(base, trainer=trainer)
    with pytest.raises(ValueError, match="configure the object through its constructor"):
        dataclasses.replace(base.trainer, loss=ns["CustomLoss"](), loss_config={"beta": 0.0})
    cfg = dataclasses.replace(base, use_reference=True, trainer=trainer)
    run = await forge_nb.spawn(cfg, progress=False)
    try:
        rows = await run.step(3)
        assert [r["step"] for r in rows] == [1, 2, 3]
        for row in rows:  # the loss's own metrics, recorded with the step
            assert {"pg_loss", "kl", "ratio_mean"} <= set(row) and math.isfinite(row["kl"])
        assert list(run.metrics.frame()["pg_loss"]) == [r["pg_loss"] for r in rows]
        d = Dashboard(run)
        try:  # its "kl" is the KL panel's curve
            assert list(d.curves.trace("kl").y) == pytest.approx([r["kl"] for r in rows])
        finally:
            d.close()
        recorded = json.loads((run.dir.path / "config.json").read_text())["trainer"]["loss"]
        assert recorded == "seed_custom_loss:CustomLoss"  # the object, as its class's path
    finally:
        await run.shutdown()
