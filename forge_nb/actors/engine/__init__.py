"""The vLLM engine a Generator drives: its start, its weight loads in the worker, its CPU layers and its LoRA lanes."""
