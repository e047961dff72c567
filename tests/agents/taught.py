"""A tiny model taught, in a few seconds of plain transformers training, to say given things after given prompts.

The endpoint's tests need answers they can predict (a tool call, a final answer): a randomly initialised
tiny model writes noise. This trains the locally built model (``forge_nb.models.build_tiny_model``) on a few
whole sequences until greedy decoding reproduces them, and writes it back; vLLM then serves a real model
whose greedy answers are known.
"""

from __future__ import annotations

import string
from pathlib import Path

import torch

from forge_nb.models import TinyModelConfig, build_tiny_model

_BASE = TinyModelConfig().alphabet
#: every printable character (JSON, prose), the default alphabet first so that its letters keep their ids
WIDE = TinyModelConfig(alphabet=_BASE + "".join(c for c in string.printable if c not in _BASE),
                       max_position_embeddings=1024)


def teach(path: Path, sequences: list[tuple[str, str]], *, steps: int = 300, lr: float = 3e-3) -> Path:
    """Build the wide tiny model at ``path`` and train it so that each ``prompt`` is followed by ``answer``
    and ``<eos>`` (the loss on the answers only). Returns ``path``."""
    from transformers import AutoTokenizer, Qwen3ForCausalLM

    build_tiny_model(path, WIDE)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = Qwen3ForCausalLM.from_pretrained(path, torch_dtype=torch.float32)
    rows, labels = [], []
    for prompt, answer in sequences:
        p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        a = tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        rows.append(torch.tensor(p + a))
        labels.append(torch.tensor([-100] * len(p) + a))
    tokens = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=tokenizer.pad_token_id)
    targets = torch.nn.utils.rnn.pad_sequence(labels, batch_first=True, padding_value=-100)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        loss = model(input_ids=tokens, labels=targets).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.save_pretrained(path)
    assert loss.item() < 0.05, f"the tiny model did not learn its lines (loss {loss.item():.3f})"
    return path
