"""One task two ways, side by side: a verifiers taskset through ``verifiers_episode`` against the same task written
as a plain agent for ``agent_episode``, on one run.

The task: the user says a letter, the answer should begin with it (eight tasks, one per key letter of the agent
recipe's tiny model). One chat call of at most 2 tokens per trajectory, groups of 8, batches of 32 (the agent
recipe, ``forge_nb.recipes.agents.agent_keys``, with its KL term and reference model).

- **agent_episode**: ``async def agent(client, sample)``: ``client.chat.completions.create(...)`` through the
  ``openai.AsyncOpenAI`` bound to the trajectory, the reward computed from its answer.
- **verifiers**: ``verifiers_episode(local_env(Letters))``: verifiers 0.4's ``Env.run_episode`` per trajectory,
  its interception server in this process, forge_nb's in-process chat harness, a ``@vf.reward`` function scoring
  the trace.

The two episode functions take turns on the same run (``--rounds`` rounds of ``--steps`` steps each, the order
flipped every round, after a warm-up of each), so both see the same machine and the same weights' age. Steps per
second of each are the steps over the seconds ``run.step`` took.

    RESULT verifiers_vs_agent_episode_steps_ratio <verifiers steps/s / agent_episode steps/s> (target >= 0.7)
    RESULT verifiers_steps_per_s, agent_episode_steps_per_s

    .venv/bin/python bench/verifiers_speed.py [--steps 20] [--rounds 6]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import verifiers.v1 as vf  # noqa: E402

import forge_nb  # noqa: E402
from forge_nb.agents import agent_episode  # noqa: E402
from forge_nb.agents.verifiers_env import local_env, verifiers_episode  # noqa: E402
from forge_nb.recipes.agents import KEY_LETTERS, agent_keys  # noqa: E402

MAX_TOKENS = 2


class Row(vf.TaskData):
    pass


class LetterTask(vf.Task[Row]):
    @vf.reward
    async def begins_with_it(self, trace: vf.Trace) -> float:
        return float(trace.last_reply[:1] == self.data.prompt_text)


class Letters(vf.Taskset[LetterTask, vf.TasksetConfig]):
    def load(self) -> list[LetterTask]:
        return [LetterTask(Row(prompt=letter), self.config.task) for letter in KEY_LETTERS]


async def letter_agent(client: Any, sample: dict[str, Any]) -> float:
    letter = KEY_LETTERS[sample["index"]]
    reply = await client.chat.completions.create(model=client.model, messages=[{"role": "user", "content": letter}],
                                                 max_tokens=MAX_TOKENS)
    return float((reply.choices[0].message.content or "")[:1] == letter)


def plain(episode_fn: Any) -> Any:
    """The agent side plays the eight letters in turn, as the verifiers side plays its eight tasks."""
    turn = iter(range(10**9))

    async def episode(run: Any, sample: dict[str, Any]) -> Any:
        return await episode_fn(run, {**sample, "index": next(turn) % len(KEY_LETTERS)})

    return episode


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="verifiers-bench-") as workdir:
        cfg = agent_keys(name="vf-bench", run_dir=f"{workdir}/run")
        run = await forge_nb.spawn(cfg, progress=False)
        try:
            await run.serve_openai(tool_parser="simple")
            sides = {"agent_episode": plain(agent_episode(letter_agent)),
                     "verifiers": verifiers_episode(local_env(Letters), sampling={"max_tokens": MAX_TOKENS})}
            print(f"the agent recipe's run: group_size {cfg.group_size}, batch_size {cfg.batch_size}, "
                  f"{cfg.loop.rollout_loops} rollout loops, reference model {cfg.use_reference}; one chat call of at "
                  f"most {MAX_TOKENS} tokens a trajectory; {args.rounds} rounds of {args.steps} steps a side",
                  flush=True)
            seconds: dict[str, list[float]] = {name: [] for name in sides}
            for fn in sides.values():  # warm-up: each side's first steps (a first group's imports, clients)
                run.episode_fn = fn
                await run.step(args.warmup)
            for i in range(args.rounds):
                for name in (list(sides) if i % 2 == 0 else list(sides)[::-1]):
                    run.episode_fn = sides[name]
                    started = time.perf_counter()
                    rows = await run.step(args.steps)
                    seconds[name].append(time.perf_counter() - started)
                    print(f"  round {i} {name:13s} {args.steps / seconds[name][-1]:6.2f} steps/s, reward "
                          f"{statistics.mean(r['reward/mean'] for r in rows):.2f}", flush=True)
            ledger = run.ledger()
        finally:
            await run.shutdown()
    rate = {name: args.steps / statistics.median(values) for name, values in seconds.items()}
    print(f"ledger balanced {ledger['balanced']}, quarantined {ledger['quarantined']}")
    print(f"RESULT verifiers_steps_per_s {rate['verifiers']:.2f}")
    print(f"RESULT agent_episode_steps_per_s {rate['agent_episode']:.2f}")
    print(f"RESULT verifiers_vs_agent_episode_steps_ratio {rate['verifiers'] / rate['agent_episode']:.3f} "
          "(target >= 0.7)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="steps per round and side")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=3)
    asyncio.run(main(parser.parse_args()))
    forge_nb.end_process(0)
