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
# # Multi-turn episodes against an environment service
#
# A policy that converses: each turn the environment shows a letter, the policy answers it twice
# ("c" -> "cc"), and the next letter follows, three turns an episode. The environment is a service
# (`EnvPool`: two replicas, each holding one environment object per trajectory, every call of a
# trajectory sticking to one replica). `multi_turn_episode` plays each GRPO group against it and trains
# on the policy's own tokens only: the environment's letters are context, masked out of the loss.
# The tiny model learns it from scratch in two to five minutes on two CPU cores.

# %% tags=["parameters"]
STEPS = 400  # most runs pass 0.8 by step 150; now and then one stalls with a letter half-learned past 300

# %%
%load_ext forge_nb
import forge_nb
from forge_nb.envs import EchoEnv, EnvPool, multi_turn_episode
from forge_nb.recipes import multi_turn_echo

env = await EnvPool.options(num_replicas=2).as_service(EchoEnv, turns=3, chars=2)
run = await forge_nb.spawn(multi_turn_echo())  # the quickstart's run: groups of 8, batches of 32, lr 5e-4, 12 response tokens
run.episode_fn = multi_turn_episode(env, max_turns=3, turn_tokens=2)

# %%
rows = await run.step(STEPS)
rewards = [r["reward/mean"] for r in rows]
print(f"mean reward: first 10 steps {sum(rewards[:10]) / len(rewards[:10]):.2f}, "
      f"last 25 steps {sum(rewards[-25:]) / len(rewards[-25:]):.2f}")

# %% [markdown]
# Each episode turn by turn: the policy's action, the environment's answer, the turn's reward. The
# dashboard's explorer shows the same, and its curves include turns per episode.

# %%
%forge_episodes -n 3 --turns

# %%
run.metrics.frame()[["reward/mean", "turns/mean", "response_len/mean", "policy_age/mean"]].tail()

# %% [markdown]
# ## Tools
#
# An action can be a tool call instead of an answer to the environment: `Tools` parses it (the
# `<tool_call>{json}</tool_call>` that Qwen3's chat template writes, or `@name argument` for tiny
# models), runs the tool, and the result is the next observation. The sandboxed coder is one tool;
# `multi_turn_episode(env, tools=tools)` hands every call to it. Here one call, as a policy would write it:

# %%
from forge_nb.actors.coder import SandboxedPythonCoder
from forge_nb.envs.tools import Tools, python_tool

coder = await SandboxedPythonCoder.options(num_replicas=1).as_service(timeout_s=5.0)
tools = Tools({"python": python_tool(coder)})
call = tools.parse('<tool_call>{"name": "python", "arguments": {"code": "print(2 ** 10)"}}</tool_call>')
print(tools.format(await tools.call(call)))

# %%
await run.shutdown()
await env.shutdown()
await coder.shutdown()

# %% [markdown]
# ## On GPUs: a hub model in its chat template
#
# The same episode function trains a chat model on a real game. Its conversation is framed by the model's
# chat template (the game's messages as user turns, the guesses as the assistant's, a system prompt),
# while the actions stay the tokens the policy generated. `guess_the_number_qwen3` is the recipe:
#
# ```python
# from forge_nb.envs import TextArenaEnv
# from forge_nb.recipes import GUESS_EPISODE, guess_the_number_qwen3
#
# env = await EnvPool.options(num_replicas=2).as_service(TextArenaEnv, env_id="GuessTheNumber-v0")
# run = await forge_nb.spawn(guess_the_number_qwen3("Qwen/Qwen3-1.7B"))
# run.episode_fn = multi_turn_episode(env, **GUESS_EPISODE)
# ```
