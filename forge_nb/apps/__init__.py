"""The documents' ``apps`` namespace: ``forge_nb.apps.grpo`` stands for torchforge's ``apps.grpo.main``."""
