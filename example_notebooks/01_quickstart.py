# %% [markdown]
# # forge_nb quickstart: GRPO on a tiny model, on CPU, from cells
#
# This notebook spawns real Monarch process meshes from the kernel: two vLLM generator replicas
# (vLLM's CPU build) and a trainer, all serving a tiny Qwen3 that forge_nb builds locally. The toy
# task: continue a letter pattern (`"c"` -> `"cccc"`), scored by the fraction of characters right.
# An untrained model scores about 0.1; watch the reward rise on the dashboard while you keep working.

# %%
%load_ext forge_nb

# %% tags=["parameters"]
STEPS = 250  # training steps for the %forge_step cell below

# %% [markdown]
# Spawn the run: two generator replicas and a trainer, each its own process mesh. The cell waits until
# they are up (about 40 s) and binds `run`; the run directory is `runs/quickstart-<time>/`.

# %%
%forge_spawn quickstart

# %% [markdown]
# The live dashboard: replica health, training curves, controls (start / pause / step / stop and
# the hot-changeable hyperparameters) and a rollout explorer. It keeps updating while other cells run.

# %%
%forge_dashboard

# %% [markdown]
# Start the loops in the background: the cell returns at once and training goes on.

# %%
%forge_run
%forge_status

# %% [markdown]
# Change a hyperparameter between steps (it is marked on the curves), then train an exact number
# of steps. Interrupting this cell stops only the waiting, never the run.

# %%
%forge_set lr=2e-3
%forge_step {STEPS}

# %%
%forge_episodes -n 8

# %%
frame = run.metrics.frame()
print(f"reward: first steps {frame['reward/mean'].head(10).mean():.2f}, "
      f"last steps {frame['reward/mean'].tail(10).mean():.2f} after {len(frame)} steps")
frame[["reward/mean", "loss", "entropy", "weight_sync_s"]].tail()

# %%
%forge_shutdown
