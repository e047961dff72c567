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
# # Fault tolerance: kill a generator replica while training runs
#
# Each generator replica is its own process mesh. Killing one fails its in-flight requests over to
# the other replica; the dead one is respawned in the background, loads the current weights (the
# service's catch-up hook) and takes traffic again. The training loop never notices.

# %% tags=["parameters"]
STEPS = 20

# %%
import asyncio
import os
import signal

import forge_nb

run = await forge_nb.spawn(forge_nb.quickstart(name="faults"), overrides={"generator.num_replicas": 2})
try:
    from forge_nb.widgets import dashboard

    display(dashboard(run))  # the health grid turns red, then green again
except ImportError:
    pass
run.start()
await run.policy.started()  # the trainer samples the first rollouts while the generators start: now both serve
await asyncio.sleep(5)

# %%
victim = run.policy.replicas[0]
old_pid = victim.mesh.pids[0]
os.kill(old_pid, signal.SIGKILL)
print("killed", old_pid, "at step", run.current_step)

# %%
step_at_kill = run.current_step
while victim.state == "healthy" and victim.mesh.pids[0] == old_pid:  # noticed within a second
    await asyncio.sleep(0.2)
await victim.wait_healthy(timeout=300)  # raises, naming the reason, if the respawn gives up
print(f"replica back with pid {victim.mesh.pids[0]}, weights v{victim.version}; run at step {run.current_step}")
for event in run.metrics.events_frame("replica").itertuples():
    print(f"step {event.step}: {event.service}[{event.replica}] {event.old} -> {event.new}")

# %%
rows = await run.step(STEPS)
assert run.current_step >= step_at_kill + STEPS and victim.restarts == 1
print("training went on:", run)

# %%
await run.shutdown()
