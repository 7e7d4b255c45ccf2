"""The decoder block every mode runs: pre-norm attention and MLP, with the backbone's
optional residual / x0 scalars, nanochat's value embeddings, and the per-layer memory
paths of a recurrence that feeds every layer (its `layer_module`)."""

from __future__ import annotations

from typing import Optional

import flax.linen as nn
import jax.numpy as jnp

from t2mlr_jax.config import ModelConfig
from t2mlr_jax.model import recurrence
from t2mlr_jax.model.layers import (
  KV,
  MLP,
  Attention,
  LayerSide,
  compute_dtype,
  norm,
  value_embed_mixer,
)


class Block(nn.Module):
  """Pre-norm decoder block; returns (x_out, KV): the sequence's own keys/values, or
  with a cache, the cache with this token's keys written at `index`.

  `window`: this layer's attention window (None: full). `ve`: (value-embedding rows
  [B, T, N_kv·K], gate kernel [C, N_kv]) of this layer (`value_embeds`; zeros on layers
  without a table), or with LRT (its value-embedding rows,). With `side.memory` the recurrence's per-layer module
  (`recurrence.layer_module`) adds its memory paths."""
  cfg: ModelConfig

  @nn.compact
  def __call__(self, x_BTD, rope, mask_BTS, kv: Optional[KV] = None, index=None,
               side: Optional[LayerSide] = None, window=None, ve=None,
               kernel_inputs=None, kv_source: Optional[str] = None):
    cfg = self.cfg
    dt = compute_dtype(cfg)
    x = x_BTD
    if cfg.resid_lambdas:
      x = self.param("resid_lambda", nn.initializers.ones, (), jnp.float32).astype(dt) * x
    if cfg.x0_lambdas:
      beta = self.param("x0_lambda", nn.initializers.constant(0.1), (), jnp.float32)
      x = x + beta.astype(dt) * side.x0
    if window is not None:
      mask_BTS = mask_BTS & (side.dist <= window)
    mix = None
    if side is not None and side.memory is not None:
      memory = recurrence.layer_module(cfg)(cfg, name="memory")
      x = memory.inject(x, side.memory)
    h = norm(cfg, "attn_norm")(x)
    if side is not None and side.memory is not None:
      mix = memory.mixer(h, side, ve)
    elif ve is not None:
      mix = value_embed_mixer(cfg, h, *ve)
    a, kv_out = Attention(cfg, name="attn")(h, rope, mask_BTS, kv, index, mix, kernel_inputs,
                                            window, kv_source)
    x = x + a
    h = norm(cfg, "mlp_norm")(x)
    return x + MLP(cfg, name="mlp")(h), kv_out
