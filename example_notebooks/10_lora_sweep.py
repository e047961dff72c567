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
# # A learning-rate sweep on one base model
#
# Four LoRA runs of the quickstart, one learning rate each (5e-4 to 2e-3: above that the tiny model's LoRA runs
# turn unstable, 4e-3 ending between 0.4 and 0.7), on one base model: the first run brings up the
# generator and the trainer, the other three add their adapters to them instead of spawning their own. The
# engine serves the four adapters in the same batches and the trainer process holds one copy of the base
# weights; each run keeps its own optimizer, weight versions, replay buffer, metrics and controls, so any
# of them can be paused, changed or shut down while the others train.

# %% tags=["parameters"]
STEPS = 200

# %%
%load_ext forge_nb
import asyncio

import forge_nb
from forge_nb.widgets import compare

LORA = {"trainer.lora": {"rank": 8, "alpha": 16}, "generator.num_replicas": 1}

first = await forge_nb.spawn(forge_nb.quickstart(name="lr_5e-4"), overrides={**LORA, "trainer.optimizer.lr": 5e-4})
second = await forge_nb.spawn(forge_nb.quickstart(name="lr_1e-3"), overrides={**LORA, "trainer.optimizer.lr": 1e-3},
                              base=first)
third = await forge_nb.spawn(forge_nb.quickstart(name="lr_1.5e-3"), overrides={**LORA, "trainer.optimizer.lr": 1.5e-3},
                             base=first)

# %% [markdown]
# The same from a cell magic: `--lora RANK` trains adapters, `--on NAME` puts the run on that run's base.

# %%
%forge_spawn quickstart --name lr_2e-3 --lora 8 --on lr_5e-4 --set trainer.optimizer.lr=2e-3 -o fourth

# %%
runs = [first, second, third, fourth]
print("runs on one base:", first.base.runs)
print("generator processes:", {r.name: r.policy.replicas[0].mesh.pids for r in runs})
print("trainer processes:", {r.name: r.trainer.replica.mesh.pids for r in runs})

# %% [markdown]
# The comparison view: one panel per metric, one trace per run, growing as they train.

# %%
view = compare(*runs, metrics=("reward/mean", "loss", "entropy"))
view

# %%
await asyncio.gather(*(run.step(STEPS) for run in runs))


def mean_reward(run, steps):
    rows = [r for r in run.metrics.rows if "reward/mean" in r][steps]
    return sum(r["reward/mean"] for r in rows) / len(rows)


for run in runs:
    print(f"{run.name}: reward {mean_reward(run, slice(0, 10)):.2f} over the first 10 steps, "
          f"{mean_reward(run, slice(-25, None)):.2f} over the last 25; version {run.version}, "
          f"ledger balanced: {run.ledger()['balanced']}")

# %% [markdown]
# Shutting a run down takes its adapter out of the shared engine and trainer; the others train on, and the
# shared processes go with the last run.

# %%
await fourth.shutdown()
rows = await first.step(3)
print(first.name, "trained on:", [r["step"] for r in rows], "| runs on the base:", first.base.runs)

# %%
view.close()
for run in (third, second, first):
    await run.shutdown()
