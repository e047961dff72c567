"""The agent recipe: the CPU tiny model learns to ask a tool for a key and answer with it, through an OpenAI client.

``example_notebooks/09_agents.py`` and ``bench/openai_endpoint.py`` run it. The user asks "?" and the answer is a
key, one letter drawn at random per sample (:class:`KeyTask`), that only the tool knows: the policy must call it
(``@k``, the simple tool syntax a character-level model can write) and then answer with what it said. The agent
that plays it is plain Python against ``openai.AsyncOpenAI`` (:func:`key_agent`; the notebook shows the same
code). Its reward: 0.7 for the right key, read from ``k``; 0.1 for calling a tool and 0.1 more for calling
``k``; 0.1 for an answer that could be a key (one of the key letters), given after asking. The last three are
format rewards, as GRPO recipes give for ``<think>`` tags: without them a policy that calls ``@e`` and one that
never calls look the same, and after the call the policy drifted to answering ``k`` (the token it had just
learned to write) for every key, where no sample of a group differs and nothing is learned.

A right answer counts only after calling ``k``: a guess is right one time in eight, and while it scored 0.7, a
policy that called another letter's tool earned ~0.29 against ~0.39 for calling ``k`` before it had learned to
copy the key, a difference the guesses' noise drowned, and half the runs settled on the wrong tool (4 seeds ended
at 0.30-0.82 with guesses scored; counted only after ``k``, 11 script runs at 0.80-0.995).

**A KL term toward the untrained policy** (``use_reference=True``, ``beta=0.02``): GRPO learns nothing from a group
whose samples all earn the same, and two such states caught runs of notebook 09 without it: a policy that calls
another letter's tool in every sample earns 0.2 each time (the "lock"), and a policy can collapse onto one
string with no tool call (``@@`` in every sample, entropy 0.005). The KL term pulls a policy that has stopped
sampling anything else back toward the reference's spread (over the last 25 steps the entropy stays ~0.08-0.14,
``kl/k3`` ~2.5), so no state like ``@@`` is left without a gradient. Without the term 2 of 14 notebook runs lost
their tool calls; with it 0 of 10 did (9 ended at 0.74-0.97), and after step 150 a step's reward fell by more than
0.4 six times in 10 runs against 38 times in 8. The lock itself the term does not cure (the untrained reference
does not raise ``@k``'s probability); paying nothing for another tool's call removed the lock but not the falls,
and was not adopted. The reference model costs a process and a forward a group: 2.1-3.2 steps a second against
2.4-2.7 without it. Other settings tried (``beta`` 0.01 and 0.04, an entropy bonus instead, Adam's beta2 at 0.95,
groups of 4 or 16, lr 4e-4 or 1e-3, fewer key letters, longer keys) did no better; the runs are in
``bench/HISTORY.md``.

Groups of 8, batches of 32, lr 7e-4 on two CPU cores, 300 steps: ``bench/openai_endpoint.py`` ends at a last-25
mean reward of 0.86-0.99 (0.8 after 32-52 s); a run that ends low has one to three keys answered with a wrong
letter by every sample, the entropy collapse the quickstart's docstring describes.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from forge_nb.config import GeneratorConfig, LoopConfig, OptimizerConfig, RunConfig, TrainerConfig
from forge_nb.models import TinyModelConfig
from forge_nb.rl.tasks import PatternReward

__all__ = ["KEY_LETTERS", "KEY_TOOLS", "KeyTask", "agent_keys", "key_agent"]

#: The letters keys are made of (:class:`KeyTask`'s alphabet).
KEY_LETTERS = "abcdefgh"
#: The tool the agent offers: ``k`` answers the episode's key.
KEY_TOOLS = [{"type": "function", "function": {
    "name": "k", "description": "Returns the key you must answer with.",
    "parameters": {"type": "object", "properties": {}}}}]


@dataclass(kw_only=True)
class KeyTask:
    """The question, and a random key of ``key_chars`` letters that only the tool knows."""

    alphabet: str = KEY_LETTERS
    key_chars: int = 1
    question: str = "?"
    seed: int = 0
    _rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.key_chars < 1 or not self.alphabet:
            raise ValueError(f"KeyTask(alphabet={self.alphabet!r}, key_chars={self.key_chars}): needs letters and "
                             "a key of at least one")
        self._rng = random.Random(self.seed)

    @property
    def reward_fns(self) -> list[Any]:
        return [PatternReward()]  # what the agent scores with; agent_episode takes the agent's own reward

    def _example(self, rng: random.Random) -> dict[str, str]:
        return {"request": self.question, "target": "".join(rng.choices(self.alphabet, k=self.key_chars))}

    def sample(self) -> dict[str, str]:
        return self._example(self._rng)

    def eval_prompts(self, n: int) -> list[dict[str, str]]:
        rng = random.Random(f"eval-{self.seed}")
        return [self._example(rng) for _ in range(n)]


async def key_agent(client: Any, sample: dict[str, str]) -> float:
    """Ask the policy; if it calls the tool, hand it the key and ask again; score the final answer (the code
    notebook 09 shows)."""
    key = sample["target"]  # what the tool knows
    messages: list[Any] = [{"role": "user", "content": sample["request"]}]
    reply = await client.chat.completions.create(model=client.model, messages=messages, tools=KEY_TOOLS, max_tokens=2)
    message = reply.choices[0].message
    asked = [call.function.name for call in message.tool_calls or []]
    if asked:  # run the tool, hand its answer back, ask again
        messages.append(message)
        messages += [{"role": "tool", "tool_call_id": call.id, "content": key if call.function.name == "k" else "?"}
                     for call in message.tool_calls]
        reply = await client.chat.completions.create(model=client.model, messages=messages, max_tokens=len(key))
        message = reply.choices[0].message
    answer = message.content or ""
    shaped = bool(asked) and len(answer) == len(key) and set(answer) <= set(KEY_LETTERS)  # a key-like answer
    read = "k" in asked  # a right answer without the key's tool is a guess
    return 0.7 * (read and answer == key) + 0.1 * shaped + 0.1 * bool(asked) + 0.1 * read


def agent_keys(**overrides: Any) -> RunConfig:
    """The run of notebook 09: the quickstart's tiny model (its alphabet plus ``@`` and ``k`` for the tool call),
    groups of 8, batches of 32, a conversation of at most 12 tokens after the one-letter prompt, and a KL term
    (beta 0.02) toward the untrained policy, which a ReferenceModel service computes."""
    fields: dict[str, Any] = dict(
        name="agent",
        model="tiny",
        tiny=TinyModelConfig(alphabet="abcdefgh@k?"),
        task="forge_nb.recipes.agents:KeyTask",
        group_size=8,
        batch_size=32,
        max_req_tokens=4,
        max_res_tokens=12,
        max_policy_age=1,
        generator=GeneratorConfig(num_replicas=1, engine_args={"dtype": "float32"},
                                  sampling_params={"temperature": 1.0, "top_p": 1.0}),
        use_reference=True,  # for the KL term (see the module docstring)
        trainer=TrainerConfig(optimizer=OptimizerConfig(lr=7e-4, weight_decay=0.0, beta2=0.999), loss="grpo",
                              loss_config={"beta": 0.02}),
        loop=LoopConfig(mode="async", rollout_loops=4),
    )
    fields.update(overrides)
    return RunConfig(**fields)
