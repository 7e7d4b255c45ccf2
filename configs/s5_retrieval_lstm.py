"""Baseline: an LSTM language model (tied embeddings; 4 layers, H 360, lr 5e-3 in the
paper: docs/training.md). For the CPU variants the width is chosen so the parameter count
matches the T2MLR model of s5_retrieval.py within 10%."""

import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from t2mlr_jax.train.config import model_config  # noqa: E402

import s5_retrieval  # noqa: E402


def matched_width(target_params: int, vocab: int, layers: int) -> int:
  """Hidden size H with 8H² + 4H per layer + vocab·H (tied) ≈ target_params."""
  a, b = 8 * layers, 4 * layers + vocab
  return max(8, int(round((-b + math.sqrt(b * b + 4 * a * target_params)) / (2 * a))))


def get_config(variant: str = ""):
  c = s5_retrieval.get_config(variant)
  c.name = "s5_retrieval_lstm"
  target = model_config(c).num_params()
  c.model.arch = "lstm"
  c.model.tie_embeddings = True
  # PyTorch's nn.Embedding init, N(0, 1): with Llama's 0.02 the tied LSTM stayed at
  # chance on the S3 word problem (seq. acc. 0.02 at 4 actions after 2000 steps).
  c.model.init_std = 1.0
  c.model.recurrence.type = "none"
  if variant == "paper":
    c.model.update(d_model=360, n_layers=4)
    c.optimizer.lr = 5e-3
  else:
    c.model.d_model = matched_width(target, c.model.vocab_size, c.model.n_layers)
  return c
