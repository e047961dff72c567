"""The OpenAI wire format the endpoint speaks: requests checked by pydantic, answers in the ``openai`` package's types.

Requests are parsed into :class:`ChatRequest` and :class:`CompletionRequest` (pydantic models of the fields
the endpoint honours); answers are built from ``openai.types`` (``ChatCompletion``, ``ChatCompletionChunk``,
``Completion``, ``Model``), the very classes the ``openai`` client parses them back into, so the shapes cannot
drift from what clients expect. Unknown request fields are ignored, as vLLM's server does (clients and
libraries send extensions such as ``return_token_ids`` in ``extra_body``); a field with a wrong value is a 400
that names it.

Honoured: ``model``, ``messages``/``prompt``, ``n``, ``temperature``, ``top_p``, ``max_tokens`` /
``max_completion_tokens``, ``stop``, ``seed``, ``presence_penalty``, ``frequency_penalty``, ``logprobs`` and
``top_logprobs``, ``tools``/``tool_choice`` (``none``, ``auto``, ``required`` or a named function: the model is
asked through its chat template's tools; what it writes is parsed back into ``tool_calls``), ``stream`` and
``stream_options.include_usage``; vLLM's extensions ``top_k``, ``min_p``, ``repetition_penalty``, ``min_tokens``,
``ignore_eos``, ``chat_template_kwargs`` and ``return_token_ids`` (the answer then carries ``prompt_token_ids`` and each
choice's ``token_ids``). The weight version that produced an answer is its ``system_fingerprint``
(``forge_nb-v<version>``), OpenAI's field for "the backend configuration the model runs with".

Considered: vLLM's own protocol classes (``vllm.entrypoints.openai.chat_completion.protocol``). They are the
most complete, but importing them brings vLLM into the kernel: 7.7 s and 670 MB measured here, and a line on
the cell's stderr; the generator actors already hold vLLM.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = ["ApiError", "ChatRequest", "CompletionRequest", "error_body"]

Role = Literal["system", "developer", "user", "assistant", "tool", "function"]


class ApiError(Exception):
    """An error answered in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 kind: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.kind = kind or {400: "invalid_request_error", 401: "invalid_request_error",
                             404: "invalid_request_error"}.get(status, "server_error")

    def body(self) -> dict[str, Any]:
        return error_body(self.message, kind=self.kind, param=self.param, code=self.code)


def error_body(message: str, *, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str
    n: int = Field(1, ge=1, le=128)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    max_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    # vLLM's extensions
    top_k: int | None = None
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(None, gt=0.0)
    min_tokens: int | None = Field(None, ge=0)
    ignore_eos: bool | None = None
    return_token_ids: bool = False

    @property
    def include_usage(self) -> bool:
        return bool((self.stream_options or {}).get("include_usage"))

    def sampling(self, max_tokens: int) -> dict[str, Any]:
        """The Generator's sampling overrides for this request (what it left out, the run decides)."""
        values = {"n": self.n, "max_tokens": max_tokens, "logprobs": self.top_logprob_count}
        for name in ("temperature", "top_p", "seed", "presence_penalty", "frequency_penalty", "top_k", "min_p",
                     "repetition_penalty", "min_tokens", "ignore_eos"):
            if getattr(self, name) is not None:
                values[name] = getattr(self, name)
        if self.stop is not None:
            values["stop"] = [self.stop] if isinstance(self.stop, str) else list(self.stop)
        return values

    @property
    def top_logprob_count(self) -> int:
        return 0


class ChatRequest(_Request):
    """``POST /v1/chat/completions``."""

    messages: list[dict[str, Any]] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    @field_validator("messages")
    @classmethod
    def _messages(cls, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for i, message in enumerate(messages):
            role = message.get("role")
            if role not in Role.__args__:  # type: ignore[attr-defined]
                raise ValueError(f"messages[{i}].role is {role!r}; use one of {list(Role.__args__)}")  # type: ignore
            content = message.get("content")
            if content is not None and not isinstance(content, str | list):
                raise ValueError(f"messages[{i}].content must be a string or a list of text parts")
            if isinstance(content, list):
                kinds = {part.get("type") for part in content if isinstance(part, dict)}
                if kinds - {"text"} or not all(isinstance(p, dict) for p in content):
                    raise ValueError(f"messages[{i}].content: only text parts are supported (got {sorted(kinds)}); "
                                     "the policy reads text")
        return messages

    @field_validator("tools")
    @classmethod
    def _tools(cls, tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        for i, tool in enumerate(tools or []):
            function = tool.get("function")
            if tool.get("type") != "function" or not isinstance(function, dict) or not function.get("name"):
                raise ValueError(f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ..., "
                                 "'parameters': {...}}}}")
        return tools

    @model_validator(mode="after")
    def _choice(self) -> ChatRequest:
        if self.max_completion_tokens is not None:
            self.max_tokens = self.max_completion_tokens
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs=true")
        if isinstance(self.tool_choice, dict):
            name = (self.tool_choice.get("function") or {}).get("name")
            if name not in self.tool_names:
                raise ValueError(f"tool_choice names {name!r}, which is not among the request's tools "
                                 f"{sorted(self.tool_names)}")
        elif self.tool_choice == "required" and not self.tools:
            raise ValueError("tool_choice='required' needs tools")
        return self

    @property
    def tool_names(self) -> set[str]:
        return {t["function"]["name"] for t in self.tools or []}

    @property
    def parse_tools(self) -> bool:
        """Whether the answer's text is read for tool calls."""
        return bool(self.tools) and self.tool_choice != "none"

    @property
    def top_logprob_count(self) -> int:
        return self.top_logprobs or 0


class CompletionRequest(_Request):
    """``POST /v1/completions``: one prompt, as text or token ids (a batch of prompts is refused)."""

    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, prompt: Any) -> str | list[int]:
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
            prompt = prompt[0]
        if isinstance(prompt, list) and not all(isinstance(t, int) for t in prompt):
            raise ValueError("one prompt per request (a string or a list of token ids); send a batch as "
                             "concurrent requests, which batch in the engine")
        if not prompt:
            raise ValueError("prompt is empty")
        return prompt

    @model_validator(mode="after")
    def _echo(self) -> CompletionRequest:
        if self.echo:
            raise ValueError("echo=true is not supported: the prompt is yours already")
        return self

    @property
    def top_logprob_count(self) -> int:
        return self.logprobs or 0


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())
