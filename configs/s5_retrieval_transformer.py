"""Baseline: the same transformer as configs/s5_retrieval.py with RoPE and no recurrence.

Same variants as s5_retrieval.py (`:tiny`, `:paper`, `:word`, default).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import s5_retrieval  # noqa: E402


def get_config(variant: str = ""):
  c = s5_retrieval.get_config(variant)
  c.name = "s5_retrieval_transformer"
  c.model.recurrence.type = "none"
  c.model.rope_theta = 10000.0
  return c
