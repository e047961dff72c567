"""The endpoint's answers, built from the ``openai`` package's own response types and dumped to JSON.

Whole answers (``chat``, ``completion``) and their streamed form (``chat_chunks``, ``completion_chunks``: a
role chunk, one chunk per choice with its text, tool calls and logprobs, a closing chunk per choice with its
finish reason, and the usage when ``stream_options.include_usage`` asks for it). See
:mod:`forge_nb.agents.protocol` for the fields and their extensions.
"""

from __future__ import annotations

from typing import Any

from openai.types import Completion as TextCompletion
from openai.types import CompletionChoice, CompletionUsage, Model
from openai.types.chat import ChatCompletion, ChatCompletionChunk, ChatCompletionTokenLogprob

from forge_nb.agents.conversation import ParsedAnswer
from forge_nb.agents.protocol import new_id, now
from forge_nb.rl.types import Completion

__all__ = ["chat", "chat_chunks", "completion", "completion_chunks", "models"]


def models(name: str, root: str | None, version: int) -> dict[str, Any]:
    """``GET /v1/models``: the one served model, with the weight version its generators hold now."""
    model = Model(id=name, created=now(), object="model", owned_by="forge_nb", root=root, weight_version=version)
    return {"object": "list", "data": [model.model_dump(mode="json")]}


def _finish(choice: Completion, answer: ParsedAnswer | None = None) -> str:
    if answer is not None and answer.tool_calls:
        return "tool_calls"
    return "length" if choice.stop_reason == "length" else "stop"


def _usage(prompt: list[int], choices: list[Completion]) -> CompletionUsage:
    generated = sum(len(c.token_ids) for c in choices)
    return CompletionUsage(prompt_tokens=len(prompt), completion_tokens=generated,
                           total_tokens=len(prompt) + generated)


def _fingerprint(choices: list[Completion]) -> str:
    versions = {c.generator_version for c in choices}
    return f"forge_nb-v{min(v for v in versions if v is not None)}" if versions - {None} else "forge_nb"


def _token_logprobs(choice: Completion, tokenizer: Any, top: int) -> list[ChatCompletionTokenLogprob]:
    ids = choice.token_ids.tolist()
    values = choice.logprobs.tolist() if choice.logprobs is not None else [0.0] * len(ids)
    alternatives = (choice.metadata or {}).get("top_logprobs") or [[] for _ in ids]
    out = []
    for token, logprob, alts in zip(ids, values, alternatives, strict=False):
        text = tokenizer.decode([token])
        out.append(ChatCompletionTokenLogprob(
            token=text, logprob=logprob, bytes=list(text.encode()),
            top_logprobs=[{"token": (t := tokenizer.decode([alt])), "logprob": lp, "bytes": list(t.encode())}
                          for alt, lp in alts[:top]]))
    return out


def chat(name: str, prompt: list[int], choices: list[Completion], answers: list[ParsedAnswer], tokenizer: Any,
         req: Any) -> dict[str, Any]:
    """``POST /v1/chat/completions``: one ``ChatCompletion``."""
    items = []
    for i, (choice, answer) in enumerate(zip(choices, answers, strict=True)):
        logprobs = ({"content": _token_logprobs(choice, tokenizer, req.top_logprob_count), "refusal": None}
                    if req.logprobs else None)
        extra = {"token_ids": choice.token_ids.tolist()} if req.return_token_ids else {}
        items.append({"index": i, "finish_reason": _finish(choice, answer), "logprobs": logprobs,
                      "message": {"role": "assistant", "content": answer.content,
                                  "tool_calls": answer.tool_calls or None}, **extra})
    extra = {"prompt_token_ids": prompt} if req.return_token_ids else {}
    body = ChatCompletion(id=new_id("chatcmpl"), object="chat.completion", created=now(), model=name,
                          choices=items, usage=_usage(prompt, choices), system_fingerprint=_fingerprint(choices),
                          **extra)
    return body.model_dump(mode="json", exclude_unset=True)


def chat_chunks(body: dict[str, Any], req: Any) -> list[dict[str, Any]]:
    """A whole chat answer as the chunks of a stream (each a ``ChatCompletionChunk``)."""
    head = {"id": body["id"], "object": "chat.completion.chunk", "created": body["created"], "model": body["model"],
            "system_fingerprint": body.get("system_fingerprint")}
    chunks = []
    for choice in body["choices"]:
        message, i = choice["message"], choice["index"]
        chunks.append({**head, "choices": [{"index": i, "delta": {"role": "assistant", "content": ""},
                                            "finish_reason": None}]})
        delta: dict[str, Any] = {"content": message["content"]}
        if message.get("tool_calls"):
            delta["tool_calls"] = [{"index": k, **call} for k, call in enumerate(message["tool_calls"])]
        chunks.append({**head, "choices": [{"index": i, "delta": delta, "logprobs": choice.get("logprobs"),
                                            "finish_reason": None}]})
        chunks.append({**head, "choices": [{"index": i, "delta": {}, "finish_reason": choice["finish_reason"]}]})
    if req.include_usage:
        chunks.append({**head, "choices": [], "usage": body["usage"]})
    return [ChatCompletionChunk.model_validate(c).model_dump(mode="json", exclude_unset=True) for c in chunks]


def completion(name: str, prompt: list[int], choices: list[Completion], tokenizer: Any, req: Any) -> dict[str, Any]:
    """``POST /v1/completions``: one text ``Completion``."""
    items = []
    for i, choice in enumerate(choices):
        logprobs = None
        if req.logprobs is not None:
            tokens = _token_logprobs(choice, tokenizer, req.top_logprob_count)
            offsets, at = [], 0
            for t in tokens:
                offsets.append(at)
                at += len(t.token)
            logprobs = {"tokens": [t.token for t in tokens], "token_logprobs": [t.logprob for t in tokens],
                        "top_logprobs": [{a.token: a.logprob for a in t.top_logprobs} for t in tokens],
                        "text_offset": offsets}
        extra = {"token_ids": choice.token_ids.tolist()} if req.return_token_ids else {}
        items.append(CompletionChoice(index=i, text=choice.text, finish_reason=_finish(choice), logprobs=logprobs,
                                      **extra))
    extra = {"prompt_token_ids": prompt} if req.return_token_ids else {}
    body = TextCompletion(id=new_id("cmpl"), object="text_completion", created=now(), model=name, choices=items,
                          usage=_usage(prompt, choices), system_fingerprint=_fingerprint(choices), **extra)
    return body.model_dump(mode="json", exclude_unset=True)


def completion_chunks(body: dict[str, Any], req: Any) -> list[dict[str, Any]]:
    """A whole text completion as the chunks of a stream."""
    head = {k: body[k] for k in ("id", "object", "created", "model")}
    chunks = [{**head, "choices": [{**choice, "finish_reason": None}]} for choice in body["choices"]]
    chunks += [{**head, "choices": [{"index": c["index"], "text": "", "finish_reason": c["finish_reason"]}]}
               for c in body["choices"]]
    if req.include_usage:
        chunks.append({**head, "choices": [], "usage": body["usage"]})
    return chunks
