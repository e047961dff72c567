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
# # Two configurations side by side
#
# Two quickstart runs in one kernel, one with a learning rate three times the other's, train at the
# same time and draw on the same curves. Each run has its own services, weight versions (its own
# torchstore key namespace), metrics and ledger; shutting one down leaves the other training.
# Both share the kernel's torchstore, which stops when the last run lets go of it.

# %% tags=["parameters"]
STEPS = 60

# %%
import asyncio

import forge_nb
from forge_nb.widgets import compare


def config(name, lr):
    # one generator replica each: two runs share the machine's two cores
    return forge_nb.quickstart(name=name), {"trainer.optimizer.lr": lr, "generator.num_replicas": 1}


(cfg_a, set_a), (cfg_b, set_b) = config("lr_1e-3", 1e-3), config("lr_3e-3", 3e-3)
slow, fast = await asyncio.gather(forge_nb.spawn(cfg_a, overrides=set_a), forge_nb.spawn(cfg_b, overrides=set_b))
print(slow.weights_namespace, "|", fast.weights_namespace)

# %% [markdown]
# The comparison view: one panel per metric, one trace per run, growing as both train.

# %%
view = compare(slow, fast, metrics=("reward/mean", "loss", "entropy"))
view

# %% [markdown]
# Train both at once: `run.step(n)` returns when its run has taken n steps.

# %%
await asyncio.gather(slow.step(STEPS), fast.step(STEPS))


def last_reward(run, n=10):
    rows = run.metrics.rows[-n:]
    return sum(r["reward/mean"] for r in rows) / len(rows)


for run in (slow, fast):
    print(f"{run.name}: step {run.current_step}, version {run.version}, reward (last 10 steps) "
          f"{last_reward(run):.2f}, ledger balanced: {run.ledger()['balanced']}")

# %% [markdown]
# Shut one down; the other keeps training on its own weights.

# %%
await fast.shutdown()
rows = await slow.step(3)
print(slow, "| trained on after the other's shutdown:", [r["step"] for r in rows], "| ledger balanced:",
      slow.ledger()["balanced"])

# %%
view.close()
await slow.shutdown()
