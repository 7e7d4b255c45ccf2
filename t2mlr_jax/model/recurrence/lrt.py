"""LRT's temporal pathway (SPEC §4, golden/README.md): the previous token's normed hidden
state m_t fed back into every layer.

Before block i: x ← x + γ_i·m (after the backbone's α_i·x + β_i·x0). Inside block i,
with a = norm(x): a triple gate g = 2σ(a[:C] W_g,i), one scalar per KV head split
[local | fb | ve], mixes the layer's keys and values before RoPE and QK-norm:

    k = g_local·k + g_fb·(W_k,i m)        v = g_local·v + g_fb·(W_v,i m) + g_ve·ve_i[token]

so the KV cache keeps its shape (with the key path off, k is left as it is). m_t is the source layer's normed output at t−1: the
LM head's input (source_layer = -1, the release) or the parameter-free-normed output
of layer k. The interface of `recurrence/__init__.py`: `enter` is the identity (memory
enters inside the layers, through `memory` and `LRTLayer`); `carry` is the normed
source output. Everything the memory touches runs in fp32 and is cast to the compute
dtype where it joins the stream.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from t2mlr_jax.config import LRTConfig, ModelConfig
from t2mlr_jax.model.layers import (LayerSide, compute_dtype, final_norm, matmul_fp32,
                                    rms_normalize)
from t2mlr_jax.model.recurrence.t2mlr import CF_PAD, CF_RECURRENT


def _uniform(bound: float):
  return lambda key, shape, dtype=jnp.float32: jax.random.uniform(key, shape, dtype, -bound,
                                                                   bound)


def _feedback_init(cfg: ModelConfig):
  """The release's U(-s, s) with s = √3/√d_model (std 1/√d_model); zeros for "identity"."""
  if cfg.recurrence.init == "identity":
    return nn.initializers.zeros
  return _uniform(math.sqrt(3.0) / math.sqrt(cfg.d_model))


def init_params(cfg: ModelConfig, rng):
  """LRT-shared's one W_k/W_v pair ({"w_k", "w_v"}: [D, N_kv·K]); None when layerwise."""
  rcfg: LRTConfig = cfg.recurrence
  if rcfg.projection != "shared":
    return None
  shape, init = (cfg.d_model, cfg.n_kv_heads * cfg.head_dim), _feedback_init(cfg)
  k_k, k_v = jax.random.split(rng)
  out = {}
  if rcfg.key:
    out["w_k"] = init(k_k, shape, jnp.float32)
  if rcfg.value:
    out["w_v"] = init(k_v, shape, jnp.float32)
  return out or None


class LRTLayer(nn.Module):
  """One layer's memory paths. Parameters (under the block's `memory`): gamma [],
  w_k / w_v [D, N_kv·K] (layerwise), ve [V_padded, N_kv·K], gate [C, 3·N_kv]."""
  cfg: ModelConfig

  def setup(self):
    cfg, rcfg = self.cfg, self.cfg.recurrence
    kv = cfg.n_kv_heads * cfg.head_dim
    init = _feedback_init(cfg)
    if rcfg.residual:
      gamma0 = 0.0 if rcfg.init == "identity" else 0.1
      self.gamma = self.param("gamma", nn.initializers.constant(gamma0), (), jnp.float32)
    if rcfg.projection == "layerwise":
      if rcfg.key:
        self.w_k = self.param("w_k", init, (cfg.d_model, kv), jnp.float32)
      if rcfg.value:
        self.w_v = self.param("w_v", init, (cfg.d_model, kv), jnp.float32)
    if rcfg.value_embeds:
      self.ve = self.param("ve", init, (cfg.padded_vocab, kv), jnp.float32)
    channels = rcfg.gate_channels or cfg.d_model
    self.gate = self.param("gate", nn.initializers.zeros, (channels, 3 * cfg.n_kv_heads),
                           jnp.float32)

  def inject(self, x_BTD, m_BTD):
    """x + γ·m (the residual injection before the block)."""
    if not self.cfg.recurrence.residual:
      return x_BTD
    return x_BTD + (self.gamma * m_BTD).astype(x_BTD.dtype)

  def mixer(self, a_BTD, side: LayerSide, ve=None):
    """The function Attention applies to its fresh (k, v) before RoPE: the triple-gated
    mix with the memory's projections and the token's value embedding (`ve`: (rows
    [B, T, N_kv·K],) gathered by the caller, else looked up here)."""
    cfg, rcfg = self.cfg, self.cfg.recurrence
    dt = compute_dtype(cfg)
    B, T, _ = a_BTD.shape
    M, K = cfg.n_kv_heads, cfg.head_dim
    C = rcfg.gate_channels or cfg.d_model
    g = 2.0 * jax.nn.sigmoid(matmul_fp32(a_BTD[..., :C], self.gate, "lrt_gate"))  # [B,T,3M]
    # mean [local, fb, ve] gate over every position and head, kept only when the caller
    # asks for "intermediates" (`LayerCtx.collect`, the training schedules' metrics)
    self.sow("intermediates", "gates", jnp.mean(g.reshape(B * T, 3, M), axis=(0, 2)))
    g = g.astype(dt)[..., None]
    g_local, g_fb, g_ve = g[:, :, :M], g[:, :, M:2 * M], g[:, :, 2 * M:]
    m = side.memory
    heads = lambda a: a.astype(dt).reshape(B, T, M, K)
    proj = lambda name: heads(matmul_fp32(
        m, getattr(self, name) if rcfg.projection == "layerwise" else side.shared[name],
        f"lrt_feedback_{name}"))
    k_fb = proj("w_k") if rcfg.key else None
    v_fb = proj("w_v") if rcfg.value else None
    v_ve = None
    if rcfg.value_embeds:
      v_ve = heads(ve[0] if ve is not None else self.ve[side.tokens])

    def mix(k, v):
      if k_fb is not None:          # as the release: without key feedback k is left as is
        k = g_local * k + g_fb * k_fb
      v = g_local * v
      if v_fb is not None:
        v = v + g_fb * v_fb
      if v_ve is not None:
        v = v + g_ve * v_ve
      return k, v, ((k, g_fb[..., 0]) if side.keep else None)
    return mix


layer_module = LRTLayer


def zero_state(cfg: ModelConfig, batch: int):
  return jnp.zeros((batch, cfg.d_model), jnp.float32)


def read(cfg: ModelConfig, state_BTD, positions_BT, slots_BT):
  """Zero memory where the position id is 0 (reset_at_segment_start, ours: packed
  documents and left padding), or only at slot 0 (the release)."""
  start = positions_BT == 0 if cfg.recurrence.reset_at_segment_start else slots_BT == 0
  return jnp.where(start[..., None], 0.0, state_BTD)


def enter(params, cfg: ModelConfig, h_BTD, state_BTD, cf_BT):
  return h_BTD, None


def memory(cfg: ModelConfig, state_BTD, cf_BT):
  """What every layer reads: m at recurrent (cf 2) positions, zero elsewhere."""
  return jnp.where((cf_BT == CF_RECURRENT)[..., None], state_BTD, 0.0).astype(jnp.float32)


def carry(params, cfg: ModelConfig, o_BTD, state_BTD, cf_BT):
  """m for the next position: the LM head's input (source -1, with the final norm's
  scale when the backbone has one) or the parameter-free-normed output of layer k;
  zero at padding."""
  if cfg.recurrence.source_layer == -1:
    h = final_norm(params, cfg, o_BTD).astype(jnp.float32)
  else:
    h = rms_normalize(o_BTD, cfg.rms_norm_eps)
  return jnp.where((cf_BT == CF_PAD)[..., None], 0.0, h)


def stats(_, cf_BT):
  return {}
