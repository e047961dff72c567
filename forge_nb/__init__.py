"""forge_nb: interactive RL post-training from a Jupyter kernel on Monarch, vLLM, TorchTitan and TorchStore.

Importing forge_nb has no side effects: monarch, torch and vLLM load the first time something needs
them. ``%load_ext forge_nb`` registers the ``%forge_*`` magics.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> module that defines it (imported on first access)
_EXPORTS = {
    "ResourceError": "forge_nb.system.hosts.gpus",
    "spawn_mesh": "forge_nb.system.runtime.spawning",
    "meshes": "forge_nb.system.runtime.registry",
    "stop_all": "forge_nb.system.runtime.registry",
    "end_process": "forge_nb.system.runtime.lifecycle",
    "use_job": "forge_nb.system.hosts.cluster",
    "release_job": "forge_nb.system.hosts.cluster",
    "SlurmJob": "forge_nb.system.hosts.slurm",  # no runtime start: its transport is chosen before the first context
    "spawn": "forge_nb.run",
    "resume": "forge_nb.run",
    "Run": "forge_nb.run",
    "live_runs": "forge_nb.run",
    "shutdown_all": "forge_nb.run",
    "RunConfig": "forge_nb.config",
    "from_yaml": "forge_nb.config",
    "quickstart": "forge_nb.recipes",
    "MetricsStore": "forge_nb.metrics",
    "ForgeActor": "forge_nb.service",
    "endpoint": "forge_nb.service",
    "Service": "forge_nb.service",
    "ActorFailure": "forge_nb.service",
    "ActorStartFailed": "forge_nb.service",
    "ReplicaDied": "forge_nb.service",
    "NoHealthyReplica": "forge_nb.service",
    "Generator": "forge_nb.actors.generator",
    "Policy": "forge_nb.actors.generator",
    "RLTrainer": "forge_nb.actors.trainer",
    "TitanTrainer": "forge_nb.actors.trainer",
    "ReferenceModel": "forge_nb.actors.reference_model",
    "ReplayBuffer": "forge_nb.rl",
    "SandboxedPythonCoder": "forge_nb.actors.coder",
    "DatasetActor": "forge_nb.actors.dataset",
    "RewardActor": "forge_nb.actors.reward",
    "ComputeAdvantages": "forge_nb.actors.advantages",
    "SeedBatch": "forge_nb.rl.types",
    "Episode": "forge_nb.rl",
    "Completion": "forge_nb.rl",
    "Completions": "forge_nb.rl.types",
    "TextTrainBatch": "forge_nb.rl.types",
    "ForwardBackwardResult": "forge_nb.rl.types",
}

__all__ = sorted([*_EXPORTS, "load_ipython_extension", "unload_ipython_extension", "__version__"])


# Modules that import monarch: forge_nb starts its runtime first, because monarch reads its
# settings from the environment when it is imported (see forge_nb.system.runtime.lifecycle).
_USES_MONARCH = ("forge_nb.system.hosts.cluster", "forge_nb.service", "forge_nb.actors", "forge_nb.run")


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'forge_nb' has no attribute {name!r}")
    if module.startswith(_USES_MONARCH):
        from forge_nb.system.runtime import lifecycle

        lifecycle.ensure_started()
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext forge_nb``: register the %forge_* magics."""
    from forge_nb.magics import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    from forge_nb.magics import unload_ipython_extension as unload

    unload(ipython)
