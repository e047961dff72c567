"""What a Generator's prompt may be, and how it becomes the engine's input.

A prompt is a string or token ids (a list of ints, or a 1-D integer tensor fed as it is: what a multi-turn episode
sends, so each turn sees exactly the tokens of the turns before it). Anything else is that prompt's own TypeError,
answered for it alone while the others of a batch go on. Token ids and short strings are rendered on the actor's
loop: for them the hop to vLLM's tokenizer pool and back (two thread wake-ups) costs more than tokenizing; a long
string is tokenized in the pool, so the loop is not held while it is.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RENDER_HERE_CHARS", "prompt_or_error", "render"]

#: Prompt strings up to this many characters are tokenized on the actor's loop, longer ones in vLLM's pool.
RENDER_HERE_CHARS = 2048


def prompt_or_error(prompt: Any) -> str | list[int] | TypeError:
    """A prompt string, or token ids as a list of ints; anything else gives a TypeError that says what fits."""
    import torch

    if isinstance(prompt, torch.Tensor) and prompt.dim() == 1 and not prompt.is_floating_point():
        prompt = prompt.tolist()
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt
                                   and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)):
        return prompt
    return TypeError(f"generate() takes one prompt: a string or token ids (a non-empty list of ints or a 1-D "
                    f"integer tensor), got {type(prompt).__name__}; for many prompts call generate once per "
                    "prompt, concurrently (they batch in the engine)")


async def render(engine: Any, prompt: str | list[int] | Exception) -> Any:
    """The engine's input for ``prompt`` (an exception in its place is raised: that prompt's own error)."""
    from vllm.renderers.inputs.preprocess import parse_model_prompt

    if isinstance(prompt, Exception):
        raise prompt
    parsed = [parse_model_prompt(engine.model_config, prompt)]
    if isinstance(prompt, str) and len(prompt) > RENDER_HERE_CHARS:
        (engine_input,) = await engine.renderer.render_cmpl_async(parsed)
    else:
        (engine_input,) = engine.renderer.render_cmpl(parsed)
    return engine_input
