"""Sample (a pair that also indexes by name), load_rows on local files, PromptStream's epochs."""

from __future__ import annotations

import json
import pickle

import pytest

from forge_nb.rl.prompts import PromptStream, Sample, load_rows

ROWS = [{"question": f"What is {i} + 1?", "answer": f"{i} + 1 = {i + 1}\n#### {i + 1}"} for i in range(5)]


class ChatTokenizer:
    """Just the one method gsm8k_transform calls."""

    def apply_chat_template(self, chat: list[dict], tokenize: bool, add_generation_prompt: bool) -> str:
        return "".join(f"<{m['role']}>{m['content']}" for m in chat) + ("<assistant>" if add_generation_prompt else "")


def test_sample_unpacks_and_indexes_by_name() -> None:
    s = Sample("q", "4")
    prompt, target = s
    assert (prompt, target) == ("q", "4") and s["request"] == "q" and s["target"] == "4"
    assert s[0] == "q" and s[-1] == "4" and dict(s) == {"request": "q", "target": "4"}
    with pytest.raises(KeyError, match="request"):
        s["prompt"]  # noqa: B018
    assert pickle.loads(pickle.dumps(s))["target"] == "4"


@pytest.fixture
def jsonl(tmp_path):
    path = tmp_path / "gsm8k.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path


@pytest.mark.parametrize("streaming", [False, True])
def test_stream_covers_each_row_once_per_epoch_and_reshuffles(jsonl, streaming: bool) -> None:
    stream = PromptStream(load_rows(str(jsonl), streaming=streaming), tokenizer=ChatTokenizer(), seed=1)
    first = [stream.sample() for _ in range(5)]
    assert sorted(s.target for s in first) == ["1", "2", "3", "4", "5"] and stream.epoch == 0
    assert all(s.request.startswith("<system>") and s.request.endswith("<assistant>") for s in first)
    second = [stream.sample() for _ in range(5)]
    assert stream.epoch == 1 and sorted(s.target for s in second) == ["1", "2", "3", "4", "5"]
    again = PromptStream(load_rows(str(jsonl), streaming=streaming), tokenizer=ChatTokenizer(), seed=1)
    assert [again.sample() for _ in range(5)] == first  # seeded


def test_rows_with_request_and_target_pass_through_and_others_are_refused(tmp_path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"request": "say hi", "target": "hi"}) + "\n")
    assert PromptStream(load_rows(str(path))).sample() == Sample("say hi", "hi")
    path.write_text(json.dumps({"prompt": "say hi"}) + "\n")
    with pytest.raises(ValueError, match="question"):
        PromptStream(load_rows(str(path))).sample()


def test_load_rows_errors(tmp_path, jsonl) -> None:
    with pytest.raises(ValueError, match="train"):
        load_rows(str(jsonl), split="test")
    odd = tmp_path / "d.txt"
    odd.write_text("x")
    with pytest.raises(ValueError, match="format"):
        load_rows(str(odd))


def test_a_hub_id_offline_says_to_pass_a_local_path(monkeypatch) -> None:
    import datasets

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    with pytest.raises(ValueError, match="local folder"):
        load_rows("openai/gsm8k", "main")
