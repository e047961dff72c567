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
# # Agents train too: your agent code, through an OpenAI client
#
# Agent code usually talks to a model through an OpenAI client and runs its own loop: it sends messages and
# tool schemas, runs the tools the model calls, and decides when the task is done. forge_nb trains such code as
# it is. `%forge_serve` puts an OpenAI-compatible endpoint in front of the run's policy service (on 127.0.0.1,
# behind a token), and `agent_episode(agent)` runs your `async def agent(client, sample) -> reward` for each
# member of a GRPO group, with a client bound to that trajectory. Every call is recorded as the exact token
# ids the policy saw and sampled, so the trainer learns from the policy's own tokens: the prompt, your
# messages and the tools' answers are context, never re-tokenised.
#
# The task here is small enough for the tiny CPU model to learn from scratch in a few minutes: the user asks
# "?", and the answer is a key only a tool knows. The policy has to call the tool (`@k`, the simple syntax a
# character-level model can write) and then answer with what the tool said. The recipe keeps a small KL term
# toward the untrained model (a `ReferenceModel` service computes it): without it, some runs reached a policy
# whose samples had all become alike (every one `@@`, no call) and learned nothing more.

# %% tags=["parameters"]
STEPS = 300

# %%
%load_ext forge_nb
import forge_nb
from forge_nb.agents import agent_episode
from forge_nb.recipes.agents import KEY_LETTERS, KEY_TOOLS, agent_keys

run = await forge_nb.spawn(agent_keys())  # the tiny model, groups of 8, batches of 32, a KL term (beta 0.02)

# %% [markdown]
# The run's policy as an OpenAI endpoint; `endpoint` holds it (`endpoint.url`, `endpoint.token`, `endpoint.client()`).

# %%
%forge_serve --tool-parser simple

# %% [markdown]
# The agent: plain Python against `openai.AsyncOpenAI`. It offers the tool, runs it when the policy calls it,
# hands back its answer and asks again. Its reward: 0.7 for the right key read from the tool `k` (a guess
# without it earns nothing), and three format rewards (as GRPO recipes give for `<think>` tags) of 0.1 each:
# for calling a tool, for calling `k`, and for then answering with a letter that could be a key. Written as a
# plain `def agent(client, sample)` with `client.chat.completions.create(...)` (no `await`), the same code gets
# a synchronous `openai.OpenAI` and runs in a thread, off the kernel's loop that answers it.

# %%
KEY_TOOLS


# %%
async def agent(client, sample):
    key = sample["target"]  # what the tool knows
    messages = [{"role": "user", "content": sample["request"]}]
    reply = await client.chat.completions.create(model=client.model, messages=messages, tools=KEY_TOOLS, max_tokens=2)
    message = reply.choices[0].message
    asked = [call.function.name for call in message.tool_calls or []]
    if asked:  # run the tool, hand its answer back, ask again
        messages.append(message)
        messages += [{"role": "tool", "tool_call_id": call.id, "content": key if call.function.name == "k" else "?"}
                     for call in message.tool_calls]
        reply = await client.chat.completions.create(model=client.model, messages=messages, max_tokens=len(key))
        message = reply.choices[0].message
    answer = message.content or ""
    shaped = bool(asked) and len(answer) == len(key) and set(answer) <= set(KEY_LETTERS)  # a key-like answer
    read = "k" in asked  # a right answer without the key's tool is a guess
    return 0.7 * (read and answer == key) + 0.1 * shaped + 0.1 * bool(asked) + 0.1 * read


run.episode_fn = agent_episode(agent)

# %%
rows = await run.step(STEPS)
rewards = [r["reward/mean"] for r in rows]
print(f"mean reward: first 10 steps {sum(rewards[:10]) / len(rewards[:10]):.2f}, "
      f"last 25 steps {sum(rewards[-25:]) / len(rewards[-25:]):.2f}")

# %% [markdown]
# Each episode turn by turn: the policy's action, what answered it (the tool `k`, or the agent) and the
# trajectory's reward. The dashboard's explorer shows the same, and `%forge_status` the endpoint.

# %%
%forge_episodes -n 3 --turns

# %%
run.metrics.frame()[["reward/mean", "turns/mean", "tools/calls", "tools/success"]].tail()

# %% [markdown]
# The endpoint serves any OpenAI client, not only agent_episode's: here one call, outside any trajectory
# (nothing recorded), with the trained policy answering greedily.

# %%
client = endpoint.client()
reply = await client.chat.completions.create(model=client.model, messages=[{"role": "user", "content": "?"}],
                                             tools=KEY_TOOLS, max_tokens=2, temperature=0)
print(reply.choices[0].finish_reason, [(c.function.name, c.function.arguments) for c in reply.choices[0].message.tool_calls or []],
      reply.system_fingerprint)

# %%
await run.shutdown()

# %% [markdown]
# ## verifiers environments
#
# Environments that own their rollout loop and call the model through an OpenAI client train the same way.
# `verifiers_episode(env)` runs one [verifiers](https://github.com/PrimeIntellect-ai/verifiers) rollout per
# trajectory against the run's endpoint and trains on its reward (`pip install 'forge_nb[envs]'`):
#
# ```python
# import verifiers.v1 as vf
# from forge_nb.agents.verifiers_env import local_env, verifiers_episode
#
# env = local_env(MyTaskset)                  # a vf.Taskset defined in a cell, played in this process
# run.episode_fn = verifiers_episode(env)     # tools: Tools({"python": python_tool(coder)}) or its MCP toolsets
# ```
#
# ## On GPUs: a chat model and its own tool-call format
#
# Qwen3 writes tool calls as `<tool_call>{json}</tool_call>`, the endpoint's default parser (`hermes`), and the
# conversation is rendered with its chat template (`chat_template_kwargs={"enable_thinking": False}` turns its
# thinking off):
#
# ```python
# run = await forge_nb.spawn(forge_nb.quickstart(model="Qwen/Qwen3-1.7B", ...))
# endpoint = await run.serve_openai(chat_template_kwargs={"enable_thinking": False})
# run.episode_fn = agent_episode(my_agent)
# ```
