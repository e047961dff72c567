"""A request with an adapter that asks for prompt logprobs has the engine to itself (``engine.inproc.final_outputs``):
beside other requests it failed vLLM 0.32's engine step and killed the generator (found by tests/fronts' fuzz).
Here a stand-in engine records which requests it served at the same time."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from forge_nb.actors.engine.inproc import final_outputs


class Engine:
    """``AsyncLLM.generate``'s shape: each request takes a few loop turns; ``together`` holds every set of request ids
    that were in the engine at once."""

    def __init__(self) -> None:
        self.running: set[str] = set()
        self.together: list[set[str]] = []

    async def generate(self, engine_input: Any, params: Any, request_id: str, lora_request: Any = None) -> Any:
        self.running.add(request_id)
        self.together.append(set(self.running))
        await asyncio.sleep(0.01)
        self.running.discard(request_id)
        yield request_id


def request(name: str, prompt_logprobs: int | None = None, n: int = 1, lora: Any = "adapter") -> tuple:
    return ("prompt", SimpleNamespace(prompt_logprobs=prompt_logprobs, n=n), name, lora)


async def test_prompt_logprobs_with_an_adapter_go_alone_and_the_others_share() -> None:
    engine = Engine()
    rollouts = [final_outputs(engine, [request(f"r{i}a"), request(f"r{i}b")]) for i in range(6)]
    asking = [final_outputs(engine, [request(f"p{i}", prompt_logprobs=0), request(f"q{i}")]) for i in range(3)]
    base = final_outputs(engine, [request("base", prompt_logprobs=0, lora=None)])  # no adapter: shares
    answers = await asyncio.gather(*rollouts, *asking, base)
    assert answers[6] == ["p0", "q0"] and answers[0] == ["r0a", "r0b"]  # one answer a request, in order
    for i in range(3):
        assert [s for s in engine.together if f"p{i}" in s] == [{f"p{i}"}]  # alone, even from its own batch's q
    assert any(len(s) > 1 for s in engine.together if "base" in s or "r0a" in s)  # the others went together


async def test_prompt_logprobs_of_several_samples_with_an_adapter_are_refused() -> None:
    (answer,) = await final_outputs(Engine(), [request("p", prompt_logprobs=2, n=3)])
    assert isinstance(answer, ValueError) and "prompt_logprobs with n=3" in str(answer)
