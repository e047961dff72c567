"""The documents' ``forge.data`` namespace: ``forge_nb.data.rewards`` holds MathReward and ThinkingReward;
``forge_nb.data.sft`` the supervised examples (``SftData``) that ``run.sft()`` trains on."""
