"""The Generator's own decode of a finished sample gives vLLM's text: vLLM's real detokenizer is the reference.

The Generator asks vLLM not to detokenize (``engine.worker.decodes_here``) and decodes each finished sample
once (``response_text``). Here both decode the same tokens with BPE tokenizers trained on the spot, a
byte-level one (characters split across tokens) and a sentencepiece-like one (a word's leading space is
text only after the prompt's tokens, not at the start of a string); vLLM's ``IncrementalDetokenizer`` is
fed the tokens one by one, as its engine does."""

from __future__ import annotations

import random

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from forge_nb.actors.engine.worker import decodes_here, make_sampling_params, response_text

CORPUS = ["héllo wörld 😀 naïve café, the quick brown fox", "日本語のテキスト 🎉 and  spaces\tand tabs"] * 40


@pytest.fixture(scope="module", params=["byte-level", "metaspace"])
def tokenizer(request: pytest.FixtureRequest) -> Tokenizer:
    tok = Tokenizer(models.BPE(byte_fallback=request.param == "metaspace"))
    if request.param == "byte-level":
        tok.pre_tokenizer, tok.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    else:  # as Llama's and Mistral's sentencepiece tokenizers: "▁" for a space, bytes for unknown characters
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Sequence([decoders.Metaspace(), decoders.ByteFallback(), decoders.Fuse()])
        alphabet = []
    special = ["<eos>"] + ([f"<0x{b:02X}>" for b in range(256)] if request.param == "metaspace" else [])
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=320 + len(special), special_tokens=special,
                                                        initial_alphabet=alphabet))
    return tok


def vllm_text(tokenizer: Tokenizer, prompt_ids: list[int], token_ids: list[int], stop_terminated: bool) -> str:
    """What vLLM's engine makes of these tokens: one ``update`` per engine step, the last one stop-terminated."""
    from transformers import PreTrainedTokenizerFast
    from vllm.v1.engine import EngineCoreRequest
    from vllm.v1.engine.detokenizer import IncrementalDetokenizer

    hf = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<eos>")
    request = EngineCoreRequest(
        request_id="r", prompt_token_ids=prompt_ids, mm_features=None,
        sampling_params=make_sampling_params({"max_tokens": len(token_ids)}), pooling_params=None,
        arrival_time=0.0, lora_request=None, cache_salt=None, data_parallel_rank=None)
    detokenizer = IncrementalDetokenizer.from_new_request(hf, request)
    for i, token in enumerate(token_ids):
        detokenizer.update([token], stop_terminated=stop_terminated and i == len(token_ids) - 1)
    return detokenizer.output_text


def test_the_text_is_what_vllm_detokenizes(tokenizer: Tokenizer) -> None:
    rng = random.Random(0)
    eos = tokenizer.token_to_id("<eos>")
    split_chars = spaced = 0
    for _ in range(400):
        prompt = tokenizer.encode(rng.choice(CORPUS)[: rng.randrange(1, 30)]).ids
        response = [rng.randrange(tokenizer.get_vocab_size()) for _ in range(rng.randrange(1, 9))]
        stopped = rng.random() < 0.5
        if stopped:
            response.append(eos)
        ours = response_text(tokenizer, prompt, response, stop_terminated=stopped)
        assert ours == vllm_text(tokenizer, prompt, response, stopped), (prompt, response, stopped)
        split_chars += "\ufffd" in tokenizer.decode(response)
        spaced += ours.startswith(" ")
    assert split_chars > 20 or spaced > 20  # the cases that need care were among them


def test_vllm_still_detokenizes_where_the_text_needs_it() -> None:
    assert decodes_here({"n": 4, "temperature": 1.0})
    assert make_sampling_params({"n": 4}, decode_here=True).detokenize is False
    assert make_sampling_params({"n": 4}).detokenize is True  # the raw vLLM side of the benchmarks
    for values in ({"stop": ["\n"]}, {"skip_special_tokens": False}, {"include_stop_str_in_output": True},
                   {"detokenize": True}, {"detokenize": False}):
        assert not decodes_here(values)
        assert make_sampling_params(values, decode_here=True).detokenize is values.get("detokenize", True)
