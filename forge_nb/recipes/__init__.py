"""Recipes: Python functions that return a RunConfig (``quickstart``, ``gsm8k_qwen3``)."""

from forge_nb.recipes.quickstart import quickstart

__all__ = ["quickstart"]
