"""Recipes: Python functions that return a RunConfig."""

from forge_nb.recipes.gsm8k import gsm8k_qwen3, gsm8k_tiny
from forge_nb.recipes.quickstart import quickstart

RECIPES = {"quickstart": quickstart, "gsm8k_qwen3": gsm8k_qwen3, "gsm8k_tiny": gsm8k_tiny}

__all__ = ["RECIPES", "gsm8k_qwen3", "gsm8k_tiny", "quickstart"]
