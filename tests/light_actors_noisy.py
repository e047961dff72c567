"""Light actors that write logs as vLLM engines do, raise in a training step, or refuse sampling values (logs
view, traceback and hot-change tests).

Importable by module path in the spawned processes (tests/conftest.py puts the repository on
PYTHONPATH); kept apart from the test modules so those processes import nothing of pytest.
"""

from __future__ import annotations

import sys
import traceback
from typing import Any

from forge_nb.rl.types import Completions
from forge_nb.service import endpoint
from tests.light_actors import LightGenerator, LightTrainer


class ChattyGenerator(LightGenerator):
    """A LightGenerator whose process writes INFO, WARNING and ERROR lines (one with a traceback) to its
    output, and one line per weight version it loads."""

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        print("INFO chatty: engine up, 4 blocks of KV cache", flush=True)
        print("WARNING chatty: RotaryEmbedding: Failed to load weights (it recomputes them)", file=sys.stderr)
        try:
            raise ValueError("chatty: a recoverable engine failure")
        except ValueError:
            print("ERROR chatty: engine step failed; retrying", file=sys.stderr)
            traceback.print_exc()

    @endpoint
    async def update_weights(self, version: int) -> int:
        loaded = await super().update_weights(version)  # endpoints are callable on the actor itself
        print(f"INFO chatty: loaded version {version}", flush=True)
        return loaded


class FailingTrainer(LightTrainer):
    """A LightTrainer that raises in ``train_step`` at ``TrainerConfig.extra["fail_at_step"]``."""

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self.fail_at_step = (getattr(kwargs.get("trainer"), "extra", {}) or {}).get("fail_at_step")


class PickyGenerator(LightGenerator):
    """A LightGenerator that refuses top_p below 0.5 when a request comes, as vLLM refuses values it cannot
    serve that the config allows."""

    @endpoint
    async def generate(self, prompt: str, **overrides: Any) -> Completions:
        top_p = overrides.get("top_p", 1.0)
        if top_p < 0.5:
            raise ValueError(f"PickyGenerator: top_p={top_p} is below what this engine serves (0.5)")
        return await super().generate(prompt, **overrides)
