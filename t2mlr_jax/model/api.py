"""One entry point over every model family: the transformer (with or without
recurrence) and the LSTM baseline, for training and evaluation loops."""

from __future__ import annotations

from typing import Union

from t2mlr_jax.config import ModelConfig
from t2mlr_jax.model import lstm
from t2mlr_jax.model.modes import forward
from t2mlr_jax.model.transformer import init_params

AnyModelConfig = Union[ModelConfig, lstm.LSTMConfig]


def init_model(cfg: AnyModelConfig, rng):
  if isinstance(cfg, lstm.LSTMConfig):
    return lstm.init_params(cfg, rng)
  return init_params(cfg, rng)


def apply_model(params, cfg: AnyModelConfig, batch, mode: str):
  """(logits, aux) of a batch dict with input_ids [B,T] and optional control_flow,
  positions, segment_ids. The LSTM ignores control flow and mode."""
  if isinstance(cfg, lstm.LSTMConfig):
    return lstm.forward(params, cfg, batch["input_ids"]), {}
  return forward(params, cfg, batch["input_ids"], mode=mode,
                 control_flow=batch.get("control_flow"), positions=batch.get("positions"),
                 segment_ids=batch.get("segment_ids"), return_aux=True)


def num_params(cfg: AnyModelConfig) -> int:
  return cfg.num_params()
