"""RLTrainer on a GPU: step time, tokens/s and the share of the card's measured matmul rate it reaches.

A Qwen3-shaped model is built locally (no hub here; ``--layers`` / ``--hidden`` set its size), an
RLTrainer is spawned on one GPU, and after ``--warmup`` steps ``--steps`` GRPO steps are timed on a
batch of ``--episodes`` episodes of ``--prompt`` + ``--response`` tokens. In the same run this process
times a large bf16 matrix product on the same card, so the trainer's rate is printed as a ratio of
what the card does here and now (model FLOPs: 6 x parameters x tokens per step, attention left out).
Then the weights are pushed once more (GPU -> shared memory, ``push_weights``) and timed.

Ends with ``RESULT trainer_gpu_mfu <trainer TFLOP/s / matmul TFLOP/s>``. Needs CUDA.

    python bench/trainer_gpu.py [--layers 16] [--hidden 1024] [--episodes 32] [--steps 10]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from forge_nb import weights  # noqa: E402
from forge_nb.models import TinyModelConfig, build_tiny_model  # noqa: E402
from forge_nb.rl import Completion, Episode, collate  # noqa: E402
from forge_nb.system.runtime import lifecycle, spawning


def make_batch(episodes: int, prompt: int, response: int, vocab: int) -> object:
    g = torch.Generator().manual_seed(0)
    return collate([
        Episode(
            episode_id=str(i), pad_id=0, request_len=prompt, response_len=response,
            completion=Completion(prompt="p", text="t", prompt_ids=torch.randint(2, vocab, (prompt,), generator=g),
                                  token_ids=torch.randint(2, vocab, (response,), generator=g)),
            ref_logprobs=-2 * torch.rand(response, generator=g), advantage=1.0 if i % 2 else -1.0,
        )
        for i in range(episodes)
    ])


def matmul_tflops(n: int = 8192, repeats: int = 20) -> float:
    """The card's bf16 matrix-product rate, measured here (random data; median of timed products)."""
    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    for _ in range(3):
        a @ b
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return 2 * n**3 / statistics.median(times) / 1e12


async def main(args: argparse.Namespace) -> None:
    from forge_nb.actors.trainer import RLTrainer

    cfg = TinyModelConfig(hidden_size=args.hidden, num_layers=args.layers, num_heads=args.hidden // 64,
                          head_dim=64, intermediate_size=3 * args.hidden,
                          max_position_embeddings=args.prompt + args.response)
    model = str(build_tiny_model(os.path.join(tempfile.mkdtemp(), "model"), cfg))
    lifecycle.ensure_started()
    await weights.initialize_store()
    mesh = await spawning.spawn_mesh("bench-trainer", 1, with_gpus=True)
    try:
        trainer = mesh.spawn("trainer", RLTrainer, model=model, optimizer={"lr": 1e-5},
                             training={"dtype": "bfloat16"})
        start = time.perf_counter()
        await trainer.setup.call()
        setup_s = time.perf_counter() - start
        info = await trainer.info.call_one()
        batch = make_batch(args.episodes, args.prompt, args.response, len(cfg.alphabet) + 2)
        step_s, tokens = [], 0.0
        for i in range(args.warmup + args.steps):
            start = time.perf_counter()
            metrics = await trainer.train_step.call_one(batch)
            if i >= args.warmup:
                step_s.append(time.perf_counter() - start)
                tokens = metrics["tokens"]
            assert metrics["skipped"] == 0.0 and torch.isfinite(torch.tensor(metrics["loss"])), metrics
        await trainer.push_weights.call_one(1)  # the first push creates the shared-memory file
        await weights.drop_version(1)
        push = await trainer.push_weights.call_one(2)
        params = sum(t.numel() for t in (await trainer.state_dict.call_one())["model"].values())
    finally:
        await mesh.stop()
        await weights.shutdown_store()

    step = statistics.median(step_s)
    seq_tokens = args.episodes * (args.prompt + args.response)  # what the forward and backward process
    achieved = 6 * params * seq_tokens / step / 1e12
    peak = matmul_tflops()
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}")
    reason = info.get("fallback_reason")
    print(f"engine: {info['engine']}" + (f" (fallback: {reason})" if reason else ""))
    print(f"model: {params / 1e6:.0f}M parameters ({args.layers} layers, hidden {args.hidden}); setup {setup_s:.1f} s")
    print(f"batch: {args.episodes} episodes x ({args.prompt} + {args.response}) tokens, "
          f"{tokens:.0f} response tokens trained")
    print(f"step: median {step * 1e3:.0f} ms of {args.steps} (min {min(step_s) * 1e3:.0f}, "
          f"max {max(step_s) * 1e3:.0f}); {seq_tokens / step:,.0f} tokens/s")
    print(f"push_weights: {push['mb']:.0f} MiB in {push['seconds'] * 1e3:.0f} ms "
          f"({push['mb'] * 2**20 / push['seconds'] / 1e9:.1f} GB/s)")
    print(f"model TFLOP/s {achieved:.1f} vs matmul {peak:.0f} TFLOP/s on this card")
    print(f"RESULT trainer_gpu_mfu {achieved / peak:.3f}")


if __name__ == "__main__":
    if not torch.cuda.is_available():
        sys.exit("bench/trainer_gpu.py needs CUDA")
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--episodes", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--response", type=int, default=384)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    asyncio.run(main(ap.parse_args()))
