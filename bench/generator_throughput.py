"""Generator throughput: tokens/s through the actor's ``generate`` against raw vLLM, same run.

The raw side is vLLM's ``AsyncLLM`` in this process (its EngineCore and worker in processes of their own).
On GPUs the Generator runs the same; on CPU it runs vLLM's engine inside its own process
(``forge_nb.actors.engine.inproc``), so there the ratio also compares those two ways of running vLLM.
Both sides build their engine with the Generator's own helpers (``make_engine_args``,
``make_sampling_params``), on the locally built tiny Qwen3, and serve the same wave of concurrent
requests: ``PROMPTS`` prompts, ``n`` samples each, exactly ``MAX_TOKENS`` tokens per sample
(``ignore_eos``, so both sides do the same work). Rounds alternate between the two engines, which are
both up for the whole run, so load from anything else on the machine falls on both alike. The result
is the median over rounds of (actor tokens/s / raw tokens/s) within a round. The actor's side pays
what a user pays: one monarch message per prompt, and the Completions pickled back to the caller.

Run: ``.venv/bin/python bench/generator_throughput.py``. The last line reads
``RESULT generator_throughput_ratio <median per-round actor/raw ratio> (target 0.9)``.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

PROMPTS = 32
N = 8
MAX_TOKENS = 24
WARMUP_ROUNDS = 1
ROUNDS = 6  # short, alternating rounds: a load spike from elsewhere hits one round, not one side
SAMPLING = {"n": N, "max_tokens": MAX_TOKENS, "temperature": 1.0, "ignore_eos": True}


def prompts() -> list[str]:
    from forge_nb.models import TinyModelConfig

    alphabet = TinyModelConfig().alphabet
    return ["".join(alphabet[(i * 7 + j) % len(alphabet)] for j in range(4 + i % 12)) for i in range(PROMPTS)]


class RawVLLM:
    """vLLM's AsyncLLM in this process, driven the way the Generator drives it."""

    def __init__(self, model: str) -> None:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        import torch
        from vllm.v1.engine.async_llm import AsyncLLM

        from forge_nb.actors.generator import make_engine_args, make_sampling_params

        self.engine: Any = AsyncLLM.from_engine_args(
            make_engine_args({}, model, cuda=torch.cuda.is_available()))
        self.params = make_sampling_params(SAMPLING)
        self.ids = itertools.count()

    async def one(self, prompt: str) -> int:
        from vllm.renderers.inputs.preprocess import parse_model_prompt

        (engine_input,) = await self.engine.renderer.render_cmpl_async(
            [parse_model_prompt(self.engine.model_config, prompt)])
        final = None
        async for output in self.engine.generate(engine_input, self.params, f"raw-{next(self.ids)}"):
            final = output
        assert final is not None
        return sum(len(o.token_ids) for o in final.outputs)

    def close(self) -> None:
        self.engine.shutdown()
        # Free it now: AsyncLLM.__del__ shuts down again, which fails if it runs at interpreter exit.
        self.engine = None

    async def wave(self, batch: list[str]) -> int:
        return sum(await asyncio.gather(*(self.one(p) for p in batch)))


async def actor_wave(actor: Any, batch: list[str]) -> int:
    results = await asyncio.gather(*(actor.generate.call_one(p) for p in batch))
    return sum(len(c.token_ids) for completions in results for c in completions)


async def timed(wave: Any) -> tuple[float, int]:
    start = time.perf_counter()
    tokens = await wave
    return time.perf_counter() - start, tokens


async def main() -> None:
    from forge_nb.actors.generator import Generator
    from forge_nb.models import build_tiny_model
    from forge_nb.system.runtime import lifecycle, spawning

    lifecycle.ensure_started()
    model = str(build_tiny_model(Path(tempfile.gettempdir()) / "forge_nb_bench_tiny"))
    batch = prompts()
    start = time.perf_counter()
    mesh = await spawning.spawn_mesh("bench-gen", 1)
    try:
        actor = mesh.spawn("gen", Generator, model=model, sampling_params=SAMPLING)
        actor_up = asyncio.ensure_future(actor.setup.call_one())
        await asyncio.sleep(0.5)  # let the setup message go out: building the raw engine blocks this loop
        raw = RawVLLM(model)
        await actor_up
        print(f"both engines up in {time.perf_counter() - start:.1f}s", flush=True)
        rates: dict[str, list[float]] = {"actor": [], "raw": []}
        for round_ in range(WARMUP_ROUNDS + ROUNDS):
            order = ["raw", "actor"] if round_ % 2 == 0 else ["actor", "raw"]  # no side always goes first
            for side in order:
                wave = raw.wave(batch) if side == "raw" else actor_wave(actor, batch)
                seconds, tokens = await timed(wave)
                assert tokens == PROMPTS * N * MAX_TOKENS, tokens
                warm = round_ >= WARMUP_ROUNDS
                if warm:
                    rates[side].append(tokens / seconds)
                print(f"round {round_} {side:5s}: {tokens} tokens in {seconds:.2f}s = "
                      f"{tokens / seconds:,.0f} tokens/s{'' if warm else ' (warm-up)'}", flush=True)
        raw.close()
    finally:
        await mesh.stop()
    actor_rate, raw_rate = statistics.median(rates["actor"]), statistics.median(rates["raw"])
    # Each round's two waves ran back to back, under the same outside load: their ratio is the steadier
    # figure, and the result is its median over rounds.
    paired = statistics.median(a / r for a, r in zip(rates["actor"], rates["raw"], strict=True))
    print(f"workload: {PROMPTS} concurrent prompts x n={N} x {MAX_TOKENS} tokens, {ROUNDS} rounds each")
    print(f"raw vLLM (AsyncLLM in this process): {raw_rate:,.0f} tokens/s (median)")
    print(f"Generator actor (monarch generate):  {actor_rate:,.0f} tokens/s (median)")
    print(f"ratio of medians {actor_rate / raw_rate:.3f}; median of per-round ratios {paired:.3f}")
    print(f"RESULT generator_throughput_ratio {paired:.3f} (target 0.9)")


if __name__ == "__main__":
    asyncio.run(main())
