"""Ablation: T2MLR with recurrence over every layer (l_start=0, l_end=-1) instead of a
middle block. Same variants as s5_retrieval.py."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import s5_retrieval  # noqa: E402


def get_config(variant: str = ""):
  c = s5_retrieval.get_config(variant)
  c.name = "s5_retrieval_all_layers"
  c.model.recurrence.update(l_start=0, l_end=-1)
  return c
