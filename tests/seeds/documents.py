"""The TorchForge documents' code blocks, read from ``../shared/seeds`` and made ready to run on forge_nb.

Each block is found by its document and its index among that document's Python blocks, and checked by
its first line, so a document that changes makes the test say which block moved. What is done to a block
before it runs is, in this order and nothing else:

1. the import changes every TorchForge user makes (``IMPORTS``: ``forge`` -> ``forge_nb`` and the like);
2. a local model and dataset where the block names a hub id (``LOCAL``);
3. the block's own ``fixes``, each an exact replacement with the reason it is needed: a bug in the document
   itself (an ``as_service()`` not awaited, an undefined name), or a bound on work a document runs forever.

``PLANS`` says, for every block, whether it runs and why not when it does not.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

SEEDS = Path(__file__).resolve().parents[2].parent / "shared" / "seeds"

IMPORTS: tuple[tuple[str, str], ...] = (
    ("from apps.grpo.main import", "from forge_nb.apps.grpo import"),
    ("from monarch.actor import Actor, endpoint", "from forge_nb import ForgeActor as Actor, endpoint"),
    ("from forge.", "from forge_nb."),
    ("import forge\n", "import forge_nb\n"),
)

HUB_MODEL = '"Qwen/Qwen3-1.7B"'
HUB_DATASET = '"openai/gsm8k"'


@dataclass(frozen=True)
class Plan:
    """How one block runs: ``run`` names the test that runs it, or it is skipped for ``reason``."""

    first_line: str
    run: str | None
    reason: str = ""
    fixes: tuple[tuple[str, str, str], ...] = field(default=())  # (old, new, why)


_GENERATE_EPISODE = "async def generate_episode(dataloader, policy, reward, replay_buffer):"
_SAME_AS = "the same code as rl_workflows.md block {}; it runs there"
_EPISODE_LITERAL = (
    "Episode(...)",
    "Episode(prompt_ids=response.prompt_ids, response_ids=response.token_ids, reward=reward_value)",
    "the document elides the Episode's fields ('Episode(...)'); they are the ones block 0 passes",
)
_UNPADDED_REF = (
    "max_req_tokens=512",
    "max_req_tokens=len(responses[0].prompt_ids)",
    "input_ids is the prompt and response joined without padding, so the response starts after the prompt, "
    "not at column 512 (torchforge's ReferenceModel reads logprobs from input_ids[:, max_req_tokens:])",
)

PLANS: dict[tuple[str, int], Plan] = {
    # -- rl_workflows.md ----------------------------------------------------------------------------------
    ("rl_workflows.md", 0): Plan(_GENERATE_EPISODE, "services"),
    ("rl_workflows.md", 1): Plan("async def async_rl_loop(num_rollout_loops: int):", "services"),
    ("rl_workflows.md", 2): Plan("async def synchronous_rl(batch_size: int):", "services"),
    ("rl_workflows.md", 3): Plan(
        "# Lightweight CPU-only service for parallel execution", "services",
        fixes=(
            ("num_replicas=16\n).as_service()", "num_replicas=2\n).as_service()",
             "16 sandbox processes on a 2-core test machine; 2 show the same routing"),
            ("coder = SandboxedPythonCoder", "coder = await SandboxedPythonCoder",
             "the document does not await as_service(), a coroutine"),
            ("prompt = await dataloader.sample.route()", "prompt, target = await dataloader.sample.route()",
             "DatasetActor.sample returns (prompt, target), as the document's other blocks unpack it"),
            ("code = await policy.generate.route(prompt)", "code = (await policy.generate.route(prompt))[0].text",
             "generate returns a list of Completions; the code to run is the first one's text"),
            ("Episode(...)",
             "Episode(prompt_ids=[1], response_ids=[2], reward=reward)",
             "the document elides the Episode's fields"),
        ),
    ),
    ("rl_workflows.md", 4): Plan(
        "# Create a web browsing environment", None,
        reason="WebBrowsingEnv is a sketch: neither torchforge nor the document defines it, nor "
        "reward_model.evaluate; tool environments are the environments issue's work"),
    ("rl_workflows.md", 5): Plan(
        "from monarch.actor import Actor, endpoint", "services",
        fixes=(
            ("num_replicas=16\n).as_service()", "num_replicas=2\n).as_service()",
             "16 processes on a 2-core test machine; 2 show the same routing"),
            ("env = CustomEnv", "env = await CustomEnv", "the document does not await as_service(), a coroutine"),
            ("obs = await env.reset.route()\n", "obs = await env.reset.route()\ndone = False\n",
             "the document's loop reads `done` before anything sets it"),
            ("action = await policy.act.route(obs)", "action = (await policy.generate.route(obs))[0].text",
             "the document's policy has no `act`; a Generator acts by generating"),
        ),
    ),
    ("rl_workflows.md", 6): Plan("async def warmup_then_train(warmup_episodes: int):", "services"),
    ("rl_workflows.md", 7): Plan(
        "async def train_with_eval(eval_interval: int):", None,
        reason="it reads episode.reward from generate_episode, which returns nothing in the document, and "
        "passes replay_buffer=None, which generate_episode calls .add.route on"),
    ("rl_workflows.md", 8): Plan(
        "async def curriculum_training():", None,
        reason="a sketch: max_difficulty, episodes_per_difficulty, generate_episode_with_prompt and evaluate "
        "are defined nowhere"),
    ("rl_workflows.md", 9): Plan(
        "async def multi_task_training(tasks: List[str]):", None,
        reason="a sketch: create_dataloader is defined nowhere (and List is not imported)"),
    ("rl_workflows.md", 10): Plan(
        "# Single GPU, single replica, synchronous", "gpu_refused",
        fixes=(
            ("policy = PolicyActor", "policy = await PolicyActor", "as_service() is a coroutine"),
            ("reward = RewardActor", "reward = await RewardActor", "as_service() is a coroutine"),
        ),
        reason="asks for GPUs: on a machine without CUDA forge_nb refuses before spawning anything"),
    ("rl_workflows.md", 11): Plan(_GENERATE_EPISODE, "services", fixes=(_EPISODE_LITERAL,)),
    ("rl_workflows.md", 12): Plan(
        "from collections import deque", "services",
        fixes=(
            ("loss, kl = await trainer.train_step.route(batch)",
             "result = await trainer.train_step.route(batch)\n"
             "            loss, kl = result.loss, result.metrics.get('kl', float('nan'))",
             "train_step returns one ForwardBackwardResult(loss, metrics), as the skill card defines it; KL "
             "exists only for batches with reference logprobs, which generate_episode does not store"),
        ),
    ),
    # -- concepts.md --------------------------------------------------------------------------------------
    ("concepts.md", 0): Plan(
        "from monarch.actor import Actor, this_host", None,
        reason="monarch's own API, not TorchForge's: it asks for 8 GPUs, never imports endpoint, and "
        "calls call_all, which monarch 0.7 names call"),
    ("concepts.md", 1): Plan("try:", "services"),
    ("concepts.md", 2): Plan(
        "# Create a policy service with 16 replicas, each using 8 GPUs", "gpu_refused",
        fixes=(
            ("policy = PolicyActor", "policy = await PolicyActor", "as_service() is a coroutine"),
            ("coder = SandboxedCoder", "coder = await SandboxedCoder", "as_service() is a coroutine"),
        ),
        reason="128 GPUs: refused before anything is spawned"),
    ("concepts.md", 3): Plan("response = await policy.generate.route(prompt)", "services"),
    ("concepts.md", 4): Plan("await policy.update_weights.fanout(version)", "services"),
    ("concepts.md", 5): Plan("async with policy.session():", "services"),
    ("concepts.md", 6): Plan(
        "import torchstore as ts", None,
        reason="torchstore's own API on a 4-GPU and a 2x2-GPU device mesh (DTensor resharding); it needs "
        "CUDA devices and a process group, and `model` is undefined"),
    ("concepts.md", 7): Plan(_GENERATE_EPISODE, None, reason=_SAME_AS.format(0)),
    ("concepts.md", 8): Plan("async def async_rl_loop(num_rollout_loops: int):", None, reason=_SAME_AS.format(1)),
    ("concepts.md", 9): Plan("async def synchronous_rl(batch_size: int):", None, reason=_SAME_AS.format(2)),
    ("concepts.md", 10): Plan("# Lightweight CPU-only service for parallel execution", None,
                              reason=_SAME_AS.format(3)),
    # -- rl_fundamentals_part1.md -------------------------------------------------------------------------
    ("rl_fundamentals_part1.md", 0): Plan(
        "# CONCEPTUAL EXAMPLE - see apps/grpo/main.py for GRPO Code", None,
        reason="conceptual pseudo-code (the document says so); block 3 is its service version"),
    ("rl_fundamentals_part1.md", 1): Plan(
        "# Conceptual Example", "services",
        reason="input_ids and max_req_tokens are left undefined by the document; the test defines them"),
    ("rl_fundamentals_part1.md", 2): Plan(
        "# While this does work, it creates bottlenecks and resource waste", None,
        reason="the document's counter-example: policy_model, compute_loss and entire_system_stops are "
        "defined nowhere"),
    ("rl_fundamentals_part1.md", 3): Plan(
        "async def real_rl_training_step(services, step):", "services", fixes=(_UNPADDED_REF,),
        reason="create_episode_from_response is defined nowhere in the document; the test defines it"),
    ("rl_fundamentals_part1.md", 4): Plan("responses = await policy.generate.route(prompt=question)", "services"),
    ("rl_fundamentals_part1.md", 5): Plan("from forge.actors.generator import Generator as Policy", "spawn"),
    ("rl_fundamentals_part1.md", 6): Plan("# If a policy replica fails:", "services"),
    # -- rl_fundamentals_tutorial.rst ---------------------------------------------------------------------
    ("rl_fundamentals_tutorial.rst", 0): Plan("import asyncio", "plain"),
    ("rl_fundamentals_tutorial.rst", 1): Plan(
        "async def forge_rl_step(services: Dict[str, Any], step: int) -> Optional[float]:", "services",
        fixes=(
            _UNPADDED_REF,
            ('    return {\n        "response": response,',
             '    return create_episode(response, score, ref_logprobs, step)\n'
             '    return {\n        "response": response,',
             "the document's helper returns a dict, which no replay buffer can train on; it means the Episode"),
        )),
    ("rl_fundamentals_tutorial.rst", 2): Plan("async def setup_forge_rl_system():", "plain"),
    ("rl_fundamentals_tutorial.rst", 3): Plan("def show_infrastructure_challenges():", "plain"),
    ("rl_fundamentals_tutorial.rst", 4): Plan("def demonstrate_production_scaling():", "plain"),
    ("rl_fundamentals_tutorial.rst", 5): Plan(
        "async def complete_rl_training_example(num_steps: int = 5):", "plain",
        reason="runs as the document does: it defines the function and prints how to call it; calling it "
        "would await the mocks' plain dicts (not awaitables), a bug of the tutorial's mocks"),
    # -- torchforge_skill_card.md -------------------------------------------------------------------------
    ("torchforge_skill_card.md", 0): Plan("# grading.py", "services"),
    ("torchforge_skill_card.md", 1): Plan("# src/forge/rl/loss/custom_loss.py", "losses"),
    ("torchforge_skill_card.md", 2): Plan(
        "# apps/custom/main.py", "losses",
        fixes=(("from forge_nb.rl.loss.custom_loss import CustomLoss\n", "",
                "CustomLoss is the user's own module, the block before; it is defined in the namespace"),),
        reason="trainer_output, batch, advantages, completions and ref_logprobs are the application's; the "
        "test defines them"),
    ("torchforge_skill_card.md", 3): Plan("@dataclass", "types"),
    ("torchforge_skill_card.md", 4): Plan("@dataclass", "types"),
    ("torchforge_skill_card.md", 5): Plan("@dataclass", "types"),
    ("torchforge_skill_card.md", 6): Plan("from forge.rl.loss import GRPOLoss", "losses"),
    ("torchforge_skill_card.md", 7): Plan("from forge.rl.loss import DAPOLoss", "losses"),
}


def python_blocks(path: Path) -> list[str]:
    """The Python code blocks of a markdown (```python) or sphinx (.. code-block:: Python) document."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".md":
        return [m.group(1) for m in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M)]
    blocks, lines, i = [], text.split("\n"), 0
    while i < len(lines):
        if lines[i].strip().lower() == ".. code-block:: python":
            body, i = [], i + 1
            while i < len(lines) and (not lines[i].strip() or lines[i].startswith("    ")):
                body.append(lines[i][4:])
                i += 1
            blocks.append("\n".join(body).strip("\n") + "\n")
        else:
            i += 1
    return blocks


def all_blocks() -> dict[tuple[str, int], str]:
    found = {}
    for path in sorted(SEEDS.iterdir()):
        if path.suffix in (".md", ".rst") and path.name != "README.md":
            for i, block in enumerate(python_blocks(path)):
                found[(path.name, i)] = block
    return found


def prepared(key: tuple[str, int], local_model: str, local_dataset: str) -> str:
    """Block ``key`` with the import changes, the local model and dataset, and its plan's fixes."""
    code = all_blocks()[key]
    plan = PLANS[key]
    first = next(line for line in code.splitlines() if line.strip())
    if first.strip() != plan.first_line:
        raise AssertionError(f"{key}: the document changed; its first line is now {first!r}")
    for old, new in IMPORTS:
        code = code.replace(old, new)
    code = code.replace(HUB_MODEL, repr(local_model)).replace(HUB_DATASET, repr(local_dataset))
    for old, new, why in plan.fixes:
        if old not in code:
            raise AssertionError(f"{key}: the fix for {why!r} no longer applies: {old!r} is not in the block")
        code = code.replace(old, new, 1)
    return code
