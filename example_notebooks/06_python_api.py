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
# # forge_nb from plain Python
#
# The same workflow as the quickstart, without magics: spawn a run from a recipe, train in the
# background while this kernel stays free, look at metrics and rollouts, change a hyperparameter
# between steps, and shut down. Every call here is what the `%forge_*` magics call.

# %% tags=["parameters"]
STEPS = 120

# %%
import asyncio

import forge_nb

cfg = forge_nb.quickstart()  # the run directory: runs/quickstart-<time>/
run = await forge_nb.spawn(cfg)  # a vLLM generator service, a trainer, torchstore
run

# %% [markdown]
# `run.start()` returns at once: the loops are asyncio tasks in this kernel. The cell below waits a
# little and reads the metrics while training goes on.

# %%
run.start()
await asyncio.sleep(5)
print(run, "| buffer:", len(run.replay_buffer))

# %% [markdown]
# Pause at a step boundary, change the learning rate, then run an exact number of steps.

# %%
run.pause()
run.set(lr=2e-3)
rows = await run.step(STEPS)
print(f"step {rows[-1]['step']:.0f}: reward {rows[0]['reward/mean']:.2f} -> {rows[-1]['reward/mean']:.2f}")

# %%
run.metrics.frame()[["reward/mean", "loss", "entropy", "policy_age/mean", "weight_sync_s"]].tail()

# %%
for episode in run.episodes(5):
    print(f"{episode['prompt']!r:6} -> {episode['response']!r:10} reward {episode['reward']:.2f} v{episode['version']}")

# %%
run.metrics.events_frame()[["kind", "step"]].tail()

# %%
await run.shutdown()
