"""Recipes: Python functions that return a RunConfig."""

from forge_nb.recipes.gsm8k import gsm8k_qwen3, gsm8k_tiny
from forge_nb.recipes.multi_turn import ECHO, multi_turn_echo
from forge_nb.recipes.quickstart import quickstart

RECIPES = {"quickstart": quickstart, "gsm8k_qwen3": gsm8k_qwen3, "gsm8k_tiny": gsm8k_tiny}

# multi_turn_echo is not among RECIPES: its run needs an environment service and an episode function that a
# config does not name (see its docstring and example_notebooks/08_multi_turn.py).
__all__ = ["ECHO", "RECIPES", "gsm8k_qwen3", "gsm8k_tiny", "multi_turn_echo", "quickstart"]
