"""Outside formats in and out: Hugging Face checkpoints and the official PyTorch release."""
