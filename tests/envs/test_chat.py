"""Framing: a multi-turn trajectory in the chat template's shape, with the policy's own tokens kept as they are.

The tokenizers are built here (no hub): the tiny model's character tokenizer, and the same one with
ChatML's two special tokens and a ChatML template with a tool role (the shape of Qwen's templates).
"""

from __future__ import annotations

import string
from typing import Any

import pytest
from transformers import AutoTokenizer

from forge_nb.envs.chat import Framing
from forge_nb.models import TinyModelConfig, build_tiny_model

CHATML = (
    "{% for m in messages %}"
    "{% if m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)
NO_TOOL_ROLE = ("{% for m in messages %}{% if m.role not in ('system', 'user', 'assistant') %}"
                "{{ raise_exception('unknown role ' + m.role) }}{% endif %}"
                "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Any:
    alphabet = "".join(c for c in string.printable if c not in "\t\r\x0b\x0c")
    path = build_tiny_model(tmp_path_factory.mktemp("chat") / "tiny", TinyModelConfig(alphabet=alphabet))
    return AutoTokenizer.from_pretrained(path)


def chatml(tiny: Any, template: str = CHATML) -> Any:
    tokenizer = AutoTokenizer.from_pretrained(tiny.name_or_path)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tokenizer.chat_template = template
    return tokenizer


def text(tokenizer: Any, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=False)


def test_a_conversation_of_generated_actions_reads_as_the_template_renders_it(tiny: Any) -> None:
    tok = chatml(tiny)
    framing = Framing(tok, system_prompt="Be brief.")
    assert framing.chat
    end = tok.convert_tokens_to_ids("<|im_end|>")
    prompt = framing.prompt_ids("Guess a number.")
    # the policy's actions as the engine returns them: one closed with <|im_end|>, one cut by max_tokens
    first = tok("50", add_special_tokens=False)["input_ids"] + [end]
    second = tok("75", add_special_tokens=False)["input_ids"]
    ids = prompt + first + framing.observation_ids(first, "higher") + second + framing.observation_ids(second, "lower")
    conversation = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Guess a number."},
                    {"role": "assistant", "content": "50"}, {"role": "user", "content": "higher"},
                    {"role": "assistant", "content": "75"}, {"role": "user", "content": "lower"}]
    assert text(tok, ids) == tok.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    assert text(tok, framing.observation_ids(first, "higher")).startswith("\n<|im_start|>user\n")  # not a 2nd end
    assert text(tok, framing.observation_ids(second, "lower")).startswith("<|im_end|>\n<|im_start|>user\n")
    rendered = tok.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    assert ids == tok(rendered, add_special_tokens=False)["input_ids"] and ids.count(end) == 6  # tokens, not text


def test_tool_answers_template_kwargs_and_actions_are_kept_as_generated(tiny: Any) -> None:
    tok = chatml(tiny)
    framing = Framing(tok, template_kwargs={"enable_thinking": False})
    assert text(tok, framing.prompt_ids("hi")).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    action = tok("<think>a</think>", add_special_tokens=False)["input_ids"]  # never re-rendered, so kept
    after = text(tok, framing.observation_ids(action, "1024", tool=True))
    assert after.startswith("<|im_end|>\n<|im_start|>user\n<tool_response>\n1024\n</tool_response><|im_end|>\n")
    # a template without a tool role: the answer comes as a user message
    plain = Framing(chatml(tiny, NO_TOOL_ROLE))
    assert text(tok, plain.observation_ids(action, "1024", tool=True)) == \
        "<|im_end|>\n<|im_start|>user\n1024<|im_end|>\n<|im_start|>assistant\n"
    with pytest.raises(Exception, match="unknown role"):  # only a tool's answer falls back
        Framing(chatml(tiny, NO_TOOL_ROLE.replace("'user', ", ""))).observation_ids(action, "x")


def test_a_template_that_only_concatenates_is_raw_text(tiny: Any) -> None:
    """The tiny models' template adds nothing around a message: their trajectories are the text as it is."""
    framing = Framing(tiny)
    assert tiny.chat_template is not None and not framing.chat
    action = tiny("ab", add_special_tokens=False)["input_ids"] + [tiny.eos_token_id]
    assert framing.prompt_ids("hello\n") == tiny("hello\n")["input_ids"]
    assert framing.observation_ids(action, "\ncd\n") == tiny("\ncd\n", add_special_tokens=False)["input_ids"]
    assert Framing(chatml(tiny), chat=False).observation_ids(action, "x") == tiny("x")["input_ids"]


def test_framing_refuses_what_it_cannot_do(tiny: Any) -> None:
    bare = AutoTokenizer.from_pretrained(tiny.name_or_path)
    bare.chat_template = None
    with pytest.raises(ValueError, match="has no chat template.*chat=False"):
        Framing(bare, chat=True)
    with pytest.raises(ValueError, match="system_prompt= needs chat framing"):
        Framing(chatml(tiny), chat=False, system_prompt="x")
    assert not Framing(bare).chat
    dropping = chatml(tiny, CHATML.replace("{{ m.content }}<|im_end|>", "{{ m.content[:3] }}<|im_end|>"))
    with pytest.raises(ValueError, match="chat=False"):
        Framing(dropping, chat=True).observation_ids([], "x")
