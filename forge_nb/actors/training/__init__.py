"""What RLTrainer runs on: its policy model, losses, batches, LoRA adapters, checkpoints and Tinker calls."""
