"""Multi-turn training on 2 CPU cores, and what the environment service costs per turn, in one run.

First, side by side: ``--calls`` EchoEnv steps through an ``EnvPool`` service (one replica, the calls of a
trajectory in a sticky session, as ``multi_turn_episode`` makes them) against the same environment object
called in this process, in alternating blocks. Then the example notebook's run (``multi_turn_echo``: the tiny
model, one vLLM CPU generator replica, EchoEnv with 3 turns served by 2 replicas) trains ``--steps`` steps.

    RESULT env_step_overhead_ratio <service p50 / in-process p50 of one step>
    RESULT env_step_ms_p50 <one step through the service, milliseconds>
    RESULT multiturn_first10_reward <mean reward of the first 10 steps> (target <= 0.2)
    RESULT multiturn_final_reward <mean reward of the last 25 steps> (target 0.8)
    RESULT multiturn_seconds_to_0.8 <seconds from the first step until the last-10 mean reached 0.8, or none>
    RESULT multiturn_env_share <the environment calls' share of the rollouts' wall time>

    .venv/bin/python bench/multi_turn.py [--steps 300] [--calls 2000] [--rounds 4]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import forge_nb  # noqa: E402
from forge_nb.envs import EchoEnv, EnvPool, multi_turn_episode  # noqa: E402
from forge_nb.recipes import ECHO, multi_turn_echo  # noqa: E402


async def env_round_trips(calls: int, rounds: int) -> tuple[float, float]:
    """p50 seconds of one step: through the service, in this process (alternating blocks)."""
    from forge_nb.system.runtime import lifecycle

    lifecycle.ensure_started()
    turns = calls + 1  # one episode long enough for every call
    env = await EnvPool.options(num_replicas=1).as_service(EchoEnv, turns=turns, chars=2)
    local = EchoEnv(turns=turns, chars=2)
    local.reset(0)
    served: list[float] = []
    direct: list[float] = []
    try:
        async with env.session():
            await env.reset.route("bench", 0)
            for _ in range(rounds):
                for _ in range(calls // rounds):
                    t = time.perf_counter()
                    await env.step.route("bench", "aa")
                    served.append(time.perf_counter() - t)
                for _ in range(calls // rounds):
                    t = time.perf_counter()
                    local.step("aa")
                    direct.append(time.perf_counter() - t)
            await env.close.route("bench")
    finally:
        await env.shutdown()
    return statistics.median(served), statistics.median(direct)


async def train(steps: int) -> None:
    env = await EnvPool.options(num_replicas=2).as_service(EchoEnv, **ECHO)
    run = await forge_nb.spawn(multi_turn_echo(), progress=False)
    timed = {"env": 0.0}
    step = env.step.route

    async def timed_step(*args, **kwargs):  # what the episodes spent waiting for the environment
        t = time.perf_counter()
        try:
            return await step(*args, **kwargs)
        finally:
            timed["env"] += time.perf_counter() - t

    env.step.route = timed_step
    run.episode_fn = multi_turn_episode(env, max_turns=ECHO["turns"], turn_tokens=ECHO["chars"])
    rewards: list[float] = []
    reached = None
    try:
        started = time.monotonic()
        for _ in range(0, steps, 10):
            rows = await run.step(10)
            rewards += [r["reward/mean"] for r in rows]
            last10 = statistics.mean(rewards[-10:])
            if reached is None and last10 >= 0.8:
                reached = time.monotonic() - started
            print(f"step {len(rewards):4d}  last-10 reward {last10:.3f}  turns {rows[-1]['turns/mean']:.2f}  "
                  f"{time.monotonic() - started:6.1f} s", flush=True)
        elapsed = time.monotonic() - started
        print(f"ledger balanced: {run.ledger()['balanced']}")
    finally:
        await run.shutdown()
        await env.shutdown()
    loops = run.config.loop.rollout_loops
    print(f"RESULT multiturn_first10_reward {statistics.mean(rewards[:10]):.3f} (target <= 0.2)")
    print(f"RESULT multiturn_final_reward {statistics.mean(rewards[-25:]):.3f} (target 0.8)")
    print(f"RESULT multiturn_seconds_to_0.8 {'none' if reached is None else f'{reached:.1f}'}")
    # group_size trajectories run concurrently in each of the rollout loops: the summed wait over their wall time
    share = timed["env"] / (elapsed * loops * run.config.group_size)
    print(f"RESULT multiturn_env_share {share:.3f}")


async def main(steps: int, calls: int, rounds: int) -> None:
    served, direct = await env_round_trips(calls, rounds)
    print(f"one EchoEnv step: {served * 1e3:.3f} ms through the service, {direct * 1e6:.2f} us in this process")
    print(f"RESULT env_step_overhead_ratio {served / direct:.0f}")
    print(f"RESULT env_step_ms_p50 {served * 1e3:.3f}")
    await train(steps)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    asyncio.run(main(args.steps, args.calls, args.rounds))
