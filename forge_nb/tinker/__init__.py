"""The Tinker API on a live run: ``await run.serve_tinker()`` serves the ``tinker`` SDK's calls (pinned 0.38.0), each
training client a LoRA run on the run's base (``forge_nb.tinker.server``)."""

from forge_nb.tinker.server import TinkerServer

__all__ = ["TinkerServer"]
