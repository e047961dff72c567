"""The documents' ``forge.data`` namespace: ``forge_nb.data.rewards`` holds MathReward and ThinkingReward."""
