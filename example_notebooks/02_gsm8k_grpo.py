# %% [markdown]
# # GRPO on GSM8K
#
# On a CUDA machine this is torchforge's recipe: `Qwen/Qwen3-1.7B` answering grade-school math,
# scored by `MathReward` (math-verify) and `ThinkingReward`, with a reference model for the KL
# penalty. Without CUDA the same cells run a tiny character-level model on a local GSM8K-format
# file, to try the pipeline end to end (it will not learn arithmetic).

# %%
import os

import torch

import forge_nb
from forge_nb.recipes import gsm8k_qwen3, gsm8k_tiny

STEPS = int(os.environ.get("FORGE_NB_STEPS", "200"))
local_data = os.path.join(os.path.dirname(os.path.abspath("__file__")), "example_notebooks", "data",
                          "gsm8k_sample.jsonl")
if not os.path.exists(local_data):
    local_data = os.path.join("data", "gsm8k_sample.jsonl")
if torch.cuda.is_available():
    cfg = gsm8k_qwen3("Qwen/Qwen3-1.7B", run_dir=os.environ.get("FORGE_NB_RUN_DIR"))
else:
    cfg = gsm8k_tiny(local_data, run_dir=os.environ.get("FORGE_NB_RUN_DIR"))
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
