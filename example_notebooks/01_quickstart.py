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
# # forge_nb quickstart: GRPO on a tiny model, on CPU, from cells
#
# This notebook spawns real Monarch process meshes from the kernel: a vLLM generator service
# (vLLM's CPU build) and a trainer, all serving a tiny Qwen3 that forge_nb builds locally. The toy
# task: continue a letter pattern (`"c"` -> `"cccc"`), scored by the fraction of characters right.
# An untrained model scores about 0.1; watch the reward rise on the dashboard while you keep working.

# %%
%load_ext forge_nb

# %% tags=["parameters"]
STEPS = 250  # training steps for the %forge_step cell below

# %% [markdown]
# Spawn the run: a generator replica and a trainer, each its own process mesh. The cell waits until
# they are up (10-25 s on two cores) and binds `run`; the run directory is `runs/quickstart-<time>/`.

# %%
%forge_spawn quickstart

# %% [markdown]
# The live dashboard: replica health, training curves, controls (start / pause / step / stop and
# the hot-changeable hyperparameters) and a rollout explorer. It keeps updating while other cells run.

# %%
%forge_dashboard --side

# %% [markdown]
# Start the loops in the background: the cell returns at once and training goes on.

# %%
%forge_run
%forge_status

# %% [markdown]
# Train an exact number of steps. Interrupting this cell stops only the waiting, never the run.

# %%
%forge_step {STEPS}

# %% [markdown]
# Change a hyperparameter between steps: it applies at the next step boundary and is marked on the
# curves. Here the learning rate is halved for a last stretch, as a schedule would do near the end.

# %%
%forge_set lr=3.5e-4
%forge_step 25

# %%
%forge_episodes -n 8

# %% [markdown]
# How it ended: the mean reward of the first and the last 50 steps, and each letter's mean reward
# over its newest samples (a mean reward can hide a letter the policy never learned).

# %%
from forge_nb.rl.report import per_prompt, unsolved

frame = run.metrics.frame()
print(f"reward: first 50 steps {frame['reward/mean'].head(50).mean():.2f}, "
      f"last 50 steps {frame['reward/mean'].tail(50).mean():.2f} after {len(frame)} steps")
episodes = run.episodes(2000)
print("per letter:", ", ".join(f"{p['prompt']} {p['mean_reward']:.2f}" for p in per_prompt(episodes)))
print("letters not learned yet:", ", ".join(p["prompt"] for p in unsolved(episodes)) or "none")
frame[["reward/mean", "loss", "entropy", "weight_sync_s"]].tail()

# %% [markdown]
# The generator (vLLM) and the trainer compute the same policy with different kernels, and in async mode the
# trainer trains on episodes of older versions. The dashboard's *mismatch KL* and *importance ratio* panels show how
# far apart they are each step: `mismatch/kl_same_version` is the engine's numerics alone (float32 both sides here:
# ~1e-14), `mismatch/kl` adds the episodes' staleness. `%forge_eval` samples 4 answers to each held-out prompt from
# the generators holding the current version: avg@4 and pass@k (docs: Async RL).

# %%
mismatch = ["mismatch/kl", "mismatch/kl_same_version", "mismatch/ratio_p1", "mismatch/ratio_p99"]
print(frame.reindex(columns=mismatch).mean())
%forge_eval -k 4

# %%
%forge_shutdown
