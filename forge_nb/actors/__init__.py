"""Model-bearing actors: Generator (vLLM), RLTrainer, ReferenceModel, and environment actors."""
