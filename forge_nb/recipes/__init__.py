"""Recipes: Python functions that return a RunConfig."""

from forge_nb.recipes.gsm8k import gsm8k_qwen3, gsm8k_tiny
from forge_nb.recipes.multi_turn import ECHO, GUESS_EPISODE, guess_the_number_qwen3, multi_turn_echo
from forge_nb.recipes.quickstart import quickstart

RECIPES = {"quickstart": quickstart, "gsm8k_qwen3": gsm8k_qwen3, "gsm8k_tiny": gsm8k_tiny}

# the multi-turn recipes are not among RECIPES: their runs need an environment service and an episode function that a
# config does not name (see its docstring and example_notebooks/08_multi_turn.py).
__all__ = ["ECHO", "GUESS_EPISODE", "RECIPES", "gsm8k_qwen3", "gsm8k_tiny", "guess_the_number_qwen3", "multi_turn_echo",
           "quickstart"]
