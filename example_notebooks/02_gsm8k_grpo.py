# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # GRPO on GSM8K
#
# On a CUDA machine this is torchforge's recipe: `Qwen/Qwen3-1.7B` answering grade-school math,
# scored by `MathReward` (math-verify) and `ThinkingReward`, with a reference model for the KL
# penalty. Without CUDA the same cells run a tiny character-level model on a local GSM8K-format
# file, to try the pipeline end to end (it will not learn arithmetic).

# %% tags=["parameters"]
STEPS = 200

# %%
import torch

import forge_nb
from forge_nb.recipes import gsm8k_qwen3, gsm8k_tiny

if torch.cuda.is_available():
    cfg = gsm8k_qwen3("Qwen/Qwen3-1.7B")
else:
    cfg = gsm8k_tiny("data/gsm8k_sample.jsonl")  # beside this notebook
print(cfg.model, "on", "GPU" if torch.cuda.is_available() else "CPU")
run = await forge_nb.spawn(cfg)

# %%
rows = await run.step(STEPS)
frame = run.metrics.frame()
print(frame[[c for c in ("reward/mean", "reward/MathReward", "reward/ThinkingReward", "kl", "loss") if c in frame]].tail())

# %%
for episode in run.episodes(3):
    print(repr(episode["response"][:80]), "->", episode["reward"], "target", episode["target"])

# %%
await run.shutdown()
