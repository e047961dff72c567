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
# # The Tinker API on a live run
#
# Code written against the `tinker` SDK trains on forge_nb: the run below serves the Tinker API, and the cells
# after it are tinker-cookbook's first RL loop (sample a group per prompt, center the rewards, train on the
# samples with `importance_sampling`, publish the weights), written against the SDK as it is. Each training client
# is a LoRA run of its own on the served run's base model, so the dashboard draws its steps; the served run keeps
# training with its own loops meanwhile, on the same generator and trainer processes.
#
# In a notebook, `await` the SDK's calls: the server hands the work to the kernel's event loop, which a cell
# blocked on `.result()` would hold. (Scripts and the cookbook's `main` run as they are in a thread:
# `await asyncio.to_thread(asyncio.run, main(config))`.)

# %% tags=["parameters"]
STEPS = 40  # iterations of the Tinker loop below

# %%
%load_ext forge_nb
import asyncio

import tinker
from tinker import types

# %%
%forge_spawn quickstart --name served --lora 8
%forge_serve --tinker

# %% [markdown]
# The served run trains its own adapter in the background, with its own loops, while Tinker's calls train another.

# %%
run.start()
service = tinker.ServiceClient(base_url=tinker_server.url, api_key=tinker_server.token)
training = await service.create_lora_training_client(base_model=tinker_server.base_model, rank=8)
tokenizer = training.get_tokenizer()
client_run = tinker_server.models[training.model_id].run
print(f"training client {training.model_id} is run {client_run.name!r} on the base of {run.name!r}:",
      client_run.base.runs)

# %%
%forge_dashboard --name {client_run.name}

# %% [markdown]
# The task is the quickstart's: answer a letter with the letter four times ("c" -> "cccc"). The reward is the share
# of characters right.

# %%
LETTERS = "abcdefgh"
GROUP, LR = 8, 2e-3
params = types.SamplingParams(max_tokens=4, temperature=1.0, stop=[tokenizer.eos_token_id])


def reward(letter: str, tokens: list[int]) -> float:
    answer = tokenizer.decode(tokens, skip_special_tokens=True)
    return sum(a == letter for a in answer[:4]) / 4


async def one_iteration(i: int) -> float:
    sampler = await training.save_weights_and_get_sampling_client()
    prompts = [LETTERS[(i * 4 + k) % len(LETTERS)] for k in range(4)]
    groups = await asyncio.gather(*(sampler.sample(types.ModelInput.from_ints(tokenizer.encode(p)), GROUP, params)
                                    for p in prompts))
    datums, rewards = [], []
    for letter, group in zip(prompts, groups):
        scores = [reward(letter, seq.tokens) for seq in group.sequences]
        mean = sum(scores) / len(scores)
        rewards += scores
        prompt = tokenizer.encode(letter)
        for seq, score in zip(group.sequences, scores):
            tokens = prompt + seq.tokens
            n_prompt = len(prompt) - 1
            datums.append(types.Datum(
                model_input=types.ModelInput.from_ints(tokens[:-1]),
                loss_fn_inputs={"target_tokens": tokens[1:],
                                "logprobs": [0.0] * n_prompt + seq.logprobs,
                                "advantages": [0.0] * n_prompt + [score - mean] * len(seq.tokens)}))
    await training.forward_backward(datums, "importance_sampling")
    await training.optim_step(types.AdamParams(learning_rate=LR))
    return sum(rewards) / len(rewards)


curve = []
for i in range(STEPS):
    curve.append(await one_iteration(i))
    if i % 10 == 0 or i == STEPS - 1:
        print(f"iteration {i}: reward {curve[-1]:.2f}")

# %% [markdown]
# Both runs trained on one base: the served run with its own loops, the Tinker client with the calls above. The
# client's steps are rows of its run (`source/tinker`), its samples are in its rollout explorer.

# %%
first, last = sum(curve[:5]) / len(curve[:5]), sum(curve[-5:]) / len(curve[-5:])
print(f"Tinker loop: reward {first:.2f} over the first iterations, {last:.2f} over the last; "
      f"{len(client_run.metrics.rows)} step rows on run {client_run.name!r}")
run.pause()
print(f"served run {run.name!r}: step {run.current_step}, ledger balanced: {run.ledger()['balanced']}")
%forge_status

# %%
await run.shutdown()
