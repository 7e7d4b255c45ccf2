"""Start from a pretrained model: a Hugging Face directory or a parameter export.

Used by training (`model.init_from`) for retrofits: the pretrained weights with a
recurrence added, of any type that declares how (`retrofit`: T2MLR, γ = 0; LRT with
init="identity"; a user's), so the first forward equals the pretrained model.
"""

from __future__ import annotations

import json
import os
from typing import Optional

from absl import logging

from t2mlr_jax import checkpoint
from t2mlr_jax.config import ModelConfig, RecurrenceConfig
from t2mlr_jax.convert import hf


def pretrained_config(path: str, **overrides) -> ModelConfig:
  """The base model's ModelConfig (no recurrence unless overridden). A max_seq_len beyond
  the pretrained context is allowed (positions there were never trained) and logged."""
  if "recurrence" in overrides:
    overrides["recurrence"] = hf.check_retrofit(overrides["recurrence"], "model.init_from")
  if checkpoint.is_export(path) or _is_run(path):
    base = _saved_config(path)
    if not isinstance(base, ModelConfig):
      raise ValueError(f"{path} holds a {type(base).__name__}, not a transformer")
    base = base.replace(recurrence=None)
  elif os.path.isfile(os.path.join(path, "config.json")):
    with open(os.path.join(path, "config.json")) as f:
      base = hf.config_from_hf(json.load(f))
  else:
    raise ValueError(f"model.init_from={path!r} is neither a Hugging Face directory "
                     "(config.json), a parameter export (model.json) nor a training workdir "
                     "(checkpoints/<step>)")
  longer = overrides.get("max_seq_len")
  if longer is not None and longer > base.max_seq_len:
    logging.warning("model.max_seq_len=%d exceeds the pretrained model's context of %d "
                    "tokens (%s): positions beyond it were never trained", longer,
                    base.max_seq_len, path)
  return base.replace(**overrides)


def _is_run(path: str) -> bool:
  """A training workdir with a saved step (its latest is what init_from loads: a run
  fine-tuned further, e.g. RL after SFT)."""
  return bool(checkpoint.saved_steps(path))


def _saved_config(path: str):
  """The model config an export or a workdir's latest checkpoint records."""
  if checkpoint.is_export(path):
    with open(os.path.join(path, checkpoint.EXPORT_CONFIG)) as f:
      return checkpoint.model_config_from_meta(json.load(f))
  return checkpoint.load_model_config(path)


def load_pretrained(path: str, *, recurrence: Optional[RecurrenceConfig], seed: int = 0):
  """(cfg, params): the pretrained weights, with `recurrence` (fresh, keeping the
  pretrained function: its type's `retrofit`, unless the export already holds that
  recurrence's weights, the same leaves of the same shapes) or without one."""
  recurrence = hf.check_retrofit(recurrence, "model.init_from")
  if not (checkpoint.is_export(path) or _is_run(path)):
    return hf.from_hf(path, recurrence=recurrence, seed=seed)
  saved_cfg, params = checkpoint.load(path)
  base, old = hf.split_base(params, saved_cfg)
  cfg = saved_cfg.replace(recurrence=recurrence)
  if recurrence is None:
    return cfg, base
  fresh = hf.retrofit(cfg, base, seed)
  _, new = hf.split_base(fresh, cfg)
  shape = lambda leaves: {p: tuple(v.shape) for p, v in leaves.items()}
  if type(saved_cfg.recurrence) is type(recurrence) and shape(old) == shape(new):
    return cfg, params                     # the export's own recurrence weights
  return cfg, fresh
