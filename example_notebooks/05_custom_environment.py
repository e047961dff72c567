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
# # A custom environment service and a custom reward
#
# Verifiable rewards often need to run the model's output. `SandboxedPythonCoder` is a CPU-only
# service whose replicas run untrusted Python in separate, limited processes. Here a reward function
# scores the toy task by *executing* a check in the sandbox, and the reward contract shows what
# happens to a reward that raises: the episode is quarantined with its reason, the run goes on.

# %% tags=["parameters"]
STEPS = 20

# %%
import forge_nb
from forge_nb.actors.coder import SandboxedPythonCoder

coder = await SandboxedPythonCoder.options(num_replicas=2).as_service(timeout_s=2.0, memory_mb=256)
run = await forge_nb.spawn(forge_nb.quickstart(name="custom-env"))


async def executed_match(prompt, response, target):
    """Fraction of target characters matched, computed by a program run in the sandbox."""
    code = f"r, t = {response!r}, {target!r}\nprint(sum(a == b for a, b in zip(r, t)) / len(t))"
    result = await coder.execute.route(code)
    if result.exit_code != 0:
        raise RuntimeError(result.stderr[-200:])
    return float(result.stdout)


run.reward_fns[:] = [executed_match]
rows = await run.step(STEPS)
print(f"reward via the sandbox: {rows[0]['reward/mean']:.2f} -> {rows[-1]['reward/mean']:.2f}")

# %% [markdown]
# A reward function that fails is not a crash: the episode is quarantined with a recorded reason.

# %%
def flaky(prompt, response, target):
    if response.startswith(prompt):
        raise ValueError("cannot score this one")
    return 0.5


run.reward_fns[:] = [executed_match, flaky]
await run.step(2)
for event in run.metrics.events_frame("quarantine").itertuples():  # one event per interval, counts per reason
    print(f"step {event.step}: {event.episodes} quarantined episodes; reasons {event.reasons}")

# %%
await run.shutdown()
await coder.shutdown()
