"""GeneratorArgs: the Generator's own arguments (vLLM's ``engine_args`` and default ``sampling_params``), checked.

The Generator keeps what it was given in ``__init__`` and builds these in ``setup()``, so a wrong argument reaches
the caller as an error of the setup call instead of killing the actor. The seeds' names and their aliases
(``engine_config``, ``sampling_config``, ``model=``) all arrive here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from forge_nb.actors.engine.worker import WORKER_EXTENSION

__all__ = ["GeneratorArgs"]


def _as_dict(value: Mapping[str, Any] | None) -> Any:
    """A copy of a mapping (None: empty); anything else is left for GeneratorArgs to refuse."""
    return {} if value is None else dict(value) if isinstance(value, Mapping) else value


@dataclass(kw_only=True, slots=True)
class GeneratorArgs:
    """The Generator's own arguments, in the seeds' shape (``policy.engine_args``/``sampling_params``);
    replicas and GPUs are ``forge_nb.config.GeneratorConfig``'s business."""

    engine_args: dict[str, Any] = field(default_factory=dict)
    """vLLM ``AsyncEngineArgs`` fields; ``model`` (a local folder or hub id) is required."""
    sampling_params: dict[str, Any] = field(default_factory=dict)
    """Default vLLM ``SamplingParams`` fields; ``generate(prompt, **overrides)`` changes them per call."""

    def __post_init__(self) -> None:
        for name in ("engine_args", "sampling_params"):
            if not isinstance(getattr(self, name), dict):
                raise TypeError(f"{name}={getattr(self, name)!r}: must be a dict of vLLM fields, as in "
                                "torchforge's YAML (e.g. sampling_params={'n': 8, 'max_tokens': 512})")
        model = self.engine_args.get("model")
        if not isinstance(model, str) or not model:
            raise ValueError(
                f"engine_args['model']={model!r}: the Generator needs a model. Pass model='Qwen/Qwen3-1.7B' "
                "(a hub id or a local folder, e.g. forge_nb.models.build_tiny_model(path)) or put it in "
                "engine_args"
            )
        if self.engine_args.get("worker_extension_cls") not in (None, "", WORKER_EXTENSION):
            raise ValueError(
                f"engine_args['worker_extension_cls']={self.engine_args['worker_extension_cls']!r}: the "
                f"Generator loads weights through its own extension ({WORKER_EXTENSION}); leave it unset"
            )

    @property
    def model(self) -> str:
        return str(self.engine_args["model"])

    @classmethod
    def from_args(cls, engine_args: Mapping[str, Any] | None = None,
                  sampling_params: Mapping[str, Any] | None = None, *, model: str | None = None,
                  engine_config: Mapping[str, Any] | None = None,
                  sampling_config: Mapping[str, Any] | None = None) -> GeneratorArgs:
        """Accept the seeds' names and their aliases (``engine_config``, ``sampling_config``)."""
        if engine_args is not None and engine_config is not None:
            raise ValueError("engine_args and engine_config name the same thing; pass only one")
        if sampling_params is not None and sampling_config is not None:
            raise ValueError("sampling_params and sampling_config name the same thing; pass only one")
        args = _as_dict(engine_args if engine_args is not None else engine_config)
        sampling = _as_dict(sampling_params if sampling_params is not None else sampling_config)
        if model is not None and isinstance(args, dict):
            if args.get("model") not in (None, model):
                raise ValueError(
                    f"model={model!r} but engine_args['model']={args['model']!r}; pass the model once")
            args["model"] = model
        return cls(engine_args=args, sampling_params=sampling)
