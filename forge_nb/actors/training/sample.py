"""Completions sampled from the trainer's own policy: a run's rollouts while its generators start.

A run's generators take seconds longer to come up than its trainer (vLLM's import and the engine's build: the
quickstart's longest chain from launch to its first step). Until they serve, the trainer answers the run's
``policy.generate.route`` itself (``forge_nb.controller.lifecycle.stand_in``) with what :func:`generate` samples: the
:class:`~forge_nb.rl.types.Completions` a Generator returns, so that no episode function, loss or buffer can tell
them apart.

Sampled as the Generator has vLLM sample: the prompt tokenized by the model's tokenizer (the one vLLM loads:
``AutoTokenizer``, special tokens added as vLLM's completions add them), ``n`` samples of at most ``max_tokens``
tokens, the logits divided by the temperature, then top-k, then top-p (temperature below 1e-5: greedy, as in vLLM);
a sample stops at the model's EOS token (the tokenizer's and ``generation_config.json``'s, unless ``ignore_eos``) or
a ``stop_token_ids`` entry, which stays in its tokens and out of its text; each token's logprob is of the
distribution it was drawn from (vLLM's ``processed_logprobs``, the Generator's setting); the text is decoded as the
Generator decodes it (``engine.worker.response_text``). Other sampling parameters (stop strings, penalties, top
logprobs...: anything not in ``SAMPLED_HERE``) are a ValueError here: the stand-in sends those calls to the
generators instead.

One forward a token for the whole call (every prompt's ``n`` samples, left-padded), on the model's KV cache with
the transformers engine (the CPU's); torchtitan's model has none, so it runs the whole sequence each token. The
draws come from a random generator of the trainer's own, seeded from the training seed: the trainer's global
random state stays as training leaves it.

Considered: transformers' ``generate``. Its sampling defaults come from the model's generation config (top-k 50
unless set), it draws from torch's global generator, and the processed logprobs of the sampled tokens need extra
outputs gathered and re-normalized per step: matching vLLM through its options took more code than the loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from forge_nb.actors.training.policy_model import read_generation_config
from forge_nb.rl.completion import WireCompletion
from forge_nb.rl.types import Completions

__all__ = ["SAMPLED_HERE", "Sampler", "generate", "not_sampled_here"]

#: vLLM sampling parameters the trainer honours; a call with any other goes to the generators.
SAMPLED_HERE = frozenset({"n", "temperature", "top_p", "top_k", "max_tokens", "stop_token_ids", "ignore_eos", "seed",
                          "logprobs"})
_GREEDY = 1e-5  # vLLM's _SAMPLING_EPS: a temperature below it samples greedily


def not_sampled_here(values: dict[str, Any]) -> list[str]:
    """The sampling parameters of ``values`` the trainer cannot honour (``logprobs`` only as 0 or None)."""
    bad = sorted(set(values) - SAMPLED_HERE)
    return bad + (["logprobs"] if values.get("logprobs") not in (None, 0) else [])


@dataclass
class Sampler:
    """What a trainer samples with: the model's tokenizer (and its ``tokenizers`` core, to decode as the Generator
    does), its EOS tokens, and a random generator of its own."""

    tokenizer: Any
    fast: Any  # tokenizers.Tokenizer, or None for a slow tokenizer
    eos: frozenset[int]
    rng: torch.Generator

    @classmethod
    def load(cls, path: str, seed: int, device: torch.device) -> Sampler:
        from transformers import AutoTokenizer

        from forge_nb.actors.engine.worker import fast_tokenizer

        tokenizer = AutoTokenizer.from_pretrained(path)
        found = read_generation_config(path).get("eos_token_id")  # vLLM adds these to every request's stop tokens
        eos = ({tokenizer.eos_token_id} | set(found if isinstance(found, list) else [found])) - {None}
        return cls(tokenizer, fast_tokenizer(tokenizer), frozenset(eos), torch.Generator(device).manual_seed(seed))


def generate(trainer: Any, prompts: list[Any], values: dict[str, Any]) -> list[Completions]:
    """Each prompt's ``n`` completions from the trainer's policy as it is now (``RLTrainer.generate_many``); their
    ``generator_version`` is the trainer's step (the version its next push will carry)."""
    if bad := not_sampled_here(values):
        raise ValueError(f"the trainer samples with {sorted(SAMPLED_HERE)}, not {bad}: the generators serve such calls")
    _check(values)
    policy = trainer._policy()
    if policy.sharded:
        raise ValueError("generate: the policy is sharded over the trainer's procs; the generators sample it")
    if trainer.sampler is None:
        trainer.sampler = Sampler.load(policy.path, trainer.train_cfg.seed, policy.device)
    sampler: Sampler = trainer.sampler
    ids = [_prompt_ids(sampler, p) for p in prompts]
    n = int(values.get("n") or 1)
    rows = [p for p in ids for _ in range(n)]
    with trainer._adapter(), torch.no_grad(), trainer._autocast():
        tokens, logprobs, stopped = _sample(policy, sampler, rows, values)
    out = []
    for i, prompt in enumerate(prompts):
        group = Completions()
        for j in range(i * n, (i + 1) * n):
            text = _text(sampler, rows[j], tokens[j], stopped[j])
            group.append(WireCompletion(
                prompt=prompt if isinstance(prompt, str) else None, text=text, prompt_ids=rows[j], token_ids=tokens[j],
                logprobs=logprobs[j], stop_reason="stop" if stopped[j] else "length", generator_version=trainer.step,
                metadata={"served_by": "trainer", "stop": None}))
        out.append(group)
    return out


def _check(values: dict[str, Any]) -> None:
    """The values vLLM's ``SamplingParams`` refuses, refused here too (a hot change is tried on the policy first)."""
    for name, low in {"n": 1, "temperature": 0, "top_k": -1, "max_tokens": 1}.items():
        if values.get(name) is not None and values[name] < low:
            raise ValueError(f"{name} must be at least {low}, got {values[name]}.")
    if values.get("top_p") is not None and not 0 < values["top_p"] <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {values['top_p']}.")


def _prompt_ids(sampler: Sampler, prompt: Any) -> list[int]:
    if isinstance(prompt, torch.Tensor):
        prompt = prompt.tolist()
    if isinstance(prompt, str):
        return list(sampler.tokenizer.encode(prompt))
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return prompt
    raise TypeError(f"generate() takes a string or token ids (a non-empty list of ints), got {type(prompt).__name__}")


def _sample(policy: Any, sampler: Sampler, rows: list[list[int]],
            values: dict[str, Any]) -> tuple[list[list[int]], list[list[float]], list[bool]]:
    """Every row's sampled tokens, their logprobs, and whether it stopped (else it ran out of ``max_tokens``)."""
    max_tokens = int(values.get("max_tokens") or 16)  # vLLM's default
    stop = set(values.get("stop_token_ids") or []) | (set() if values.get("ignore_eos") else sampler.eos)
    rng = sampler.rng if values.get("seed") is None else torch.Generator(policy.device).manual_seed(values["seed"])
    width, pad = max(map(len, rows)), policy.pad_id or 0
    tokens = torch.tensor([[pad] * (width - len(r)) + r for r in rows], device=policy.device)
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=policy.device)
    cached = policy.engine == "transformers"
    past, step_in = None, tokens
    out: list[list[int]] = [[] for _ in rows]
    logps: list[list[float]] = [[] for _ in rows]
    done = [False] * len(rows)
    for _ in range(max_tokens):
        positions = (mask.cumsum(1) - 1).clamp(min=0)
        if cached:
            result = policy.module(input_ids=step_in, attention_mask=mask, past_key_values=past, use_cache=True,
                                   position_ids=positions[:, -step_in.shape[1]:])
            past, logits = result.past_key_values, result.logits[:, -1].float()
        else:
            logits = policy.logits(tokens, attention_mask=mask)[:, -1].float()
        picked, logp = _pick(logits, values, rng)
        for i, (token, lp) in enumerate(zip(picked.tolist(), logp.tolist(), strict=True)):
            if not done[i]:
                out[i].append(token)
                logps[i].append(lp)
                done[i] = token in stop
        if all(done):
            break
        step_in = picked[:, None]
        tokens = torch.cat([tokens, step_in], 1)
        mask = torch.cat([mask, torch.ones_like(step_in)], 1)
    return out, logps, [bool(o) and o[-1] in stop for o in out]


def _pick(logits: torch.Tensor, values: dict[str, Any], rng: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """One token a row, and its logprob under the distribution it was drawn from (vLLM's order: temperature,
    top-k, top-p)."""
    temperature = float(values.get("temperature", 1.0))
    if temperature < _GREEDY:
        token = logits.argmax(-1)
        return token, torch.log_softmax(logits, -1).gather(-1, token[:, None])[:, 0]
    logits = logits / temperature
    top_k = int(values.get("top_k") or 0)
    if 0 < top_k < logits.shape[-1]:
        kth = logits.topk(top_k, -1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    top_p = float(values.get("top_p", 1.0))
    if top_p < 1.0:
        ordered, order = logits.sort(-1, descending=True)
        probs = ordered.softmax(-1)
        beyond = probs.cumsum(-1) - probs > top_p  # the mass before these already reaches top_p
        logits = logits.masked_fill(torch.zeros_like(beyond).scatter(-1, order, beyond), float("-inf"))
    logp = torch.log_softmax(logits, -1)
    token = torch.multinomial(logp.exp(), 1, generator=rng)[:, 0]
    return token, logp.gather(-1, token[:, None])[:, 0]


def _text(sampler: Sampler, prompt_ids: list[int], token_ids: list[int], stopped: bool) -> str:
    from forge_nb.actors.engine.worker import response_text

    if sampler.fast is not None:
        return response_text(sampler.fast, prompt_ids, token_ids, stop_terminated=stopped)
    return sampler.tokenizer.decode(token_ids[:-1] if stopped else token_ids, skip_special_tokens=True)
