"""What the Tinker server reads off the wire and refuses before a call reaches the trainer or the generators: cases
the fuzz of tests/fronts found, each once a failure of the run ("server") rather than a refusal ("user")."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tinker.proto import tinker_public_pb2 as pb

from forge_nb.tinker.wire import Limits, TinkerRefusal, datums_from_proto, tokens_of


def request(tokens: bytes, targets: list[int]) -> pb.ForwardBackwardRequest:
    target = pb.Tensor(dense=np.asarray(targets, dtype=np.int64).tobytes(), dtype=pb.DTYPE_INT64, shape=[len(targets)])
    datum = pb.Datum(model_input=[pb.Chunk(encoded_text=pb.EncodedTextChunk(tokens=tokens))],
                     loss_fn_inputs={"target_tokens": target})
    return pb.ForwardBackwardRequest(model_id="m", loss_fn="cross_entropy", data=[datum])


def test_an_encoded_text_chunk_of_no_whole_number_of_int32s_is_refused() -> None:
    chunk = pb.Chunk(encoded_text=pb.EncodedTextChunk(tokens=np.asarray([1, 2], dtype=np.int32).tobytes() + b"\x01"))
    with pytest.raises(TinkerRefusal, match="chunk of 9 bytes; its tokens are int32s"):  # was numpy's ValueError
        tokens_of([chunk], "datum 0")


def test_token_ids_outside_the_vocabulary_and_datums_past_the_context_are_refused(tmp_path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 10, "max_position_embeddings": 256}))
    limits = Limits.of(tmp_path)
    assert limits == Limits(vocab=10, context=256) and Limits.of(tmp_path / "nowhere") == Limits()
    ok = np.asarray([1, 2, 3], dtype=np.int32).tobytes()
    assert datums_from_proto(request(ok, [2, 3, 4]), limits)[0]["tokens"] == [1, 2, 3]
    for tokens, message in [([1, 10], "token id 10 is outside the model's vocabulary"),  # the trainer's IndexError
                            ([-1, 2], "token id -1 is outside"), ([1] * 100_000, "100000 tokens; the model takes 256")]:
        with pytest.raises(TinkerRefusal, match=message):
            datums_from_proto(request(np.asarray(tokens, dtype=np.int32).tobytes(), [1] * len(tokens)), limits)
    assert datums_from_proto(request(np.asarray([1] * 300, dtype=np.int32).tobytes(), [1] * 300))  # no limits known


def test_a_prompt_leaves_the_generators_room_for_a_token(tmp_path) -> None:
    limits = Limits.of(tmp_path, engine_context=16)  # vLLM's refusal of a longer prompt came back as a failure
    limits.check([1] * 15, "prompt", prompt=True)
    limits.check([1] * 16, "datum 0")  # the trainer's context is the model's
    with pytest.raises(TinkerRefusal, match="16 tokens; the generators' context is 16"):
        limits.check([1] * 16, "prompt", prompt=True)


def test_loss_inputs_read_as_the_sdks_reader_reads_them() -> None:
    """Dense float32/int32/int64 inputs are read with numpy, the others (sparse CSR, bfloat16) by the SDK's reader:
    the values are the same as the SDK's reader gives, and bytes that are no whole number of values are refused."""
    import torch
    from tinker import types
    from tinker.proto.request_conv import _tensor_data_to_proto
    from tinker.proto.response_conv import _tensor_data_from_proto

    tokens = np.asarray([1, 2, 3, 4], dtype=np.int32).tobytes()
    inputs = {"f32": types.TensorData.from_numpy(np.asarray([0.5, -1.0, 2.0, 3.5], dtype=np.float32)),
              "i32": types.TensorData.from_numpy(np.asarray([1, 2, 3, 4], dtype=np.int32)),
              "i64": types.TensorData.from_numpy(np.asarray([5, 6, 7, 8], dtype=np.int64)),
              "shaped": types.TensorData(data=[1.0, 2.0, 3.0, 4.0], dtype="float32", shape=[4])}
    protos = {name: _tensor_data_to_proto(td) for name, td in inputs.items()}
    datum = pb.Datum(model_input=[pb.Chunk(encoded_text=pb.EncodedTextChunk(tokens=tokens))], loss_fn_inputs=protos)
    read = datums_from_proto(pb.ForwardBackwardRequest(model_id="m", data=[datum]))[0]["inputs"]
    assert read == {name: _tensor_data_from_proto(proto).to_numpy().tolist() for name, proto in protos.items()}
    csr = _tensor_data_to_proto(types.TensorData.from_torch_sparse(torch.tensor([[0, 0, 3, 0], [0, 0, 0, 0]])))
    assert csr.HasField("sparse_csr")  # read by the SDK's reader: a 2-D tensor, refused as such
    with pytest.raises(TinkerRefusal, match=r"loss_fn_inputs\['csr'\] has shape \[2, 4\]"):
        datums_from_proto(pb.ForwardBackwardRequest(model_id="m", data=[pb.Datum(
            model_input=datum.model_input, loss_fn_inputs={"csr": csr})]))
    torn = pb.Tensor(dense=b"\x00" * 7, dtype=pb.DTYPE_FLOAT32)
    with pytest.raises(TinkerRefusal, match=r"loss_fn_inputs\['weights'\] cannot be read"):
        datums_from_proto(pb.ForwardBackwardRequest(model_id="m", data=[pb.Datum(
            model_input=datum.model_input, loss_fn_inputs={"weights": torn})]))
    nan = pb.Tensor(dense=np.asarray([1.0, np.nan, 0.0, 0.0], dtype=np.float32).tobytes(), dtype=pb.DTYPE_FLOAT32)
    with pytest.raises(TinkerRefusal, match=r"datum 1: loss_fn_inputs\['weights'\] holds a NaN"):
        datums_from_proto(pb.ForwardBackwardRequest(model_id="m", data=[datum, pb.Datum(
            model_input=datum.model_input, loss_fn_inputs={"weights": nan})]))
