"""The model without a recurrence, as a registered entry: `ModelConfig.recurrence=None`
(`train` config `model.recurrence.type="none"`). It adds no parameters and carries a zero
state (the placeholder decoding and prefill keep for every model); the modes never call
its other functions, since a model without a recurrence has no recurrent span."""

from __future__ import annotations

import sys

import jax.numpy as jnp

from t2mlr_jax.config import ModelConfig
from t2mlr_jax.registry import RECURRENCES, RecurrenceType


def init_params(cfg: ModelConfig, rng):
  return None


def zero_state(cfg: ModelConfig, batch: int):
  return jnp.zeros((batch, cfg.d_model), jnp.float32)


def _no_span(*_, **__):
  raise ValueError("recurrence is None: this model has no recurrent span")


read = enter = memory = carry = _no_span
layer_module = plain_state = refresh_kv = None


def stats(_, cf_BT):
  return {}


def layer_stats(collected, cfg: ModelConfig) -> dict:
  return {}


def scalars(params, cfg: ModelConfig) -> dict:
  return {}


def value_embed_rows(params, cfg: ModelConfig, tokens_BT):
  return None


TYPE = RECURRENCES.register(RecurrenceType.from_module(sys.modules[__name__], name="none",
                                                       config=None))
