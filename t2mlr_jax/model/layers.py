"""Backbone building blocks: RMSNorm, RoPE, grouped-query attention, SwiGLU / relu², Block.

One `Block` serves every execution mode. Attention always reads its keys from an
explicit key/value array: the block's own fresh keys for a full sequence, a
preallocated cache the new keys are written into at `index` (token-by-token), or
a full-length buffer whose rows `index` are overwritten (LRT's interleaved passes).
Which keys a query may see is a boolean mask built once per forward
(`attention_mask`) and shared by all layers; a windowed layer narrows it with the
query-key distances in `LayerSide.dist`. Memory that a recurrence feeds into every
layer (LRT) arrives through `LayerSide` and the recurrence's per-layer module.
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple, Optional

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp

from t2mlr_jax.config import ModelConfig
from t2mlr_jax.model import kernels
from t2mlr_jax.model.attention import NEG_INF, attend


def compute_dtype(cfg: ModelConfig):
  return jnp.bfloat16 if cfg.dtype == "bfloat16" else jnp.float32


def matmul_fp32(a, b, scope: str):
  """a @ b with fp32 operands, fp32 accumulation and full precision on every backend
  (TPU's default is bf16 passes, recent GPUs' TF32): the recurrence's matmuls
  (docs/design.md#precision).
  `scope` names the op in the HLO metadata (jax.named_scope), where tests find it."""
  with jax.named_scope(scope):
    return jnp.matmul(a.astype(jnp.float32), b.astype(jnp.float32),
                      precision=jax.lax.Precision.HIGHEST, preferred_element_type=jnp.float32)


def dense_init(cfg: ModelConfig):
  return nn.initializers.normal(stddev=cfg.init_std)


def rms_normalize(x, eps: float):
  """x / sqrt(mean(x²) + eps) over the last axis, in fp32: the parameter-free norm."""
  x32 = x.astype(jnp.float32)
  return x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)


class RMSNorm(nn.Module):
  """x / rms(x) * scale, computed in fp32 (Llama convention); no scale (nanochat's
  parameter-free norm) when use_scale is False."""
  eps: float = 1e-5
  dtype: jnp.dtype = jnp.float32
  use_scale: bool = True

  @nn.compact
  def __call__(self, x):
    y = rms_normalize(x, self.eps)
    if not self.use_scale:
      return y.astype(self.dtype)
    scale = self.param("scale", nn.initializers.ones, (x.shape[-1],), jnp.float32)
    return (scale * y.astype(self.dtype)).astype(self.dtype)


def norm(cfg: ModelConfig, name: str):
  return RMSNorm(cfg.rms_norm_eps, compute_dtype(cfg), cfg.norm_scale, name=name)


def final_norm(params, cfg: ModelConfig, x_BTD):
  """The norm before the LM head (its input is what LRT's memory reads by default)."""
  return RMSNorm(cfg.rms_norm_eps, compute_dtype(cfg), cfg.norm_scale).apply(
      {"params": params.get("final_norm", {})}, x_BTD)


# ----------------------------------------------------------------------------- RoPE


def rope_inv_freq(cfg: ModelConfig) -> jnp.ndarray:
  """Inverse frequencies [head_dim/2], with optional `llama3` scaling (as in HF)."""
  dim = cfg.head_dim
  inv_freq = 1.0 / (cfg.rope_theta ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim))
  sc = cfg.rope_scaling
  if sc is None:
    return inv_freq
  low_wavelen = sc.original_max_position_embeddings / sc.low_freq_factor
  high_wavelen = sc.original_max_position_embeddings / sc.high_freq_factor
  wavelen = 2 * math.pi / inv_freq
  scaled = jnp.where(wavelen > low_wavelen, inv_freq / sc.factor, inv_freq)
  smooth = (sc.original_max_position_embeddings / wavelen - sc.low_freq_factor) / (
      sc.high_freq_factor - sc.low_freq_factor)
  smoothed = (1 - smooth) * scaled / sc.factor + smooth * scaled
  medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
  return jnp.where(medium, smoothed, scaled)


class Rope(NamedTuple):
  cos_BTK: jnp.ndarray   # K = head_dim
  sin_BTK: jnp.ndarray


def rope_tables(cfg: ModelConfig, positions_BT) -> Optional[Rope]:
  """cos/sin tables for the given position ids; None under NoPE."""
  if cfg.rope_theta is None:
    return None
  freqs = positions_BT.astype(jnp.float32)[..., None] * rope_inv_freq(cfg)
  emb = jnp.concatenate([freqs, freqs], axis=-1)
  cos, sin = jnp.cos(emb), jnp.sin(emb)
  if cfg.rope_table_dtype == "bfloat16":     # the LRT release's table, used in fp32
    cos, sin = (a.astype(jnp.bfloat16).astype(jnp.float32) for a in (cos, sin))
  return Rope(cos, sin)


def apply_rope(x_BTNK, rope: Optional[Rope]):
  if rope is None:
    return x_BTNK
  half = x_BTNK.shape[-1] // 2
  x32 = x_BTNK.astype(jnp.float32)
  rotated = jnp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
  cos, sin = rope.cos_BTK[:, :, None, :], rope.sin_BTK[:, :, None, :]
  return (x32 * cos + rotated * sin).astype(x_BTNK.dtype)


# ------------------------------------------------------------------------ attention


def attention_mask(q_slot_BT, k_valid_BS, q_doc_BT=None, k_doc_BS=None):
  """[B,T,S] bool: key slot s visible to query t (causal, valid key, same document)."""
  S = k_valid_BS.shape[1]
  mask = jnp.arange(S)[None, None, :] <= q_slot_BT[:, :, None]
  mask = mask & k_valid_BS[:, None, :]
  if q_doc_BT is not None:
    mask = mask & (k_doc_BS[:, None, :] == q_doc_BT[:, :, None])
  return mask


def write_kv(cache: "KV", new: "KV", index) -> "KV":
  """Write one token's keys/values [B, 1, N_kv, K] into a cache [B·N_kv, S, K] at slot
  `index` (in place when the cache is a loop carry)."""
  def put(c, n):
    n = n.reshape(c.shape[0], 1, n.shape[-1]).astype(c.dtype)    # [B·N_kv, 1, K]
    return jax.lax.dynamic_update_slice_in_dim(c, n, index, axis=1)
  return KV(put(cache.k, new.k), put(cache.v, new.v))


def to_cache(kv: "KV", cache_len: int) -> "KV":
  """A sequence's keys/values [..., B, T, N_kv, K] as a cache [..., B·N_kv, S, K],
  zero-padded to S = cache_len slots."""
  def conv(a):
    *lead, B, T, N, K = a.shape
    a = jnp.swapaxes(a, -3, -2).reshape(*lead, B * N, T, K)
    pad = [(0, 0)] * a.ndim
    pad[-2] = (0, cache_len - T)
    return jnp.pad(a, pad)
  return KV(conv(kv.k), conv(kv.v))


def from_cache(kv: "KV", batch: int) -> "KV":
  """The inverse of `to_cache` (without removing padding): [..., B, S, N_kv, K]."""
  def conv(a):
    *lead, BN, S, K = a.shape
    return jnp.swapaxes(a.reshape(*lead, batch, BN // batch, S, K), -3, -2)
  return KV(conv(kv.k), conv(kv.v))


class KV(NamedTuple):
  """Keys and values of one layer (or a stack of layers: a leading layer axis).

  A sequence's own keys are [B, T, N_kv, K]; a decode cache is [B·N_kv, S, K]
  (`to_cache`): the layout the attention dots read without a transposed copy, and
  without a size-1 batch axis, which at batch 1 makes XLA:CPU duplicate the in-place
  cache update (two full copies of every cache per token).
  """
  k: jnp.ndarray
  v: jnp.ndarray


KV_SOURCES = ("cache", "buffer")


class Attention(nn.Module):
  """Causal grouped-query self-attention with RoPE (or NoPE), optional q/k/v bias and
  QK-norm. `mix(k, v) -> (k, v, extra)`, when given, rewrites this layer's keys and values
  before RoPE (LRT's gated feedback); `extra` is returned beside the keys/values.

  Keys come from one of three places, named by `kv_source` (one of KV_SOURCES) when `kv`
  is given: the sequence's own fresh keys (kv None), a decode "cache" [B·N_kv, S, K] this
  token's keys are written into at slot `index`, or a full-length "buffer"
  [B, S, N_kv, K] whose rows `index` are overwritten (LRT-style refinement passes)."""
  cfg: ModelConfig

  @nn.compact
  def __call__(self, x_BTD, rope, mask_BTS, kv: Optional[KV] = None, index=None, mix=None,
               kernel_inputs=None, window=None, kv_source: Optional[str] = None):
    cfg = self.cfg
    dt = compute_dtype(cfg)
    N, Nk, K = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    dense = lambda feats, name, bias: nn.Dense(
        feats, use_bias=bias, dtype=dt, param_dtype=jnp.float32,
        kernel_init=dense_init(cfg), name=name)
    B, T, _ = x_BTD.shape
    q = dense(N * K, "q", cfg.qkv_bias)(x_BTD).reshape(B, T, N, K)
    k = dense(Nk * K, "k", cfg.qkv_bias)(x_BTD).reshape(B, T, Nk, K)
    v = dense(Nk * K, "v", cfg.qkv_bias)(x_BTD).reshape(B, T, Nk, K)
    extra = None
    if mix is not None:
      k, v, extra = mix(k, v)
    q, k = apply_rope(q, rope), apply_rope(k, rope)
    if cfg.qk_norm:
      q = rms_normalize(q, cfg.rms_norm_eps).astype(q.dtype)
      k = rms_normalize(k, cfg.rms_norm_eps).astype(k.dtype)
    if kv is None:          # a full sequence: its own keys, mask [B, T, T]
      chex.assert_shape(mask_BTS, (B, T, T))
      if kernel_inputs is None:
        out = attend(q, k, v, mask_BTS)
      else:                 # a fused kernel (model/kernels.py), causal within documents
        impl = kernels.resolve(cfg.attention, cfg.dtype, head_dim=cfg.head_dim)
        out = kernels.attend_full(impl, q, k, v, mask_BTS, kernel_inputs, window,
                                  cfg.layer_windows or ())
    elif kv_source == "buffer":  # rows `index` of a full-length buffer [B, S, N_kv, K] rewritten
      kv = KV(kv.k.at[:, index].set(k.astype(kv.k.dtype)),
              kv.v.at[:, index].set(v.astype(kv.v.dtype)))
      chex.assert_shape(mask_BTS, (B, T, kv.k.shape[1]))
      out = attend(q, kv.k.astype(dt), kv.v.astype(dt), mask_BTS)
    elif kv_source == "cache":   # one new token: written into the cache first, then attends
      if T != 1:
        raise ValueError(f"attention over a cache takes one token per step, got T={T}")
      kv = write_kv(kv, KV(k, v), index)
      S = kv.k.shape[1]
      chex.assert_shape(mask_BTS, (B, 1, S))
      q = q.reshape(B * Nk, N // Nk, K)                          # [B·N_kv, G, K]
      logits = jnp.einsum("xgk,xsk->xgs", q, kv.k.astype(dt),
                          preferred_element_type=jnp.float32) / math.sqrt(K)
      mask = jnp.repeat(mask_BTS, Nk, axis=0)                    # [B·N_kv, 1, S]
      probs = jnp.where(mask, jax.nn.softmax(jnp.where(mask, logits, NEG_INF), axis=-1), 0.0)
      out = jnp.einsum("xgs,xsk->xgk", probs.astype(dt), kv.v.astype(dt))
    else:
      raise ValueError(f"kv_source={kv_source!r} is invalid with kv given: allowed one of "
                       f"{KV_SOURCES}")
    out = out.reshape(B, T, N * K)
    y = nn.Dense(cfg.d_model, use_bias=False, dtype=dt, param_dtype=jnp.float32,
                 kernel_init=dense_init(cfg), name="o")(out)
    kv_out = KV(k, v) if kv is None else kv
    return y, (kv_out if extra is None else (kv_out, extra))


@jax.custom_vjp
def swiglu(x, w_gate, w_up, w_down):
  """down(silu(x @ gate) * (x @ up)) over any leading dims.

  The backward is written out (saving x, x@gate and x@up): from autodiff's version
  XLA:CPU emits transposing elementwise fusions, making the MLP's forward+backward
  3.4× slower at d_model 64 and 1.4× at the 135M shape (docs/performance.md). Same
  math, same dtype as autodiff's (tests/model/test_layers.py).
  """
  return _swiglu_fwd(x, w_gate, w_up, w_down)[0]


def _swiglu_fwd(x, w_gate, w_up, w_down):
  g, u = x @ w_gate, x @ w_up
  return (jax.nn.silu(g) * u) @ w_down, (x, g, u, w_gate, w_up, w_down)


def _swiglu_bwd(res, dy):
  x, g, u, w_gate, w_up, w_down = res
  s = jax.nn.sigmoid(g)
  a = g * s                                   # silu(g)
  dh = dy @ w_down.T
  dg = dh * u * (s * (1 + g * (1 - s)))       # silu'(g) = s (1 + g (1 - s))
  du = dh * a
  flat = lambda t: t.reshape(-1, t.shape[-1])
  dw_down = flat(a * u).T @ flat(dy)
  dw_gate = flat(x).T @ flat(dg)
  dw_up = flat(x).T @ flat(du)
  dx = dg @ w_gate.T + du @ w_up.T
  return dx, dw_gate, dw_up, dw_down


swiglu.defvjp(_swiglu_fwd, _swiglu_bwd)


class _Kernel(nn.Module):
  """A bare [in, out] kernel under `name/kernel`: nn.Dense's layout and init RNG."""
  shape: tuple
  init: Callable

  @nn.compact
  def __call__(self):
    return self.param("kernel", self.init, self.shape, jnp.float32)


class MLP(nn.Module):
  """SwiGLU: down(silu(gate(x)) * up(x)), or relu²: down(relu(up(x))²) (nanochat);
  parameters as nn.Dense kernels."""
  cfg: ModelConfig

  @nn.compact
  def __call__(self, x_BTD):
    cfg = self.cfg
    dt = compute_dtype(cfg)
    D, F = cfg.d_model, cfg.d_ff
    kernel = lambda shape, name: _Kernel(shape, dense_init(cfg), name=name)().astype(dt)
    if cfg.mlp_type == "relu2":
      w_up, w_down = kernel((D, F), "up"), kernel((F, D), "down")
      return jnp.square(jax.nn.relu(x_BTD.astype(dt) @ w_up)) @ w_down
    w_gate, w_up = kernel((D, F), "gate"), kernel((D, F), "up")
    w_down = kernel((F, D), "down")
    return swiglu(x_BTD.astype(dt), w_gate, w_up, w_down)


def value_embed_mixer(cfg: ModelConfig, a_BTD, rows_BTF, gate_CM):
  """nanochat's value embeddings: v += 2σ(a[:C] W) · ve[token], one gate per KV head."""
  B, T, _ = a_BTD.shape
  C = cfg.ve_gate_channels or cfg.d_model
  g = 2.0 * jax.nn.sigmoid(a_BTD[..., :C].astype(jnp.float32) @ gate_CM)
  g = g.astype(compute_dtype(cfg))[..., None]
  rows = rows_BTF.astype(compute_dtype(cfg)).reshape(B, T, cfg.n_kv_heads, cfg.head_dim)
  return lambda k, v: (k, v + g * rows, None)


class LayerSide(NamedTuple):
  """What a layer reads besides x, shared by all layers of one call (None: unused).

  x0: the normed embedding (β_i·x0, `x0_lambdas`); memory [B, T, D] fp32: the
  recurrence's memory entering every layer (LRT); tokens [B, T]: ids for value
  embeddings; shared: the recurrence's parameters shared by all layers; dist [B, T, S]:
  query-key slot distances for windowed layers; keep: (static) also return the
  recurrence's per-layer extras (LRT's K/V refresh)."""
  x0: Optional[jnp.ndarray] = None
  memory: Optional[jnp.ndarray] = None
  tokens: Optional[jnp.ndarray] = None
  shared: Optional[dict] = None
  dist: Optional[jnp.ndarray] = None
  keep: bool = False
