"""The Tinker API's bodies, read and written with the ``tinker`` SDK's own classes: its pydantic request types for the
JSON routes, and its protobuf messages (``tinker.proto.tinker_public_pb2``) for ``forward_backward`` requests and
for the ``ForwardBackwardOutput`` and ``SampleResponse`` results, which the SDK (0.38) accepts as protobuf only.

What goes to forge_nb's actors is plain data: a Datum is ``{"tokens": [int, ...], "inputs": {name: [values]}}``
(``forge_nb.actors.training.tinker``), a sample request the Generator's keyword arguments (vLLM's names).

A tensor of a request (a Datum's ``loss_fn_inputs``) that the SDK writes dense in float32, int32 or int64 (its
``request_conv._tensor_data_to_proto``: the array's bytes in that dtype, and its shape) is read back with numpy's
``frombuffer`` in that dtype; any other (sparse CSR, bfloat16) by the SDK's own reader
(``tinker.proto.response_conv._tensor_data_from_proto``, then ``TensorData.to_numpy``), which builds a pydantic
``TensorData`` per tensor, a cost that was most of a small batch's conversion. The results' packed fields
(``SampledSequence.tokens`` as int32, logprobs as float32, a ``BatchedTensor``'s data and offsets) are written with
numpy's ``tobytes`` in the layout the SDK's reader (``response_conv``) takes apart.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tinker.proto import tinker_public_pb2 as pb
from tinker.proto.response_conv import _tensor_data_from_proto

__all__ = ["Limits", "TinkerRefusal", "datums_from_proto", "forward_backward_output", "loss_config", "sample_overrides",
           "sample_response", "tokens_of"]


class TinkerRefusal(ValueError):
    """A request the server refuses; answered in the SDK's error shape (``{"error", "category": "user"}``)."""


@contextlib.contextmanager
def refusing(prefix: str = "") -> Iterator[None]:
    """A ValueError of what runs inside (an actor's arrives inside monarch's ActorError, as its ``exception``) is the
    caller's to fix: raised as a TinkerRefusal, ``prefix`` before its message; other errors pass as they are."""
    try:
        yield
    except Exception as e:
        refusal = getattr(e, "exception", e)
        if isinstance(refusal, ValueError):
            raise TinkerRefusal(f"{prefix}{refusal}") from None
        raise


@dataclass(frozen=True)
class Limits:
    """What the served model takes (None where it is not known): token ids below ``vocab``, at most ``context``
    tokens in a Datum (the model's ``max_position_embeddings``), and prompts shorter than the generators' context
    ``engine_context`` (vLLM's ``max_model_len``: one token at least must fit). Checked before a call reaches the
    trainer or the generators, which the served run shares: an id past the vocabulary fails the trainer's embedding,
    an input far past the context holds the trainer for as long as it computes, and vLLM's refusals of a prompt are
    no ValueError the server could tell from a failure of the run."""

    vocab: int | None = None
    context: int | None = None
    engine_context: int | None = None

    @classmethod
    def of(cls, model_path: Any, engine_context: int | None = None) -> Limits:
        try:
            config = json.loads((Path(model_path) / "config.json").read_text())
        except (OSError, TypeError, ValueError):
            config = {}
        config = config.get("text_config", config)
        return cls(config.get("vocab_size"), config.get("max_position_embeddings"), engine_context)

    def check(self, tokens: list[int], where: str, prompt: bool = False) -> None:
        """A TinkerRefusal naming ``where`` unless the model takes ``tokens`` (a prompt to sample from: ``prompt``)."""
        if prompt and self.engine_context is not None and len(tokens) >= self.engine_context:
            raise TinkerRefusal(f"{where}: {len(tokens)} tokens; the generators' context is {self.engine_context} "
                                "(their max_model_len), prompt and sampled tokens together")
        if self.context is not None and len(tokens) > self.context:
            raise TinkerRefusal(f"{where}: {len(tokens)} tokens; the model takes {self.context} at most "
                                "(its max_position_embeddings)")
        low, high = min(tokens), max(tokens)
        if self.vocab is not None and (low < 0 or high >= self.vocab):
            raise TinkerRefusal(f"{where}: token id {low if low < 0 else high} is outside the model's vocabulary "
                                f"(0 to {self.vocab - 1})")


def tokens_of(chunks: Any, where: str) -> list[int]:
    """The token ids of a ModelInput's chunks (the SDK's pydantic chunks or the protobuf's); images and audio are
    refused: forge_nb's models read text."""
    tokens: list[int] = []
    for chunk in chunks:
        kind = chunk.WhichOneof("chunk") if hasattr(chunk, "WhichOneof") else getattr(chunk, "type", None)
        if kind != "encoded_text":
            raise TinkerRefusal(f"{where}: a {kind or 'non-text'} chunk; this server's models take encoded text "
                                "chunks only (ModelInput.from_ints)")
        if hasattr(chunk, "WhichOneof"):
            packed = chunk.encoded_text.tokens
            if len(packed) % 4:
                raise TinkerRefusal(f"{where}: an encoded text chunk of {len(packed)} bytes; its tokens are int32s, "
                                    "4 bytes each (ModelInput.from_ints writes them)")
            tokens.extend(np.frombuffer(packed, dtype=np.int32).tolist())
        else:
            tokens.extend(int(t) for t in chunk.tokens)
    if not tokens:
        raise TinkerRefusal(f"{where}: the model input holds no tokens")
    return tokens


#: the dense tensors read here without the SDK's reader, and their dtypes (what its writer packs them as)
_DENSE = {pb.DTYPE_FLOAT32: np.dtype(np.float32), pb.DTYPE_INT32: np.dtype(np.int32),
          pb.DTYPE_INT64: np.dtype(np.int64)}


def _tensor_values(tensor: pb.Tensor) -> np.ndarray:
    """A request tensor's values as numpy (shaped as it says); a ValueError when they cannot be read."""
    dtype = _DENSE.get(tensor.dtype)
    if dtype is None or tensor.HasField("sparse_csr"):
        return _tensor_data_from_proto(tensor).to_numpy()
    values = np.frombuffer(tensor.dense, dtype=dtype)  # a ValueError when the bytes are not whole values
    shape = list(tensor.shape)
    return values.reshape(shape) if shape and list(values.shape) != shape else values


def datums_from_proto(request: pb.ForwardBackwardRequest, limits: Limits = Limits()) -> list[dict[str, Any]]:
    """The request's Datums as plain data; a Datum this server cannot read, or the model cannot take (``limits``),
    is a TinkerRefusal naming it. The float inputs are checked for NaNs and infinities all at once, after the
    Datums are read (one numpy call instead of one per input)."""
    datums = []
    floats: list[tuple[int, str, np.ndarray]] = []
    for i, datum in enumerate(request.data):
        tokens = tokens_of(datum.model_input, f"datum {i}")
        limits.check(tokens, f"datum {i}")
        inputs = {}
        for name, tensor in datum.loss_fn_inputs.items():
            try:
                values = _tensor_values(tensor)
            except Exception as e:
                raise TinkerRefusal(f"datum {i}: loss_fn_inputs[{name!r}] cannot be read ({e})") from None
            if values.ndim != 1:
                raise TinkerRefusal(f"datum {i}: loss_fn_inputs[{name!r}] has shape {list(values.shape)}; the losses "
                                    "served take one value per token")
            if values.dtype.kind == "f":
                floats.append((i, name, values))
            inputs[name] = values.tolist()
        datums.append({"tokens": tokens, "inputs": inputs})
    if not datums:
        raise TinkerRefusal("forward_backward: no Datums")
    if floats and not np.isfinite(np.concatenate([values for _, _, values in floats])).all():
        i, name = next((i, name) for i, name, values in floats if not np.isfinite(values).all())
        raise TinkerRefusal(f"datum {i}: loss_fn_inputs[{name!r}] holds a NaN or an infinity")
    return datums


def loss_config(request: pb.ForwardBackwardRequest) -> dict[str, float] | None:
    """The request's ``loss_fn_config`` (the SDK writes both maps; the newer one wins); text values are refused:
    the losses served take numbers."""
    if request.loss_fn_config_v2:
        config = {}
        for key, value in request.loss_fn_config_v2.items():
            if value.WhichOneof("value") != "number":
                raise TinkerRefusal(f"loss_fn_config[{key!r}]: a number is needed")
            config[key] = value.number
        return config
    return dict(request.loss_fn_config) or None


def _batched(arrays: list[np.ndarray], dtype: int, np_dtype: Any) -> pb.BatchedTensor:
    """One ``BatchedTensor`` of per-Datum 1-D arrays: their bytes end to end, and byte offsets (one more than
    arrays) into them."""
    parts = [np.ascontiguousarray(a, dtype=np_dtype) for a in arrays]
    offsets = np.cumsum([0] + [p.nbytes for p in parts], dtype=np.int64)
    return pb.BatchedTensor(data=b"".join(p.tobytes() for p in parts), offsets=offsets.tobytes(), dtype=dtype)


def forward_backward_output(result: dict[str, Any]) -> bytes:
    """``RLTrainer.forward_backward``'s result as the SDK's ``ForwardBackwardOutput``: each Datum's ``logprobs``
    (its target tokens' logprobs) in one ArrayRecord, and the metrics."""
    logprobs = [np.asarray(lp, dtype=np.float32) for lp in result["logprobs"]]
    record = pb.ArrayRecord(type_tag="ArrayRecord", num_datums=len(logprobs),
                            fields={"logprobs": _batched(logprobs, pb.DTYPE_FLOAT32, np.float32)})
    metrics = {k: float(v) for k, v in result["metrics"].items() if isinstance(v, int | float)}
    return pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord", loss_fn_outputs=[record],
                                    metrics=metrics).SerializeToString()


def sample_overrides(request: Any) -> dict[str, Any]:
    """The Generator's sampling keywords (vLLM's names) for the SDK's ``SampleRequest``."""
    params = request.sampling_params
    if not 1 <= request.num_samples <= 1024:
        raise TinkerRefusal(f"num_samples={request.num_samples}: 1 to 1024")
    if params.max_tokens is not None and params.max_tokens < 1:
        raise TinkerRefusal(f"sampling_params.max_tokens={params.max_tokens}: at least 1")
    for name in ("topk_prompt_logprobs", "topk_sample_logprobs"):
        if not 0 <= getattr(request, name) <= 20:
            raise TinkerRefusal(f"{name}={getattr(request, name)}: 0 to 20")
    for name in ("target_prompt_logprobs", "prompt_logprobs_last_n"):
        if getattr(request, name) is not None:
            raise TinkerRefusal(f"{name}: not served by forge_nb's Tinker server")
    if request.prompt_alt_tokens_k:
        raise TinkerRefusal("prompt_alt_tokens_k: not served by forge_nb's Tinker server")
    if not math.isfinite(params.temperature) or params.temperature < 0:
        raise TinkerRefusal(f"sampling_params.temperature={params.temperature}: a number >= 0")
    out: dict[str, Any] = {"n": request.num_samples, "temperature": params.temperature, "top_k": params.top_k,
                           "top_p": params.top_p, "seed": params.seed}
    if params.max_tokens is not None:
        out["max_tokens"] = params.max_tokens
    stop = params.stop
    if isinstance(stop, str):
        out["stop"] = [stop]
    elif stop is not None and len(stop) == 0:
        out["ignore_eos"] = True  # the SDK's []: no stop at all, not even the end of sequence
    elif stop is not None and all(isinstance(s, int) for s in stop):
        out["stop_token_ids"] = list(stop)
    elif stop is not None:
        out["stop"] = list(stop)
    if request.topk_sample_logprobs:
        out["logprobs"] = request.topk_sample_logprobs
    if request.prompt_logprobs or request.topk_prompt_logprobs:
        out["prompt_logprobs"] = max(request.topk_prompt_logprobs, 0)
    return out


def _topk(rows: list[list[tuple[int, float]]], k: int) -> pb.TopkLogprobs:
    """Rows of up to k (token, logprob) pairs as the SDK's dense ``TopkLogprobs`` (-1 and -inf pad a short row)."""
    ids = np.full((len(rows), k), -1, dtype=np.int32)
    lps = np.full((len(rows), k), -np.inf, dtype=np.float32)
    for r, row in enumerate(rows):
        for c, (token, lp) in enumerate(row[:k]):
            ids[r, c], lps[r, c] = token, lp
    return pb.TopkLogprobs(token_ids=ids.tobytes(), logprobs=lps.tobytes(), k=k, length=len(rows))


def sample_response(completions: list[Any], request: Any) -> bytes:
    """The Generator's completions of one prompt as the SDK's ``SampleResponse``: each sample's tokens, logprobs,
    stop reason (``stop`` or ``length``), and the prompt's logprobs when asked for (NaN where none: the first)."""
    sequences = []
    for c in completions:
        seq = pb.SampledSequence(
            stop_reason=pb.STOP_REASON_LENGTH if c.stop_reason == "length" else pb.STOP_REASON_STOP,
            tokens=np.asarray(c.token_ids, dtype=np.int32).tobytes(),
            logprobs=np.asarray(c.logprobs if c.logprobs is not None else [], dtype=np.float32).tobytes())
        if request.topk_sample_logprobs and "top_logprobs" in c.metadata:
            seq.topk_sampled_logprobs.CopyFrom(_topk(c.metadata["top_logprobs"], request.topk_sample_logprobs))
        sequences.append(seq)
    out = pb.SampleResponse(sequences=sequences)
    first = completions[0] if completions else None
    prompt = (first.metadata.get("prompt_logprobs") if first is not None else None) or None
    if prompt is not None and request.prompt_logprobs:
        out.prompt_logprobs = np.asarray([math.nan if v is None else v for v in prompt["logprobs"]],
                                         dtype=np.float32).tobytes()
    if prompt is not None and request.topk_prompt_logprobs:
        out.topk_prompt_logprobs.CopyFrom(_topk(prompt["top"], request.topk_prompt_logprobs))
    return out.SerializeToString()
