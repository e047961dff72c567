"""SFT batches as RLTrainer.sft_step takes them, built with the tiny model's real tokenizer."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from forge_nb.data.sft import IGNORE, SftData
from forge_nb.models import build_tiny_model
from forge_nb.rl import ToyTask


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return AutoTokenizer.from_pretrained(str(build_tiny_model(tmp_path_factory.mktemp("sft") / "tiny")))


def _data(tokenizer, examples, task=None, batch_size=2, response_len=6):
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return SftData(tokenizer, examples=examples, task=task, request_len=4, response_len=response_len,
                   pad_id=pad, batch_size=batch_size)


def _ids(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_rows_are_laid_out_like_rl_batches_and_labels_are_the_next_response_token(tokenizer):
    data = _data(tokenizer, [{"request": "ab", "response": "abab"}], batch_size=2)
    batch = data.next_batch()
    tokens, labels = batch["tokens"], batch["labels"]
    assert tokens.shape == labels.shape == (2, 10)
    row, lab = tokens[0].tolist(), labels[0].tolist()
    req, res = _ids(tokenizer, "ab"), _ids(tokenizer, "abab")
    assert row[:4] == [data.pad_id] * 2 + req  # request left-padded to max_req_tokens
    assert row[4:8] == res and row[8] == tokenizer.eos_token_id  # response, then EOS where there is room
    # position t predicts t + 1: the last request column predicts the first response token; the rest ignored
    assert lab[3:8] == row[4:9] and set(lab[:3]) == {IGNORE} and set(lab[8:]) == {IGNORE}


def test_long_text_is_cut_on_the_side_that_keeps_the_layout(tokenizer):
    data = _data(tokenizer, [{"request": "abcdefg", "target": "hhhhhhhhh"}], batch_size=1, response_len=3)
    tokens, labels = data.next_batch().values()
    assert tokens[0, :4].tolist() == _ids(tokenizer, "defg")  # the request keeps its end
    assert tokens[0, 4:].tolist() == _ids(tokenizer, "hhh")  # the response keeps its start, no EOS
    assert (labels != IGNORE).sum() == 3


def test_each_pass_visits_every_example_once(tokenizer):
    examples = [{"request": c, "response": c * 2} for c in "abcd"]
    data = _data(tokenizer, examples, batch_size=2)
    firsts = [data.next_batch()["tokens"][:, 3].tolist() for _ in range(2)]
    assert sorted(t for pair in firsts for t in pair) == sorted(_ids(tokenizer, "abcd"))


def test_without_examples_the_task_targets_are_imitated(tokenizer):
    task = ToyTask(alphabet="abcdefgh", response_chars=4)
    tokens = _data(tokenizer, None, task=task, batch_size=3).next_batch()["tokens"]
    for row in tokens.tolist():
        request = tokenizer.decode(row[3:4])
        assert tokenizer.decode(row[4:8]) == request * 4  # the toy target: the letter repeated


@pytest.mark.parametrize("examples, match", [
    ([], "at least one"),
    ([{"prompt": "a"}], "expected a dict with 'request'"),
    ([{"request": "a", "response": ""}], "non-empty text"),
    ([{"request": "a", "response": 3}], "non-empty text"),
])
def test_bad_examples_say_what_is_wrong(tokenizer, examples, match):
    with pytest.raises(ValueError, match=match):
        _data(tokenizer, examples)


def test_bad_batch_size_is_refused(tokenizer):
    with pytest.raises(ValueError, match="batch_size"):
        _data(tokenizer, [{"request": "a", "response": "aa"}], batch_size=0)
