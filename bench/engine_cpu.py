"""The Generator's vLLM engine on CPU: its thread's CPU per quickstart batch, sampling variants side by side.

The engine is built as the Generator builds it for the quickstart (``forge_nb.actors.engine.inproc``: in this
process, the tiny model's plain weights, ``max_model_len`` 16 and the KV cache the Generator gives it), then
fed the quickstart's batch: 4 prompts x 4 samples x 4 tokens in one hand-over, followed by the prefix-cache
reset a weight load makes. The variants (``--variant NAME='{sampling params}'``, the first one the baseline)
take turns batch by batch, and each batch is charged the CPU the engine's thread spent on it, read from that
thread's own clock (``time.pthread_getcpuclockid``): the machine's swings, which make ``bench/vs_trl.py``'s
runs differ by 10% minutes apart, fall on every variant alike, and an idle engine costs nothing.

Why it exists (issue 34, session 48): a first try of vLLM's flat logprobs, measured on an engine built with
vLLM's defaults (a 17 GiB KV cache whose every reset walks all its blocks, onednn weights) and alternated in
rounds under /proc's 10 ms clock, showed a 5% gain that the Generator's own engine does not have.

    .venv/bin/python bench/engine_cpu.py --batches 400 --variant dicts='{"flat_logprobs": false}' --variant flat='{}'

prints, per variant, the median CPU a batch and its ratio to the first variant::

    RESULT engine_cpu_ms_per_batch <name> <median ms>
    RESULT engine_cpu_vs_first <name> <ratio>
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

QUICKSTART_SAMPLING = {"temperature": 1.0, "top_p": 1.0, "max_tokens": 4}


def variant(text: str) -> tuple[str, dict]:
    name, _, values = text.partition("=")
    params = json.loads(values or "{}")
    if not name or not isinstance(params, dict):
        raise argparse.ArgumentTypeError(f"{text!r}: give NAME='{{sampling params as JSON}}'")
    return name, params


async def measure(args: argparse.Namespace, folder: Path) -> tuple[dict[str, list[float]], list[float]]:
    from vllm.inputs import TokensPrompt

    from forge_nb.actors.engine import plain
    from forge_nb.actors.engine.inproc import InprocEngine
    from forge_nb.actors.engine.worker import generator_engine_args, make_sampling_params
    from forge_nb.models import TinyModelConfig, build_tiny_model

    model = str(build_tiny_model(folder / "tiny", TinyModelConfig(alphabet="abcdefgh")))
    values = {"dtype": "float32", "max_model_len": 16, **args.engine_args}
    engine_args = generator_engine_args(values, model, cuda=False)
    kv = engine_args.kv_cache_memory_bytes
    print(f"engine: the tiny model, {plain.choose(model, 'auto')} weights, float32, max_model_len 16, KV cache "
          f"{f'{kv >> 20} MiB' if kv else 'of VLLM_CPU_KVCACHE_SPACE'}, eager, in this process; "
          f"variants: {dict(args.variant)}, engine arguments over the Generator's: {args.engine_args}")
    built = time.monotonic()
    engine = await InprocEngine.start(engine_args)
    print(f"RESULT engine_cpu_build_s {time.monotonic() - built:.1f}")
    clock = time.pthread_getcpuclockid(engine._thread.ident)
    sampling = {name: make_sampling_params({**QUICKSTART_SAMPLING, **params}, decode_here=True)
                for name, params in args.variant}
    prompts = [[1 + group, 2, 3, 4] for group in range(4)]
    cpu: dict[str, list[float]] = {name: [] for name in sampling}
    resets: list[float] = []
    try:
        for batch in range(args.warmup + args.batches):
            order = list(sampling.items()) if batch % 2 == 0 else list(reversed(sampling.items()))
            for name, params in order:
                requests = [(TokensPrompt(prompt_token_ids=prompt), params, f"{batch}-{name}-{group}-{sample}", None)
                            for group, prompt in enumerate(prompts) for sample in range(4)]
                start = time.clock_gettime(clock)
                await engine.generate_many(requests)
                generated = time.clock_gettime(clock)
                await engine.reset_prefix_cache()
                if batch >= args.warmup:
                    cpu[name].append((generated - start) * 1e3)
                    resets.append((time.clock_gettime(clock) - generated) * 1e3)
    finally:
        engine.shutdown()
    return cpu, resets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=400, help="measured batches per variant")
    parser.add_argument("--warmup", type=int, default=20, help="batches per variant before measuring")
    parser.add_argument("--variant", type=variant, action="append", required=True,
                        help="NAME='{sampling params}' over the quickstart's; the first is the baseline")
    parser.add_argument("--engine-args", type=json.loads, default={},
                        help="JSON engine arguments over the Generator's, e.g. '{\"enforce_eager\": false}'")
    args = parser.parse_args()
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # not a line per prefix-cache reset; read at vLLM's import
    with tempfile.TemporaryDirectory(prefix="bench-engine-cpu-") as folder:
        cpu, resets = asyncio.run(measure(args, Path(folder)))
    print(f"the quickstart's batch: 4 prompts x 4 samples x {QUICKSTART_SAMPLING['max_tokens']} tokens, "
          f"{args.batches} batches per variant after {args.warmup}, taking turns")
    first = statistics.median(next(iter(cpu.values())))
    for name, values in cpu.items():
        median = statistics.median(values)
        print(f"{name:12} median {median:7.3f} ms  mean {statistics.mean(values):7.3f} ms of the engine thread's CPU")
        print(f"RESULT engine_cpu_ms_per_batch {name} {median:.3f}")
        print(f"RESULT engine_cpu_vs_first {name} {median / first:.3f}")
    print(f"the prefix-cache reset after each batch: median {statistics.median(resets):.3f} ms")


if __name__ == "__main__":
    main()
