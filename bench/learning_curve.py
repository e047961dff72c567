"""The CPU quickstart's learning curve: does a run of N steps end well on 2 cores?

Spawns the quickstart (tiny Qwen3, toy task, 2 vLLM CPU generator replicas), trains exactly ``--steps``
steps (default 250, the notebook's run), prints the curve every 25 steps and ends with RESULT lines:

    RESULT quickstart_last50_reward <mean reward of the last 50 steps> (target 0.9)
    RESULT quickstart_unsolved_prompts <prompts whose recent samples average < 0.75> (target 0)
    RESULT quickstart_min_prompt_reward <the worst prompt's recent mean reward>
    RESULT quickstart_final_entropy <mean policy entropy of the last 10 steps>
    RESULT quickstart_steps_to_0.8 <first step whose last-10 mean reward is >= 0.8, or none>
    RESULT quickstart_seconds_to_0.8 <seconds from the first step to that one> (target 600)

Options change the recipe for an experiment (``--lr 2e-3 --temperature 1.2 --loss-config '{...}'``);
``--seed`` changes the model's initialisation, the task's prompts and the sampling.

    .venv/bin/python bench/learning_curve.py [--steps 250] [--seed 0] [--lr ...] [--entropy-coef ...]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import forge_nb  # noqa: E402
from forge_nb.rl.report import per_prompt  # noqa: E402


def window_mean(values: list[float], n: int) -> float:
    tail = values[-n:]
    return sum(tail) / len(tail) if tail else 0.0


def steps_to(steps: list[int], values: list[float], target: float, n: int = 10) -> int | None:
    """The first step whose mean reward over the last n steps is >= target."""
    for i in range(n - 1, len(values)):
        if sum(values[i - n + 1 : i + 1]) / n >= target:
            return steps[i]
    return None


def build_config(args: argparse.Namespace, run_dir: str) -> Any:
    cfg = forge_nb.quickstart(run_dir=run_dir, seed=args.seed)
    trainer: dict[str, Any] = {}
    if args.lr is not None:
        trainer["optimizer"] = dataclasses.replace(cfg.trainer.optimizer, lr=args.lr)
    if args.loss is not None:
        trainer["loss"] = args.loss
    if args.loss_config is not None:
        trainer["loss_config"] = json.loads(args.loss_config)
    if args.entropy_coef is not None:  # the loss's entropy bonus (0 switches it off)
        trainer["loss_config"] = {**(trainer.get("loss_config") or cfg.trainer.loss_config),
                                  "entropy_coef": args.entropy_coef}
    top: dict[str, Any] = {}
    if trainer:
        top["trainer"] = dataclasses.replace(cfg.trainer, **trainer)
    if args.temperature is not None or args.top_p is not None:
        sp = dict(cfg.generator.sampling_params)
        sp.update({k: v for k, v in (("temperature", args.temperature), ("top_p", args.top_p)) if v is not None})
        top["generator"] = dataclasses.replace(cfg.generator, sampling_params=sp)
    if args.warmup is not None:
        top["loop"] = dataclasses.replace(cfg.loop, warmup_steps=args.warmup)
    for name in ("group_size", "batch_size", "max_policy_age"):
        if getattr(args, name) is not None:
            top[name] = getattr(args, name)
    return dataclasses.replace(cfg, **top) if top else cfg


async def main(args: argparse.Namespace) -> None:
    t0 = time.time()
    cfg = build_config(args, f"runs/learning-curve-{int(t0)}")
    print("config:", {k: v for k, v in vars(args).items() if v is not None}, flush=True)
    run = await forge_nb.spawn(cfg, progress=False)
    print(f"spawned in {time.time() - t0:.0f} s", flush=True)
    start = time.time()
    try:
        done = 0
        while done < args.steps:
            n = min(25, args.steps - done)
            await run.step(n)
            done += n
            rewards = run.metrics.series("reward/mean")[1]
            entropy = run.metrics.series("entropy")[1]
            print(f"{time.time() - start:6.0f} s  step {run.current_step:4d}  reward(last 25) "
                  f"{window_mean(rewards, 25):.3f}  entropy {window_mean(entropy, 5):.3f}", flush=True)
    finally:
        await run.stop()
    elapsed = time.time() - start
    steps, rewards = run.metrics.series("reward/mean")
    entropy = run.metrics.series("entropy")[1]
    prompts = per_prompt(run.episodes(2000), last=args.per_prompt)
    print(f"trained {len(rewards)} steps in {elapsed:.0f} s ({len(rewards) / elapsed:.2f} steps/s)")
    print("per prompt (mean reward of its newest samples):",
          ", ".join(f"{p['prompt']!r}->{p['mean_reward']:.2f}" for p in sorted(prompts, key=lambda p: p["prompt"])))
    if run.error:
        print("run error:", run.error)
    await run.shutdown()
    reach = steps_to(steps, rewards, 0.8)
    print(f"RESULT quickstart_last50_reward {window_mean(rewards, 50):.3f} (target 0.9)")
    print(f"RESULT quickstart_unsolved_prompts {sum(not p['solved'] for p in prompts)} (target 0)")
    print(f"RESULT quickstart_min_prompt_reward {min((p['mean_reward'] for p in prompts), default=0.0):.3f}")
    print(f"RESULT quickstart_final_entropy {window_mean(entropy, 10):.3f}")
    print(f"RESULT quickstart_steps_to_0.8 {reach if reach is not None else 'none'}")
    if reach is not None:  # the first target: 0.8 within 10 minutes of the first step
        at = next(r["time"] for r in run.metrics.rows if r["step"] == reach)
        print(f"RESULT quickstart_seconds_to_0.8 {at - start:.0f} (target 600)")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=250)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--per-prompt", type=int, default=32, help="newest samples per prompt to average")
    ap.add_argument("--lr", type=float)
    ap.add_argument("--loss")
    ap.add_argument("--loss-config", help="JSON, e.g. '{\"beta\": 0.0}'")
    ap.add_argument("--entropy-coef", type=float)
    ap.add_argument("--temperature", type=float)
    ap.add_argument("--top-p", type=float)
    ap.add_argument("--warmup", type=int)
    ap.add_argument("--group-size", type=int)
    ap.add_argument("--batch-size", type=int)
    ap.add_argument("--max-policy-age", type=int)
    asyncio.run(main(ap.parse_args()))
