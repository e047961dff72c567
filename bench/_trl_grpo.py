"""TRL's side of ``bench/vs_trl.py``, as a TRL user on CPU runs it: a script of its own, in an environment that holds
TRL and what it needs (torch, transformers, datasets, accelerate) and nothing of forge_nb's (no vLLM: TRL imports
vLLM's generation path whenever vLLM is installed, which costs its users nothing and a shared environment ~5 s).

Everything forge_nb decides is handed over in the spec file ``vs_trl.py`` writes: the tiny model's folder, the task's
prompts and targets, the ``GRPOConfig`` fields (``fair_trl_settings``), the seed and the budget. The reward is the
quickstart's ``PatternReward``: the share of the target's characters the answer has in place.

    python bench/_trl_grpo.py SPEC.json OUT.json

OUT holds each step's time and mean reward, and when the imports, the trainer's construction and training began.
"""

from __future__ import annotations

import json
import sys
import time


def main(spec_path: str, out_path: str) -> None:
    started = time.time()
    spec = json.loads(open(spec_path).read())
    import torch
    from datasets import Dataset
    from transformers import PreTrainedTokenizerFast, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    imported = time.time()
    torch.manual_seed(spec["seed"])
    if spec["threads"]:
        torch.set_num_threads(spec["threads"])
    tokenizer = PreTrainedTokenizerFast.from_pretrained(spec["model"])
    tokenizer.padding_side = "left"
    data = Dataset.from_list(spec["rows"])

    def pattern_reward(prompts: list[str], completions: list[str], target: list[str], **_: object) -> list[float]:
        return [sum(a == b for a, b in zip(c, t, strict=False)) / len(t) if t else 0.0
                for c, t in zip(completions, target, strict=True)]

    times: list[float] = []
    rewards: list[float] = []
    began: list[float] = []

    class Record(TrainerCallback):
        def on_train_begin(self, *_: object, **__: object) -> None:
            began.append(time.time())

        def on_log(self, _args: object, state: object, control: object, logs: dict | None = None, **_: object) -> None:
            if logs and "reward" in logs:  # one entry per optimizer step
                steps = max(1, state.global_step - len(times))  # type: ignore[attr-defined]
                times.extend([time.time()] * steps)
                rewards.extend([float(logs["reward"])] * steps)
            if times and times[-1] - began[0] > spec["budget_s"]:
                control.should_training_stop = True  # type: ignore[attr-defined]

    config = GRPOConfig(output_dir=spec["output_dir"], use_cpu=True, report_to="none", save_strategy="no",
                        logging_steps=1, disable_tqdm=True, seed=spec["seed"], max_steps=spec["max_steps"],
                        **spec["settings"])
    trainer = GRPOTrainer(model=spec["model"], reward_funcs=pattern_reward, args=config, train_dataset=data,
                          processing_class=tokenizer, callbacks=[Record()])
    built = time.time()
    dtypes = sorted({str(p.dtype) for p in trainer.model.parameters()})
    trainer.train()
    with open(out_path, "w") as f:
        json.dump({"times": times, "rewards": rewards, "param_dtypes": dtypes, "threads": torch.get_num_threads(),
                   "started": started, "imported": imported, "built": built, "python": sys.executable,
                   "vllm_imported": "vllm" in sys.modules}, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
