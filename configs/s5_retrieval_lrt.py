"""LRT on the S5 tasks: the shape, data, optimizer and budget of s5_retrieval.py with the
Latent Recurrent Transformer's memory instead of T2MLR's, on the same Llama backbone
(SwiGLU, scaled RMSNorm, NoPE on the CPU variants), so a comparison isolates the
recurrence. Trained with interleaved passes (S = schedule_options.passes, default 2; set
train.mode=chunked or multi_refine for the baselines); evaluated with the exact
recurrence.

Same variants as s5_retrieval.py (default, `word`, `tiny`, `paper`).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from t2mlr_jax.train.config import recurrence_config, schedule_options_config  # noqa: E402

import s5_retrieval  # noqa: E402


def get_config(variant: str = ""):
  c = s5_retrieval.get_config(variant)
  c.name = "s5_retrieval_lrt"
  # The release's LRT-layerwise: memory = the LM head's input, residual + key/value +
  # value-embedding paths, gates reading 32 channels (all of them at d_model 32).
  c.model.recurrence = recurrence_config("lrt", source_layer=-1,
                                         gate_channels=min(32, c.model.d_model))
  c.model.schedule_options = schedule_options_config(passes=2)   # T2MLR's depths dropped
  c.train.mode = "auto"                       # interleaved
  return c
