"""Hypothesis strategies of hostile HTTP requests to a run's two fronts: the Tinker server and the OpenAI endpoint.

A drawn request is a :class:`Hostile`: method, path, headers and body bytes, its ``kind`` (what makes it hostile,
for the tally) and ``may_pass`` (whether the strategy could have drawn a valid request, which the front may then
answer 2xx). Each route's body is built field by field from the SDK's or OpenAI's request shape: every field is
either a plausible value or a hostile one (a wrong type, a huge or negative number, NaN, a deep or long value),
fields go missing and unknown ones join; beside those, bodies that are not JSON, JSON of another shape, truncated
JSON, and for ``forward_backward`` protobuf messages with hostile Datums, truncated or replaced by random bytes.

Token ids go past the tiny model's vocabulary (``VOCAB``) and below zero; ``model_id`` and the sampling session are
the fixture's real ones part of the time, so hostile Datums and prompts reach the trainer and the generator.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from hypothesis import strategies as st
from tinker.proto import tinker_public_pb2 as pb

__all__ = ["Hostile", "openai_requests", "tinker_requests"]

#: the tiny model's vocabulary: its alphabet and two special tokens
VOCAB = 10
LOSSES = ["cross_entropy", "importance_sampling", "ppo", "cispo", "dro"]


@dataclass
class Hostile:
    kind: str
    method: str
    path: str
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes | None = None
    may_pass: bool = False  # a plausible request: a 2xx is no failure

    def __repr__(self) -> str:  # hypothesis prints the falsifying example with it
        body = self.body if self.body is None or len(self.body) < 300 else self.body[:300] + b"..."
        return f"Hostile({self.kind!r}, {self.method} {self.path}, headers={self.headers}, body={body!r})"


# -- values ----------------------------------------------------------------------------------------

HUGE = st.sampled_from([2**31, 2**31 - 1, 2**63 - 1, 2**63, 2**64, 10**30, -1, -(2**31), -(2**63), -(10**30), 0])
SMALL_INTS = st.integers(min_value=0, max_value=4)
TEXT = st.text(max_size=20)


def _hostile_value() -> st.SearchStrategy[Any]:
    scalars = st.one_of(st.none(), st.booleans(), HUGE, st.integers(), st.floats(allow_nan=True), TEXT,
                        st.just("x" * 100_000), st.just(float("inf")))
    nested = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                         st.dictionaries(TEXT, inner, max_size=4)), max_leaves=8)
    return st.one_of(scalars, nested, st.just(_deep(200)))


def _deep(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


HOSTILE_VALUE = _hostile_value()
ANY_JSON = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), TEXT),
                        lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(TEXT, inner, max_size=4)),
                        max_leaves=10)
VALID_TOKEN = st.integers(0, VOCAB - 1)
#: token ids, all in the vocabulary two times in three
TOKENS = st.one_of(st.lists(VALID_TOKEN, max_size=6), st.lists(VALID_TOKEN, max_size=6),
                   st.lists(st.one_of(VALID_TOKEN, HUGE, st.integers(-5, VOCAB + 5)), max_size=12))


@st.composite
def _fields(draw: st.DrawFn, shape: dict[str, st.SearchStrategy[Any]]) -> dict[str, Any]:
    """A JSON object of ``shape``, every field plausible but for up to three made hostile (a huge or negative number,
    a value of any type) or left out, and maybe
    unknown fields: so most requests get past the first field and reach what lies behind it. It may be valid (a
    field the server does not need left out, a hostile value the field takes, an unknown field it ignores)."""
    body = {name: draw(good) for name, good in shape.items()}
    for name in draw(st.lists(st.sampled_from(sorted(shape)), max_size=3, unique=True)) if shape else []:
        how = draw(st.sampled_from(["huge", "hostile", "missing"]))
        if how == "missing":
            del body[name]
        else:
            body[name] = draw(HUGE if how == "huge" else HOSTILE_VALUE)
    extra = draw(st.dictionaries(st.text(min_size=1, max_size=10), HOSTILE_VALUE, max_size=2))
    body.update({k: v for k, v in extra.items() if k not in shape})
    return body


@st.composite
def _body(draw: st.DrawFn, shape: dict[str, st.SearchStrategy[Any]]) -> tuple[str, bytes, bool]:
    """A request body for a JSON route: (kind, bytes, may_pass)."""
    kind = draw(st.sampled_from(["fields"] * 6 + ["other json", "not json", "truncated json", "empty"]))
    if kind == "fields":
        return kind, json.dumps(draw(_fields(shape))).encode(), True
    if kind == "other json":
        return kind, json.dumps(draw(ANY_JSON)).encode(), False
    if kind == "truncated json":
        text = json.dumps(draw(_fields(shape))).encode()
        return kind, text[: draw(st.integers(0, max(len(text) - 1, 0)))], False
    if kind == "not json":
        return kind, draw(st.one_of(st.binary(max_size=64), st.just(b"\xff\xfe\x00"), st.just(b"NaN"))), False
    return kind, b"", False


# -- the Tinker server -----------------------------------------------------------------------------

TINKER_ROUTES = ["client/config", "client/dynamic_config", "create_session", "session_heartbeat", "telemetry",
                 "create_model", "get_info", "forward_backward", "optim_step", "save_weights_for_sampler",
                 "save_weights", "load_weights", "create_sampling_session", "asample", "retrieve_future",
                 "unload_model", "sessions/s-1/finish"]


def _tinker_shapes(model_id: str, session_id: str, base_model: str) -> dict[str, dict[str, st.SearchStrategy[Any]]]:
    """Each JSON route's fields, with values that may pass. Calls that would change the served client for good
    (unload it, save for sampler: a new version the session no longer serves) or spawn runs (create_model on the
    run's base) get ids and bases that do not exist."""
    real = st.sampled_from([model_id, model_id, "nobody:train:0", ""])
    fake = st.sampled_from(["nobody:train:0", "", model_id + "x"])
    other_base = TEXT.filter(lambda s: s not in (base_model, "tiny"))
    lora = st.fixed_dictionaries({"rank": st.integers(1, 8)},
                                 optional={"train_mlp": st.booleans(), "train_attn": st.booleans()})
    adam = st.fixed_dictionaries({}, optional={
        "learning_rate": st.floats(0, 1e-2), "beta1": st.floats(0, 0.99),
        "beta2": st.floats(0, 0.999), "eps": st.floats(1e-12, 1e-6), "grad_clip_norm": st.floats(0, 10)})
    sampling = st.fixed_dictionaries({}, optional={
        "max_tokens": st.integers(1, 4), "temperature": st.floats(0, 2), "top_k": st.sampled_from([-1, 1, 5]),
        "top_p": st.floats(0.1, 1), "seed": st.integers(0, 9),
        "stop": st.one_of(st.none(), TEXT, st.lists(TEXT, max_size=2), st.lists(SMALL_INTS, max_size=2))})
    prompt = st.fixed_dictionaries({"chunks": st.lists(st.one_of(
        *[st.fixed_dictionaries({"type": st.just("encoded_text"), "tokens": TOKENS.filter(bool)})] * 4,
        st.fixed_dictionaries({"type": st.just("encoded_text"), "tokens": st.sampled_from([[1] * 15, [1] * 16])}),
        st.fixed_dictionaries({"type": st.just("image"), "data": st.just("iVBORw0K"), "format": st.just("png")})),
        min_size=1, max_size=2)})
    return {
        "create_session": {"tags": st.lists(TEXT, max_size=2), "user_metadata": st.none(), "sdk_version": TEXT},
        "session_heartbeat": {"session_id": TEXT},
        "telemetry": {"events": st.lists(ANY_JSON, max_size=2), "session_id": TEXT},
        "create_model": {"session_id": TEXT, "model_seq_id": SMALL_INTS, "base_model": other_base,
                         "lora_config": lora},
        "get_info": {"model_id": real},
        "optim_step": {"model_id": real, "optim_params": adam, "seq_id": SMALL_INTS},
        "save_weights_for_sampler": {"model_id": fake, "path": TEXT, "seq_id": SMALL_INTS},
        "save_weights": {"model_id": fake, "path": TEXT},
        "load_weights": {"model_id": real, "path": st.one_of(TEXT, st.just(f"tinker://{model_id}/weights/none")),
                         "optimizer": st.booleans(), "session_id": TEXT, "model_seq_id": SMALL_INTS},
        "create_sampling_session": {"session_id": TEXT, "sampling_session_seq_id": SMALL_INTS,
                                    "model_path": st.one_of(TEXT, st.just(f"tinker://{model_id}/sampler_weights/x"))},
        "asample": {"sampling_session_id": st.sampled_from([session_id] * 4 + ["sampler-0"]),
                    "num_samples": st.integers(1, 2), "prompt": prompt, "sampling_params": sampling,
                    "topk_sample_logprobs": SMALL_INTS, "prompt_logprobs": st.booleans(),
                    "topk_prompt_logprobs": st.sampled_from([0, 0, 2]), "seq_id": SMALL_INTS},
        "retrieve_future": {"request_id": st.one_of(TEXT, st.just("tinker-1"), st.just(f"{model_id}-999999"))},
        "unload_model": {"model_id": fake},
        "client/config": {"sdk_version": TEXT},
        "client/dynamic_config": {},
        "sessions/s-1/finish": {},
    }


def _tensor(values: list[Any], dtype: int) -> pb.Tensor:
    np_dtype = np.int64 if dtype == pb.DTYPE_INT64 else np.float32
    return pb.Tensor(dense=np.asarray(values, dtype=np_dtype).tobytes(), dtype=dtype, shape=[len(values)])


#: what a Datum can get wrong, one or two at a time
DATUM_FAULTS = ["token past the vocabulary", "negative token", "huge token", "100k tokens", "10k tokens",
                "odd token bytes", "image chunk", "no tokens", "target past the vocabulary", "negative target",
                "inputs one short", "inputs one long", "no target_tokens", "NaN input", "unreadable tensor",
                "2-D tensor", "unknown input"]


@st.composite
def _datum(draw: st.DrawFn, loss_fn: str) -> tuple[pb.Datum, list[str]]:
    """A Datum ``loss_fn`` can take, with up to two faults (``DATUM_FAULTS``); and the faults."""
    faults = draw(st.lists(st.sampled_from(DATUM_FAULTS), max_size=2, unique=True))
    tokens = draw(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=10))
    for fault, bad in [("token past the vocabulary", VOCAB), ("negative token", -1), ("huge token", 2**31 - 1)]:
        if fault in faults:
            tokens[draw(st.integers(0, len(tokens) - 1))] = bad
    if "100k tokens" in faults or "10k tokens" in faults:
        tokens = tokens[:1] * (100_000 if "100k tokens" in faults else 10_000)
    packed = np.asarray(tokens, dtype=np.int32).tobytes()
    if "odd token bytes" in faults:
        packed += b"\x01"
    chunk = pb.Chunk(encoded_text=pb.EncodedTextChunk(tokens=packed))
    if "image chunk" in faults:
        chunk = pb.Chunk(image=pb.ImageChunk(data=b"\x89PNG", format="png"))
    n = len(tokens) - ("inputs one short" in faults) + ("inputs one long" in faults)
    targets = [tokens[(i + 1) % len(tokens)] % VOCAB for i in range(n)]
    if targets and ("target past the vocabulary" in faults or "negative target" in faults):
        targets[-1] = VOCAB if "target past the vocabulary" in faults else -5
    inputs = {"target_tokens": _tensor(targets, pb.DTYPE_INT64)}
    floats = {"weights": 1.0, "logprobs": -2.0, "advantages": draw(st.floats(-2, 2))}
    for name in ["weights"] if loss_fn == "cross_entropy" else ["logprobs", "advantages"]:
        inputs[name] = _tensor([floats[name]] * n, pb.DTYPE_FLOAT32)
    name = draw(st.sampled_from(sorted(inputs)))
    if "no target_tokens" in faults:
        del inputs["target_tokens"]
    elif "NaN input" in faults:
        inputs[name] = _tensor([float("nan")] * n, pb.DTYPE_FLOAT32)  # target_tokens too: floats where ints go
    elif "unreadable tensor" in faults:
        inputs[name] = pb.Tensor(dense=draw(st.binary(max_size=12)), dtype=draw(st.sampled_from([0, 1, 2, 99])),
                                 shape=draw(st.lists(st.integers(-3, 2**20), max_size=3)))
    elif "2-D tensor" in faults:
        inputs[name].shape[:] = [1, n]
    if "unknown input" in faults:
        inputs["unknown"] = _tensor([0.0] * n, pb.DTYPE_FLOAT32)
    return pb.Datum(model_input=[] if "no tokens" in faults else [chunk], loss_fn_inputs=inputs), faults


@st.composite
def _forward_backward(draw: st.DrawFn, model_id: str) -> tuple[str, bytes, bool]:
    loss_fn = draw(st.one_of(*[st.sampled_from(LOSSES)] * 3, TEXT))
    datums = draw(st.lists(_datum(loss_fn if loss_fn in LOSSES else "ppo"), min_size=1, max_size=3))
    if draw(st.integers(0, 9)) == 0:
        datums = []
    message = pb.ForwardBackwardRequest(
        model_id=draw(st.sampled_from([model_id] * 6 + ["nobody:train:0", ""])), loss_fn=loss_fn,
        forward_only=draw(st.booleans()), seq_id=draw(st.integers(-(2**31), 2**31 - 1)), data=[d for d, _ in datums])
    if draw(st.integers(0, 4)) == 0:
        message.loss_fn_config_v2["clip_low_threshold"].CopyFrom(pb.LossConfigValue(number=draw(st.floats())))
    body = message.SerializeToString()
    kind = draw(st.sampled_from(["datums"] * 5 + ["truncated protobuf", "random bytes", "json body"]))
    if kind == "truncated protobuf" and body:  # cut at a field's end, it is a shorter valid message
        return kind, body[: draw(st.integers(0, len(body) - 1))], True
    if kind == "random bytes":
        return kind, draw(st.binary(max_size=200)), False
    if kind == "json body":
        return kind, json.dumps({"model_id": model_id, "forward_backward_input": draw(ANY_JSON)}).encode(), False
    faults = sorted({f for _, fs in datums for f in fs})
    return "datums" + (f" ({', '.join(faults)})" if faults else ""), body, True


def tinker_requests(token: str, model_id: str, session_id: str, base_model: str) -> st.SearchStrategy[Hostile]:
    """Hostile requests to the Tinker server (under ``/api/v1``, the ``X-API-Key`` ``token``)."""
    shapes = _tinker_shapes(model_id, session_id, base_model)

    @st.composite
    def request(draw: st.DrawFn) -> Hostile:
        headers = {"X-API-Key": token}
        route = draw(st.sampled_from(TINKER_ROUTES + ["forward_backward"] * 6 + ["asample"] * 2 + ["unknown"]))
        if route == "unknown":
            path = draw(st.sampled_from(["/api/v1/nothing", "/api/v2/create_model", "/", "/api/v1/samplers/x/y",
                                         "/api/v1/../../etc/passwd", "/api/v1/" + "a" * 4000, "/api/v1/%00"]))
            return Hostile("unknown route", draw(st.sampled_from(["GET", "POST", "PUT", "DELETE"])), path, headers,
                           draw(st.binary(max_size=16)))
        path = f"/api/v1/{route}"
        if route == "forward_backward":
            kind, body, may_pass = draw(_forward_backward(model_id))
        else:
            kind, body, may_pass = draw(_body(shapes[route]))
        auth = draw(st.sampled_from(["token"] * 12 + ["no token", "wrong token", "bearer"]))
        if auth == "no token":
            headers, kind, may_pass = {}, auth, False
        elif auth == "wrong token":
            headers, kind, may_pass = {"X-API-Key": token[:-1] + "?"}, auth, False
        elif auth == "bearer":  # the OpenAI endpoint's header, not this server's
            headers, kind, may_pass = {"Authorization": f"Bearer {token}"}, "no token", False
        method = draw(st.sampled_from(["POST"] * 12 + ["GET", "PUT"]))
        if method != "POST":
            kind, may_pass = "wrong method", False
        content_type = "application/x-protobuf" if route == "forward_backward" else "application/json"
        return Hostile(f"{route}: {kind}", method, path, headers | {"Content-Type": content_type}, body, may_pass)

    return request()


# -- the OpenAI endpoint ---------------------------------------------------------------------------

def _openai_shapes(model: str) -> dict[str, dict[str, st.SearchStrategy[Any]]]:
    """Each route's fields with values the endpoint takes, but for a few (another model's name, a role or content
    part OpenAI has and the endpoint does not, an empty stop string, min_tokens over max_tokens)."""
    text = st.text(min_size=1, max_size=20)
    message = st.fixed_dictionaries({"role": st.sampled_from(["user"] * 6 + ["system", "assistant", "robot"]),
                                     "content": st.one_of(text, text, text, st.lists(st.fixed_dictionaries(
                                         {"type": st.sampled_from(["text", "text", "image_url"]), "text": text}),
                                         min_size=1, max_size=2))})
    common = {"model": st.sampled_from([model] * 8 + ["gpt-4o", ""]), "n": st.integers(1, 2),
              "max_tokens": st.integers(2, 4), "temperature": st.floats(0, 2), "top_p": st.floats(0.1, 1),
              "stop": st.one_of(text, st.lists(text, max_size=2), st.just("")), "seed": SMALL_INTS,
              "stream": st.booleans(), "top_k": st.sampled_from([-1, 1, 5]), "presence_penalty": st.floats(-2, 2),
              "min_tokens": st.sampled_from([0] * 5 + [9]), "return_token_ids": st.booleans()}
    return {
        "chat/completions": common | {
            "messages": st.lists(message, min_size=1, max_size=3), "max_completion_tokens": st.integers(2, 4),
            "logprobs": st.just(True), "top_logprobs": st.integers(0, 3),
            "tools": st.lists(st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries(
                {"name": st.just("add")})}), min_size=1, max_size=1),
            "tool_choice": st.sampled_from(["none", "auto", "required"]),
            "chat_template_kwargs": st.dictionaries(st.sampled_from(["enable_thinking", "x"]), ANY_JSON, max_size=1)},
        "completions": common | {
            "prompt": st.one_of(text, TOKENS.filter(bool), st.lists(VALID_TOKEN, min_size=1, max_size=6),
                                st.lists(TOKENS, max_size=2), st.lists(text, max_size=2),
                                st.just(list(range(VOCAB)) * 1000)),
            "logprobs": st.integers(0, 3), "echo": st.just(False)},
    }


def openai_requests(token: str, model: str, trajectory: str) -> st.SearchStrategy[Hostile]:
    """Hostile requests to the OpenAI endpoint (``Authorization: Bearer <token>``); ``trajectory``: an open one's
    id, whose ``/t/<id>/v1`` base takes the same routes."""
    shapes = _openai_shapes(model)

    @st.composite
    def request(draw: st.DrawFn) -> Hostile:
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        base = draw(st.sampled_from(["/v1"] * 6 + [f"/t/{trajectory}/v1", "/t/nothing/v1"]))
        route = draw(st.sampled_from(["chat/completions"] * 4 + ["completions"] * 4 + ["models", "unknown"]))
        if route == "unknown":
            path = draw(st.sampled_from(["/v1/embeddings", "/v2/chat/completions", "/", "/v1/models/x",
                                         "/v1/" + "a" * 4000, "/t//v1/models", "/v1/%00"]))
            return Hostile("unknown route", draw(st.sampled_from(["GET", "POST", "DELETE"])), path, headers,
                           draw(st.binary(max_size=16)))
        may_pass = not base.startswith("/t/nothing")
        if route == "models":
            method = draw(st.sampled_from(["GET", "GET", "POST"]))
            kind, body = "models", b""
            may_pass = may_pass and method == "GET"
        else:
            method = draw(st.sampled_from(["POST"] * 12 + ["GET", "PUT"]))
            kind, body, plausible = draw(_body(shapes[route]))
            may_pass = may_pass and plausible and method == "POST"
        auth = draw(st.sampled_from(["token"] * 12 + ["no token", "wrong token", "tinker header"]))
        if auth == "no token":
            headers.pop("Authorization")
        elif auth == "wrong token":
            headers["Authorization"] = f"Bearer {token[:-1]}?"
        elif auth == "tinker header":
            headers = {"X-API-Key": token}
        if auth != "token":
            kind, may_pass = auth, False
        elif method not in ("POST", "GET") or (method == "GET") != (route == "models"):
            kind, may_pass = "wrong method", False
        return Hostile(f"{route}: {kind}", method, f"{base}/{route}", headers, body, may_pass)

    return request()
