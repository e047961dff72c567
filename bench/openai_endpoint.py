"""The OpenAI endpoint's cost per request, side by side with the policy service it fronts, and the agent recipe's run.

First, on a run of the agent recipe (``forge_nb.recipes.agents.agent_keys``: the tiny model, one vLLM CPU
generator replica; spawned, served with ``run.serve_openai(tool_parser="simple")``, not training; its context
widened to fit the long request), the same request is timed both ways, alternating (the order flips every
round), after a warm-up of each:

- **endpoint**: ``client.chat.completions.create(...)`` through the real ``openai.AsyncOpenAI`` of
  ``endpoint.client()`` (what agent code calls): HTTP to the endpoint's aiohttp server in this event loop,
  request validation, the chat template, ``policy.generate.route``, tool-call parsing, the answer built as a
  ``ChatCompletion``, and the client parsing it back;
- **route**: ``run.policy.generate.route(ids, **sampling)`` with the prompt ids the endpoint renders for those
  messages and the sampling it sends (``n=1``, ``max_tokens``, ``temperature``, ``logprobs=0``).

Three requests: **long**, ``--tokens`` tokens of five chat messages (the tiny model's template concatenates
them) and a completion of ``--max-tokens`` tokens, greedy so that both sides generate the same tokens (the
random tiny model does not pick end-of-sequence greedily; the bench prints both sides' lengths); **short**, the
agent recipe's first call (the one-letter prompt ``"?"`` with its tool, 2 tokens at temperature 1.0), one at a
time; and the short one ``--in-flight`` at a time (the recipe keeps 4 rollout loops x groups of 8 in flight, the
shape of agent load), where a third side sends it through **own client**: ``openai.AsyncOpenAI(base_url=
endpoint.url, api_key=endpoint.token)``, a client built as a user builds one, with only those two arguments
(httpx's own connection pool, openai's default limits and retries).

What no endpoint can take away is the openai client's own work in this process: ``--in-flight`` requests through
``openai.AsyncOpenAI`` over an httpx transport that answers at once cost the kernel ``openai_sdk_x32_cpu_ms`` of
CPU, printed beside route's time for the same requests. Then the recipe trains ``--steps`` steps (notebook 09's
300) with ``run.episode_fn = agent_episode(key_agent)`` for each of ``--seeds`` seeds, a fresh run each.

    RESULT openai_endpoint_overhead_ratio <endpoint p50 / route p50, the long request> (target <= 1.15)
    RESULT openai_endpoint_overhead_ms <endpoint p50 - route p50, the long request>
    RESULT openai_endpoint_short_ratio, openai_endpoint_short_overhead_ms <the same, the short request>
    RESULT openai_endpoint_x32_ratio_endpoint_client <endpoint p50 / route p50, 32 at a time> (target <= 1.5)
    RESULT openai_endpoint_x32_ratio_own_client <own client p50 / route p50, 32 at a time> (target <= 2.0)
    RESULT openai_endpoint_x32_overhead_ms_per_request <(endpoint - route) / 32> (own client: ...)
    RESULT openai_sdk_x32_cpu_ms <the openai client alone, 32 requests> (route p50 for them: ...)
    RESULT agent_final_reward <mean reward of the last 25 steps; median over seeds> (target >= 0.8)
    RESULT agent_first10_reward <mean reward of the first 10 steps>
    RESULT agent_steps_per_s <steps over the seconds of training>
    RESULT agent_seconds_to_0.8 <from the first step until the last-10 mean reached 0.8, or none>

    .venv/bin/python bench/openai_endpoint.py [--rounds 300] [--steps 300] [--seeds 1] [--skip-overhead|--skip-agent]
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

import forge_nb  # noqa: E402
from forge_nb.agents import agent_episode  # noqa: E402
from forge_nb.agents.conversation import hf_message  # noqa: E402
from forge_nb.envs.chat import render_ids  # noqa: E402
from forge_nb.recipes.agents import KEY_TOOLS, agent_keys, key_agent  # noqa: E402

TARGET = 0.8


def long_messages(tokens: int) -> list[dict[str, Any]]:
    """A conversation of ``tokens`` characters (one token each in the tiny tokenizer): a system message, a user
    turn, the assistant's answer with a tool call, the tool's answer and a new user turn."""
    letters = "abcdefgh"
    text = (letters * (tokens // len(letters) + 1))
    sizes = [tokens // 4, tokens // 4, tokens // 8, tokens // 8]
    sizes.append(tokens - sum(sizes))
    parts, at = [], 0
    for size in sizes:
        parts.append(text[at:at + size])
        at += size
    return [{"role": "system", "content": parts[0]}, {"role": "user", "content": parts[1]},
            {"role": "assistant", "content": parts[2], "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "k", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": parts[3]},
            {"role": "user", "content": parts[4]}]


async def time_rounds(run: Any, clients: dict[str, Any], messages: list[dict[str, Any]], sampling: dict[str, Any], *,
                      rounds: int, warmup: int, in_flight: int = 1) -> dict[str, Any]:
    """p50 seconds of ``in_flight`` copies of the request at once through each of ``clients`` (openai clients of
    the endpoint) and through ``policy.generate.route``, one after the other, the order reversed every round."""
    endpoint = run.openai
    ids = render_ids(endpoint.tokenizer, [hf_message(m) for m in messages], tools=KEY_TOOLS)
    route_sampling = {"n": 1, "max_tokens": sampling["max_tokens"], "logprobs": 0,
                      "temperature": sampling["temperature"]}
    lengths: dict[str, list[int]] = {name: [] for name in [*clients, "route"]}

    async def one(name: str) -> None:
        if name == "route":
            (choice,) = await run.policy.generate.route(ids, **route_sampling)
            lengths[name].append(len(choice.token_ids))
            return
        client = clients[name]
        reply = await client.chat.completions.create(model=client.model, messages=messages, tools=KEY_TOOLS,
                                                     **sampling)
        assert reply.usage.prompt_tokens == len(ids), (reply.usage.prompt_tokens, len(ids))
        lengths[name].append(reply.usage.completion_tokens)

    async def side(name: str) -> None:
        await asyncio.gather(*(one(name) for _ in range(in_flight)))

    names = list(lengths)
    for _ in range(warmup):
        for name in names:
            await side(name)
    for kept in lengths.values():
        kept.clear()
    times: dict[str, list[float]] = {name: [] for name in names}
    endpoint._latency.clear()  # its handler's times (status()["p50_s"]): the timed requests' only
    for i in range(rounds):
        for name in (names if i % 2 == 0 else names[::-1]):
            t = time.perf_counter()
            await side(name)
            times[name].append(time.perf_counter() - t)
    p50 = {k: statistics.median(v) for k, v in times.items()}
    return {"ids": len(ids), "p50": p50, "server": endpoint.status()["p50_s"], "route_sampling": route_sampling,
            "tokens": {k: statistics.mean(v) for k, v in lengths.items()},
            "p90": {k: statistics.quantiles(v, n=10)[-1] for k, v in times.items()}}


def own_client(endpoint: Any) -> Any:
    """An openai client built as a user builds one: the endpoint's URL and token, nothing else."""
    import openai

    client = openai.AsyncOpenAI(base_url=endpoint.url, api_key=endpoint.token)
    client.model = endpoint.model
    return client


async def sdk_cpu(messages: list[dict[str, Any]], sampling: dict[str, Any], in_flight: int, rounds: int) -> float:
    """Median CPU seconds of ``in_flight`` ``chat.completions.create`` calls through ``openai.AsyncOpenAI`` over an
    httpx transport that answers each at once with a small chat completion: the client's own work."""
    import json

    import httpx
    import openai

    body = json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": [
        {"index": 0, "finish_reason": "length", "message": {"role": "assistant", "content": "ab"}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}).encode()

    class AtOnce(httpx.AsyncBaseTransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            await request.aread()
            return httpx.Response(200, headers={"content-type": "application/json"}, content=body)

    client = openai.AsyncOpenAI(base_url="http://sdk.invalid/v1", api_key="k", max_retries=0,
                                http_client=httpx.AsyncClient(transport=AtOnce()))
    cpu = []
    for i in range(rounds + 10):
        started = time.process_time()
        await asyncio.gather(*(client.chat.completions.create(model="m", messages=messages, tools=KEY_TOOLS,
                                                              **sampling) for _ in range(in_flight)))
        if i >= 10:
            cpu.append(time.process_time() - started)
    await client.close()
    return statistics.median(cpu)


async def overhead(args: argparse.Namespace, workdir: str) -> None:
    # the recipe's context (max_req_tokens + max_res_tokens + 8 = 24 tokens) made room for the long request
    cfg = agent_keys(name="openai-bench", run_dir=f"{workdir}/overhead", max_req_tokens=max(args.tokens, 4),
                     max_res_tokens=max(args.max_tokens, 12))
    run = await forge_nb.spawn(cfg, progress=False)
    short = [{"role": "user", "content": "?"}]
    many = f"short x{args.in_flight}"
    cases = {  # name: messages, sampling, in flight, rounds
        "long": (long_messages(args.tokens), {"max_tokens": args.max_tokens, "temperature": 0.0}, 1, args.rounds),
        "short": (short, {"max_tokens": 2, "temperature": 1.0}, 1, args.rounds),
        many: (short, {"max_tokens": 2, "temperature": 1.0}, args.in_flight, max(args.rounds // 5, 10)),
    }
    found = {}
    try:
        endpoint = await run.serve_openai(tool_parser="simple")
        client, own = endpoint.client(), own_client(endpoint)
        for name, (messages, sampling, in_flight, rounds) in cases.items():
            clients = {"endpoint": client, "own client": own} if name == many else {"endpoint": client}
            found[name] = r = await time_rounds(run, clients, messages, sampling, rounds=rounds, warmup=args.warmup,
                                                in_flight=in_flight)
            r["ratio"] = r["p50"]["endpoint"] / r["p50"]["route"]
            print(f"{name}: prompt {r['ids']} tokens, completion {r['tokens']['endpoint']:.1f} tokens (endpoint) / "
                  f"{r['tokens']['route']:.1f} (route), {in_flight} in flight, {rounds} rounds after {args.warmup} "
                  "warm-up each")
            print(f"  endpoint: client.chat.completions.create(model={client.model!r}, messages=<{len(messages)} "
                  f"messages>, tools=KEY_TOOLS, {', '.join(f'{k}={v}' for k, v in sampling.items())}), "
                  "client = endpoint.client()")
            print(f"  route:    run.policy.generate.route(<the {r['ids']} ids the endpoint renders>, "
                  f"{', '.join(f'{k}={v}' for k, v in r['route_sampling'].items())})")
            if "own client" in clients:
                print(f"  own client: openai.AsyncOpenAI(base_url={endpoint.url!r}, api_key=<the token>), openai's "
                      "defaults otherwise (httpx's own pool)")
            print("  p50 " + ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in r["p50"].items())
                  + f" (p90 {', '.join(f'{v * 1e3:.2f}' for v in r['p90'].values())}); one request in the "
                  f"endpoint's handler {r['server'] * 1e3:.2f} ms; ratio {r['ratio']:.3f}", flush=True)
            if len(set(r["tokens"].values())) > 1 and sampling["temperature"] == 0.0:
                print("  warning: the sides generated different lengths", flush=True)
        await own.close()
        sdk = await sdk_cpu(*cases[many][:3], rounds=cases[many][3])
    finally:
        await run.shutdown()
    long, one, x = found["long"], found["short"], found[many]
    print(f"RESULT openai_endpoint_overhead_ratio {long['ratio']:.3f} (target <= 1.15)")
    print(f"RESULT openai_endpoint_overhead_ms {(long['p50']['endpoint'] - long['p50']['route']) * 1e3:.2f}")
    print(f"RESULT openai_endpoint_short_ratio {one['ratio']:.3f}")
    print(f"RESULT openai_endpoint_short_overhead_ms {(one['p50']['endpoint'] - one['p50']['route']) * 1e3:.2f}")
    n = args.in_flight
    print(f"RESULT openai_endpoint_x{n}_ratio_endpoint_client {x['ratio']:.3f} (target <= 1.5)")
    print(f"RESULT openai_endpoint_x{n}_ratio_own_client {x['p50']['own client'] / x['p50']['route']:.3f} "
          "(target <= 2.0)")
    per_request = {k: (x["p50"][k] - x["p50"]["route"]) / n for k in ("endpoint", "own client")}
    print(f"RESULT openai_endpoint_x{n}_overhead_ms_per_request {per_request['endpoint'] * 1e3:.2f} "
          f"(own client: {per_request['own client'] * 1e3:.2f})")
    print(f"RESULT openai_sdk_x{n}_cpu_ms {sdk * 1e3:.2f} (route p50 for the same {n} requests: "
          f"{x['p50']['route'] * 1e3:.2f} ms)")


def reach(rewards: list[float], times: list[float], window: int = 10) -> float | None:
    for i in range(window - 1, len(rewards)):
        if statistics.mean(rewards[i - window + 1:i + 1]) >= TARGET:
            return times[i]
    return None


async def train(steps: int, seed: int, workdir: str) -> dict[str, Any]:
    run = await forge_nb.spawn(agent_keys(seed=seed, run_dir=f"{workdir}/agent-{seed}"), progress=False)
    try:
        await run.serve_openai(tool_parser="simple")
        run.episode_fn = agent_episode(key_agent)
        started, wall, cpu = time.monotonic(), time.time(), time.process_time()
        rewards: list[float] = []
        times: list[float] = []
        while len(rewards) < steps:
            rows = await run.step(min(25, steps - len(rewards)))
            now = time.monotonic() - started
            rewards += [r["reward/mean"] for r in rows]
            times += [r["time"] for r in rows]
            print(f"  seed {seed}  step {len(rewards):4d}  reward(last 25) {statistics.mean(rewards[-25:]):.3f}  "
                  f"{now:6.1f} s", flush=True)
        elapsed = time.monotonic() - started
        cpu = time.process_time() - cpu
        status = run.openai.status()
        ledger = run.ledger()
    finally:
        await run.shutdown()
    at = reach(rewards, times)
    return {"final": statistics.mean(rewards[-25:]), "first10": statistics.mean(rewards[:10]),
            "rate": len(rewards) / elapsed, "to_target": None if at is None else at - wall,
            "requests": status["requests"], "errors": status["errors"], "request_p50_s": status["p50_s"],
            "balanced": ledger["balanced"], "kernel_cpu": cpu / elapsed}


async def agent(args: argparse.Namespace, workdir: str) -> None:
    cfg = agent_keys()
    print(f"agent recipe: {args.steps} steps, group_size {cfg.group_size}, batch_size {cfg.batch_size}, "
          f"lr {cfg.trainer.optimizer.lr}, KL beta {cfg.trainer.loss_config.get('beta', 0.0)} (reference model: "
          f"{cfg.use_reference}), {cfg.loop.rollout_loops} rollout loops, {cfg.generator.num_replicas} generator "
          f"replica, sampling {cfg.generator.sampling_params}", flush=True)
    results = []
    for seed in range(args.seeds):
        r = await train(args.steps, seed, workdir)
        results.append(r)
        to = "none" if r["to_target"] is None else f"{r['to_target']:.1f} s"
        print(f"seed {seed}: last-25 {r['final']:.3f}, first-10 {r['first10']:.3f}, {r['rate']:.2f} steps/s, "
              f"0.8 after {to}; endpoint {r['requests']} requests ({r['errors']} errors, p50 "
              f"{r['request_p50_s'] * 1e3:.1f} ms in its handler); this process (the kernel) used "
              f"{r['kernel_cpu']:.2f} s of CPU a second; ledger balanced {r['balanced']}", flush=True)
    reached = [r["to_target"] for r in results if r["to_target"] is not None]
    print(f"RESULT agent_final_reward {statistics.median(r['final'] for r in results):.3f} (target >= 0.8)")
    print(f"RESULT agent_first10_reward {statistics.median(r['first10'] for r in results):.3f}")
    print(f"RESULT agent_steps_per_s {statistics.median(r['rate'] for r in results):.2f}")
    print(f"RESULT agent_seconds_to_0.8 "
          f"{f'{statistics.median(reached):.1f}' if len(reached) == len(results) else 'none'} "
          f"({len(reached)} of {len(results)} seeds reached it)")


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="openai-bench-") as workdir:
        if not args.skip_overhead:
            await overhead(args, workdir)
        if not args.skip_agent:
            await agent(args, workdir)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300,
                        help="rounds per request (each side once; a fifth as many with --in-flight requests)")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=48, help="prompt tokens of the long request")
    parser.add_argument("--max-tokens", type=int, default=32, help="completion tokens of the long request")
    parser.add_argument("--in-flight", type=int, default=32,
                        help="the short request this many at once (the recipe: 4 rollout loops x groups of 8)")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--skip-overhead", action="store_true")
    parser.add_argument("--skip-agent", action="store_true")
    asyncio.run(main(parser.parse_args()))
