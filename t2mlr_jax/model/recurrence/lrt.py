"""LRT's temporal pathway (docs/models.md, "LRT"; tests/golden/README.md): the previous
token's normed hidden state m_t fed back into every layer.

Before block i: x ← x + γ_i·m (after the backbone's α_i·x + β_i·x0). Inside block i,
with a = norm(x): a triple gate g = 2σ(a[:C] W_g,i), one scalar per KV head split
[local | fb | ve], mixes the layer's keys and values before RoPE and QK-norm:

    k = g_local·k + g_fb·(W_k,i m)        v = g_local·v + g_fb·(W_v,i m) + g_ve·ve_i[token]

so the KV cache keeps its shape (with the key path off, k is left as it is). m_t is the source layer's normed output at t−1: the
LM head's input (source_layer = -1, the release) or the parameter-free-normed output
of layer k. This module is LRT's side of the interface of `recurrence/__init__.py`:
`enter` is the identity (memory enters inside the layers, through `memory` and
`LRTLayer`); `carry` is the normed source output; it declines the Jacobi hook
`plain_state` (sweep 0 runs with zero memory) and implements `refresh_kv` (the K/V
refresh of the refinement passes). Everything the memory touches runs in fp32 and is cast to the compute
dtype where it joins the stream.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from t2mlr_jax.config import ModelConfig, RecurrenceConfig, invalid
from t2mlr_jax.model.control_flow import CF_PAD, CF_RECURRENT
from t2mlr_jax.model.layers import (
  KV,
  LayerSide,
  apply_rope,
  compute_dtype,
  final_norm,
  matmul_fp32,
  rms_normalize,
)
from t2mlr_jax.registry import RECURRENCES, RecurrenceType

LRT_PROJECTIONS = ("layerwise", "shared")
LRT_INITS = ("official", "identity")


@dataclasses.dataclass(frozen=True)
class LRTConfig(RecurrenceConfig):
  """Latent Recurrent Transformer (docs/models.md): the previous token's normed hidden
  state m_t fed back into every layer (residual γ_i·m, gated key/value feedback).

  source_layer: -1 = the input of the LM head (the final normed state, as the
  release); k = the parameter-free-normed output of layer k. `residual`, `key`,
  `value`, `value_embeds`: which feedback paths exist (the paper's ablations).
  projection: "layerwise" (W_k, W_v per layer) or "shared" (one pair for all layers).
  gate_channels: channels of norm(x) the triple gate reads (0 = all d_model).
  init: "official" (the release's init_weights) or "identity" (γ = 0 and zero
  feedback weights: a fresh model computes exactly its base transformer).
  reset_at_segment_start: memory is zero wherever the position id is 0 (packed
  documents, left padding); False is the release, which zeroes it only at t = 0.
  """
  type: ClassVar[str] = "lrt"
  default_schedule: ClassVar[str] = "interleaved"   # train.mode "auto"
  parallel_runs_mixer: ClassVar[bool] = True        # parallel mode: the full pass, m = 0
  replaces_value_embeds: ClassVar[bool] = True      # presets drop nanochat's tables
  source_layer: int = -1
  residual: bool = True
  key: bool = True
  value: bool = True
  value_embeds: bool = True
  projection: str = "layerwise"
  gate_channels: int = 32
  init: str = "official"
  reset_at_segment_start: bool = True

  def __post_init__(self):
    if self.projection not in LRT_PROJECTIONS:
      invalid("recurrence.projection", self.projection, f"one of {LRT_PROJECTIONS}")
    if self.init not in LRT_INITS:
      invalid("recurrence.init", self.init, f"one of {LRT_INITS}")
    if not isinstance(self.gate_channels, int) or self.gate_channels < 0:
      invalid("recurrence.gate_channels", self.gate_channels, "an integer >= 0 (0 = d_model)")
    if not (self.residual or self.key or self.value or self.value_embeds):
      invalid("recurrence.residual/key/value/value_embeds", False,
              "at least one feedback path on")

  def source_index(self, model: "ModelConfig") -> int:
    """The memory's source layer as a non-negative index (n_layers-1 for -1: the final
    normed state)."""
    L = model.n_layers
    if not -L <= self.source_layer < L:
      invalid("recurrence.source_layer", self.source_layer,
              f"-1 (the LM head's input) or a layer index in [{-L}, {L - 1}] for n_layers={L}")
    if self.gate_channels > model.d_model:
      invalid("recurrence.gate_channels", self.gate_channels, f"0..d_model={model.d_model}")
    return self.source_layer % L

  def span(self, model: "ModelConfig") -> tuple[int, int]:
    """(first, last) layer of the recurrent span: 0..source layer (memory enters every
    layer; the span ends where it is read)."""
    source = self.source_index(model)
    if model.value_embeds is not None:
      invalid("value_embeds", model.value_embeds, "None with an LRT recurrence (LRT carries "
              "its own per-layer value embeddings: recurrence.value_embeds)")
    return 0, source

  def num_params(self, model: "ModelConfig") -> int:
    """Per layer: γ, the triple gate, value embeddings; W_k / W_v per layer or shared."""
    D, L, V = model.d_model, model.n_layers, model.padded_vocab
    kv = model.n_kv_heads * model.head_dim
    C = self.gate_channels or D
    proj = D * kv * (int(self.key) + int(self.value))
    return (L * (int(self.residual) + C * 3 * model.n_kv_heads + (V * kv if self.value_embeds
                                                                    else 0))
            + proj * (L if self.projection == "layerwise" else 1))

  def mixer_flops(self, model: "ModelConfig", tokens: int, layers=None) -> float:
    """In each of the `layers` run (default all): W_k and W_v (D·N_kv·K each, when on) and
    the triple gate (C·3·N_kv)."""
    kv = model.n_kv_heads * model.head_dim
    gate = (self.gate_channels or model.d_model) * 3 * model.n_kv_heads
    per_layer = (int(self.key) + int(self.value)) * model.d_model * kv + gate
    n = model.n_layers if layers is None else layers
    return float(2 * n * per_layer * tokens)


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


plain_state = None       # Jacobi's sweep 0 runs the span with zero memory


def stats(_, cf_BT):
  return {}


def layer_stats(collected, cfg: ModelConfig) -> dict:
  """{"gate_means": [L, 3]} mean (local, fb, ve) gates per layer, from the collections
  `run_layers` returned for every segment of one pass (`LayerCtx.collect`)."""
  parts = [jnp.reshape(c["memory"]["gates"][0], (-1, 3)) for c in collected]
  out = jnp.concatenate(parts)
  assert out.shape[0] == cfg.n_layers
  return {"gate_means": jax.lax.stop_gradient(out)}


def scalars(params, cfg: ModelConfig) -> dict:
  """LRT's per-layer α (resid), β (x0) and γ (memory) as [L] vectors (the backbone's α/β
  when it has them)."""
  layers, out = params["layers"], {}
  for name, key in (("alpha", "resid_lambda"), ("beta", "x0_lambda")):
    if key in layers:
      out[name] = layers[key]
  if "gamma" in layers.get("memory", {}):
    out["gamma"] = layers["memory"]["gamma"]
  return out


def value_embed_rows(params, cfg: ModelConfig, tokens_BT):
  """LRT's own per-layer value-embedding rows (rows [L, B, T, N_kv·K],), None when off."""
  if not cfg.recurrence.value_embeds:
    return None
  return (params["layers"]["memory"]["ve"][:, tokens_BT],)


def _feedback_weights(params, cfg: ModelConfig, name: str):
  """[L, D, N_kv·K] W_k or W_v of every layer (the shared pair broadcast)."""
  if cfg.recurrence.projection == "shared":
    w = params["recurrence"][name]
    return jnp.broadcast_to(w, (cfg.n_layers, *w.shape))
  return params["layers"]["memory"][name]


def refresh_kv(params, cfg: ModelConfig, rope, buf: KV, extras, old, memory_BTD, unvisited):
  """Hook of the refinement passes (kv_refresh): the rows no pass has visited yet get
  V += g_fb0·Δ(W_v m′) and pre-RoPE K += g_fb0·Δ(W_k m′), then RoPE and the norm again;
  m′ = `memory_BTD` (the memory the next pass reads), Δ the change since the previous
  refresh, g_fb0 the pass-0 gate. `extras` = (pre-RoPE keys, g_fb) of pass 0 (and of
  each refresh); returns (buffer, extras, old projections)."""
  rcfg = cfg.recurrence
  k_pre, g_fb = extras
  L, B, T, M, K = buf.k.shape
  u = jnp.asarray(unvisited)[None, None, :, None, None]
  g = g_fb[..., None]                                              # [L, B, T, M, 1]
  project = lambda name: jnp.einsum("btd,lde->lbte", memory_BTD,
                                   _feedback_weights(params, cfg, name)).reshape(L, B, T, M, K)
  k_new = project("w_k") if rcfg.key else None
  v_new = project("w_v") if rcfg.value else None
  k_old, v_old = old
  keys, values = buf.k, buf.v
  if v_new is not None:
    values = values + (g * (v_new - v_old) * u).astype(values.dtype)
  if k_new is not None:
    k_pre = k_pre + (g * (k_new - k_old) * u).astype(k_pre.dtype)
    k_rot = jax.vmap(lambda k: apply_rope(k, rope))(k_pre)
    if cfg.qk_norm:
      k_rot = rms_normalize(k_rot, cfg.rms_norm_eps).astype(k_pre.dtype)
    keys = jnp.where(u, k_rot.astype(keys.dtype), keys)
  return KV(keys, values), (k_pre, g_fb), (k_new, v_new)


def retrofit(rcfg: LRTConfig) -> LRTConfig:
  """LRT is added to a pretrained model with init="identity" (γ = 0, zero feedback weights
  and value embeddings, gates 2σ(0) = 1): it computes the pretrained function until it
  trains. The release's init ("official") would change that function."""
  if rcfg.init != "identity":
    invalid("recurrence.init", rcfg.init, "'identity' to add LRT to a pretrained model (the "
            "release's init changes the pretrained function)")
  return rcfg


TYPE = RECURRENCES.register(RecurrenceType.from_module(
    sys.modules[__name__], name=LRTConfig.type, config=LRTConfig, retrofit=retrofit,
    # γ_i, one scalar per layer (the release keeps every scalar out of weight decay)
    no_decay=("gamma",),
    partition_rules=(
        (r"layers/memory/(w_k|w_v)$", ("layers", "embed", "kv_heads")),   # layerwise
        (r"layers/memory/ve$", ("layers", "vocab", "embed")),             # value embeddings
        (r"recurrence/(w_k|w_v)$", ("embed", "kv_heads"))),               # LRT-shared
    embedding_leaves=(("memory", "ve"),)))
