"""Environments as services, and episodes of several turns against them.

The picture (one trajectory; a GRPO group runs ``group_size`` of them from the same seed, concurrently)::

    kernel: multi_turn_episode                 env service (EnvPool replicas)     policy service (vLLM)
      reset(tid, seed)  ──────────────────────>  env = factory(); env.reset(seed)
      <── first observation (the prompt)
      loop until done / max_turns / no room:
        generate(context token ids) ─────────────────────────────────────────────>  one action
        step(tid, action) ────────────────────>  env.step(action)
        <── observation, reward, done           (framed and tokenized in the kernel: envs.chat)
      close(tid) ─────────────────────────────>  the env object is dropped
      -> Trajectory -> Episode: the policy's tokens trained, the environment's masked (rl.trajectory)

Why an ``EnvPool`` rather than the documents' one-environment actor: a replica serves many trajectories at
once, so each trajectory's state lives in its own environment object, found by the trajectory's id; the
calls of one trajectory stick to one replica through ``env.session()``. An environment is a plain object
with ``reset(seed) -> observation`` and ``step(action) -> StepResult`` (sync or async), the shape of
gymnasium-style text environments, so adapters for libraries are small (see ``forge_nb.envs.toy`` for
one written here, and ``forge_nb.envs.adapters`` for reasoning-gym tasks and TextArena games).
Considered: an actor per trajectory (a process each: far too heavy for short episodes) and passing the
state back and forth (what ``verifiers`` did; not what the documents' ``reset``/``step`` look like).
"""

from forge_nb.actors.coder import StepResult
from forge_nb.envs.adapters import ReasoningGymEnv, TextArenaEnv
from forge_nb.envs.episode import multi_turn_episode
from forge_nb.envs.openenv_env import OpenEnvEnv
from forge_nb.envs.pool import EnvPool, TextEnv
from forge_nb.envs.toy import EchoEnv

__all__ = ["EchoEnv", "EnvPool", "OpenEnvEnv", "ReasoningGymEnv", "StepResult", "TextArenaEnv", "TextEnv",
           "multi_turn_episode"]
