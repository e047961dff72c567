"""The Tinker API on a run: what a training step costs through the ``tinker`` SDK against the same work called on the
trainer directly, and what tinker-cookbook's own RL loop reaches on the quickstart's task.

1. **Step overhead.** A LoRA quickstart run serves the Tinker API; one training client (rank ``--rank``). A step is
   ``forward_backward(batch, "importance_sampling")`` then ``optim_step(AdamParams(lr))``, the SDK's way: both
   submitted at once (the SDK pipelines them) and awaited. The same batch, as the same plain Datums, goes through the
   same trainer actor directly from the kernel (``trainer.forward_backward.route`` then ``trainer.optim_step.route``:
   what the server calls, without HTTP, the futures and the hop between the server's thread and the kernel's loop).
   The two alternate, ``--steps`` each after ``--warmup`` each, on two batch sizes: the quickstart's (16 Datums of 5
   tokens) and a larger one (``--big`` Datums of 64 tokens). Ratio: p50 through the SDK over p50 direct.
2. **The cookbook's RL loop**, ``tinker_cookbook.rl.train.main`` unchanged (0.6.1), on the quickstart's task
   (``forge_nb.tinker.cookbook.TaskDatasetBuilder``: 8 groups of 8 a batch, ``--iterations`` batches, lr 2e-3,
   importance sampling, rank 8), in a thread as a script runs it; the final reward is the mean of its last 5
   iterations' ``env/all/reward/total``.

    RESULT tinker_step_overhead_ratio <p50 of an SDK step / p50 of the same step called directly> (target <= 1.2)
    RESULT tinker_step_overhead_ratio_big <the same on the larger batch>
    RESULT tinker_cookbook_rl_final_reward <mean reward of the cookbook loop's last 5 iterations> (target >= 0.6)

    .venv/bin/python bench/tinker_api.py [--steps 40] [--warmup 5] [--big 64] [--iterations 50] [--rank 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tinker  # noqa: E402
from tinker import types  # noqa: E402

import forge_nb  # noqa: E402

LR = 1e-4  # small: the steps below measure time, the adapter should stay sane over a hundred of them


def batch(n: int, length: int, vocab: int, seed: int) -> list[dict[str, Any]]:
    """``n`` plain Datums of ``length`` tokens for importance_sampling (forge_nb's form: tokens and inputs)."""
    import random

    rng = random.Random(seed)
    out = []
    for _ in range(n):
        tokens = [rng.randrange(2, vocab) for _ in range(length + 1)]
        out.append({"tokens": tokens[:-1], "inputs": {
            "target_tokens": tokens[1:], "logprobs": [-2.0] * length,
            "advantages": [rng.choice((-1.0, 1.0))] * length}})
    return out


def as_sdk(datums: list[dict[str, Any]]) -> list[types.Datum]:
    return [types.Datum(model_input=types.ModelInput.from_ints(d["tokens"]), loss_fn_inputs=d["inputs"])
            for d in datums]


async def step_overhead(run: Any, server: Any, args: argparse.Namespace) -> dict[str, float]:
    service = await asyncio.to_thread(tinker.ServiceClient, base_url=server.url, api_key=server.token)
    training = await service.create_lora_training_client(base_model=server.base_model, rank=args.rank)
    trainer = server.models[training.model_id].run.trainer
    vocab = len(training.get_tokenizer())
    adam = types.AdamParams(learning_rate=LR)
    ratios = {}
    for label, (n, length) in {"quickstart": (16, 5), "big": (args.big, 64)}.items():
        plain = batch(n, length, vocab, seed=n)
        sdk_batch = as_sdk(plain)

        async def through_sdk(sdk_batch: list[types.Datum] = sdk_batch) -> float:
            t0 = time.perf_counter()
            fb, opt = training.forward_backward(sdk_batch, "importance_sampling"), training.optim_step(adam)
            await fb
            await opt
            return time.perf_counter() - t0

        async def direct(plain: list[dict[str, Any]] = plain) -> float:
            t0 = time.perf_counter()
            await trainer.forward_backward.route(plain, "importance_sampling", None)
            await trainer.optim_step.route(**adam.model_dump())
            return time.perf_counter() - t0

        sdk, own = [], []
        for i in range(args.warmup + args.steps):  # alternating: the machine's drift lands on both sides
            a, b = await through_sdk(), await direct()
            if i >= args.warmup:
                sdk.append(a)
                own.append(b)
        p50_sdk, p50_own = statistics.median(sdk), statistics.median(own)
        ratios[label] = p50_sdk / p50_own
        print(f"{label} batch ({n} Datums x {length} tokens, importance_sampling, AdamParams lr {LR}): through the "
              f"SDK p50 {p50_sdk * 1000:.1f} ms (p90 {sorted(sdk)[int(0.9 * len(sdk))] * 1000:.1f}), direct p50 "
              f"{p50_own * 1000:.1f} ms (p90 {sorted(own)[int(0.9 * len(own))] * 1000:.1f}); {args.steps} steps each")
    await server.close_client(training.model_id)
    return ratios


async def cookbook_rl(server: Any, args: argparse.Namespace, workdir: str) -> float:
    from tinker_cookbook.rl import train

    from forge_nb.tinker.cookbook import TaskDatasetBuilder

    os.environ["TINKER_API_KEY"] = server.token  # what the cookbook's ServiceClient(base_url=...) reads
    log = Path(workdir) / "cookbook-rl"
    config = train.Config(
        learning_rate=2e-3, model_name=server.base_model, recipe_name="forge_nb_quickstart", max_tokens=4,
        dataset_builder=TaskDatasetBuilder(model_path=server.base_model, batch_size=8, group_size=8,
                                           n_batches=args.iterations),
        log_path=str(log), base_url=server.url, lora_rank=8, eval_every=0, save_every=0)
    print(f"tinker-cookbook rl.train.main: {args.iterations} iterations of 8 groups of 8, lr 2e-3, "
          f"{config.loss_fn}, rank 8, max_tokens 4")
    t0 = time.perf_counter()
    await asyncio.to_thread(asyncio.run, train.main(config))
    rows = [json.loads(line) for line in (log / "metrics.jsonl").read_text().splitlines()]
    rewards = [r["env/all/reward/total"] for r in rows if "env/all/reward/total" in r]
    print(f"  {time.perf_counter() - t0:.1f} s; reward by iteration: {[round(r, 2) for r in rewards]}")
    return statistics.mean(rewards[-5:])


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="tinker-bench-") as workdir:
        cfg = forge_nb.quickstart(name="tinker-bench", run_dir=f"{workdir}/served")
        run = await forge_nb.spawn(cfg, overrides={"trainer.lora": {"rank": args.rank, "alpha": 2 * args.rank},
                                                    "generator.num_replicas": 1}, progress=False)
        try:
            server = await run.serve_tinker()
            print(f"served run: the quickstart with trainer.lora rank {args.rank}; tinker {tinker.__version__}")
            ratios = await step_overhead(run, server, args)
            final = await cookbook_rl(server, args, workdir)
        finally:
            await run.shutdown()
    print(f"RESULT tinker_step_overhead_ratio {ratios['quickstart']:.3f} (target <= 1.2)")
    print(f"RESULT tinker_step_overhead_ratio_big {ratios['big']:.3f}")
    print(f"RESULT tinker_cookbook_rl_final_reward {final:.3f} (target >= 0.6)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--big", type=int, default=64)
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--rank", type=int, default=8)
    asyncio.run(main(parser.parse_args()))
