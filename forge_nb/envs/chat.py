"""Framing: how a trajectory's text becomes the tokens the policy sees, as a chat or as raw text.

A chat model (Qwen3, Llama, ...) was trained on conversations in its chat template's shape: an
instruction-tuned policy given bare text between its turns is off its distribution. With a chat template,
a trajectory reads::

    <|im_start|>user\\n{first observation}<|im_end|>\\n<|im_start|>assistant\\n     (the prompt)
    {action 1}<|im_end|>                                                         (policy's tokens)
    \\n<|im_start|>user\\n{observation 1}<|im_end|>\\n<|im_start|>assistant\\n     (framing + observation)
    {action 2}...

(Qwen3's ChatML here; the framing is whatever the model's template renders.) The actions stay the tokens
the policy generated, never re-rendered: the template would re-format earlier turns (Qwen3's drops their
``<think>`` blocks), and then the policy would be trained on tokens it did not see. Only what comes
*after* an action is rendered, by asking the template for a conversation whose last assistant message is a
marker and keeping what follows the marker; an end-of-turn token the action already ended with is not
added twice. A tool's answer is rendered as the template's ``tool`` message (Qwen3 wraps it in
``<tool_response>``), or as a user message if the template has no tool role.

Without a chat template, with one that adds nothing around a message (the tiny local models' only
concatenates the contents), or with ``chat=False``, observations are tokenized as they are.

Considered: rendering the whole conversation with ``apply_chat_template`` at every turn (what chat APIs
do): simplest, but it re-formats earlier actions as said above, and costs a render of the whole
conversation per turn.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Framing", "after_action_ids", "render_ids"]

_MARK = "\x1fforge-nb-action\x1f"
"""Stands for an action in a rendered template; what the template puts after it frames the next message."""


class Framing:
    """Token ids for a trajectory's prompt and for the observations between its actions.

    ``chat``: None uses the tokenizer's chat template when it has one that frames messages; True requires a
    template; False tokenizes the text as it is. ``system_prompt`` opens the conversation (chat only);
    ``template_kwargs`` go to ``apply_chat_template`` (e.g. ``{"enable_thinking": False}`` for Qwen3).
    """

    def __init__(self, tokenizer: Any, *, chat: bool | None = None, system_prompt: str | None = None,
                 template_kwargs: dict[str, Any] | None = None) -> None:
        has_template = getattr(tokenizer, "chat_template", None) is not None
        if chat and not has_template:
            raise ValueError(
                f"chat=True, but the tokenizer of {getattr(tokenizer, 'name_or_path', 'the model')!r} has no chat "
                "template; use a chat model, set tokenizer.chat_template, or pass chat=False for raw text")
        if system_prompt is not None and chat is False:
            raise ValueError("system_prompt= needs chat framing (chat=None or True), not chat=False")
        self.tokenizer = tokenizer
        self.system_prompt = system_prompt
        self.template_kwargs = dict(template_kwargs or {})
        self.chat = has_template if chat is None else chat
        if chat is None and has_template and system_prompt is None:
            # a template that adds nothing around a message (the tiny models' only concatenates) has no
            # chat to frame: raw text, where tool results carry their own framing (Tools.format)
            probe = [{"role": "user", "content": "\x1e"}]
            self.chat = _render_after_action(tokenizer, probe, self.template_kwargs) != "\x1e"

    def prompt_ids(self, first: str) -> list[int]:
        """The trajectory's prompt: the first observation (as the user's message, after the system prompt)."""
        if not self.chat:
            return list(self.tokenizer(first)["input_ids"])
        messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt is not None else []
        return render_ids(self.tokenizer, [*messages, {"role": "user", "content": first}], **self.template_kwargs)

    def observation_ids(self, action_ids: list[int], observation: str, *, tool: bool = False) -> list[int]:
        """What follows an action: the end of the policy's turn, the observation (a tool's answer if
        ``tool``) as the next message, and the opening of the policy's next turn."""
        if not self.chat:
            return _ids(self.tokenizer, observation)
        message = {"role": "tool" if tool else "user", "content": observation}
        try:
            return after_action_ids(self.tokenizer, action_ids, [message], **self.template_kwargs)
        except Exception:  # a template without a tool role (jinja raises what the template raises)
            if not tool:
                raise
            return after_action_ids(self.tokenizer, action_ids, [{"role": "user", "content": observation}],
                                    **self.template_kwargs)


def after_action_ids(tokenizer: Any, action_ids: list[int], messages: list[dict[str, Any]],
                     **template_kwargs: Any) -> list[int]:
    """The token ids that follow a policy's action in its chat template: the end of its turn, ``messages``
    (user, tool or system messages) and the opening of its next turn; an end-of-turn token the action already
    ended with is not added twice. ``template_kwargs`` go to ``apply_chat_template`` (``tools=``...)."""
    text = _render_after_action(tokenizer, messages, template_kwargs)
    if action_ids and action_ids[-1] in tokenizer.all_special_ids:
        ended_with = tokenizer.decode(action_ids[-1:], skip_special_tokens=False)
        if text.startswith(ended_with):  # the policy closed its turn itself: not twice
            text = text[len(ended_with):]
    return _ids(tokenizer, text)


def _render_after_action(tokenizer: Any, messages: list[dict[str, Any]], template_kwargs: dict[str, Any]) -> str:
    text = _render(tokenizer, [{"role": "user", "content": "?"}, {"role": "assistant", "content": _MARK}, *messages],
                   template_kwargs)
    if _MARK not in text:
        raise ValueError("the chat template does not render an assistant message's content as it is; "
                         "pass chat=False to multi_turn_episode for raw text")
    return text[text.rindex(_MARK) + len(_MARK):]


def render_ids(tokenizer: Any, messages: list[dict[str, Any]], **template_kwargs: Any) -> list[int]:
    """A whole conversation's token ids in the chat template, opening the assistant's turn."""
    return _ids(tokenizer, _render(tokenizer, messages, template_kwargs))


def _render(tokenizer: Any, messages: list[dict[str, Any]], template_kwargs: dict[str, Any]) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **template_kwargs)


def _ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])
