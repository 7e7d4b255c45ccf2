"""What every mode and schedule shares about a sequence: its per-token side inputs, the
context every layer reads (RoPE tables, the attention mask, side inputs), the layer
stack cut into segments (below / inside / above the recurrent span), and what a mode
returns."""

from __future__ import annotations

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

from t2mlr_jax.config import ModelConfig
from t2mlr_jax.model import kernels, recurrence, transformer
from t2mlr_jax.model.control_flow import CF_PAD
from t2mlr_jax.model.layers import KV, LayerSide, attention_mask, rope_tables
from t2mlr_jax.model.transformer import LayerCtx, head, value_embed_inputs


class ModeOut(NamedTuple):
  """What every mode returns. logits [B, T, V] fp32 ([B, 1, V] with last_only); aux: the
  mode's metrics; kvs: {segment: stacked keys/values} and state [B, D]: the recurrent
  state after the last position (the modes a prefill can use)."""
  logits: jnp.ndarray
  aux: dict
  kvs: Optional[dict] = None
  state: Optional[jnp.ndarray] = None


class SeqInputs(NamedTuple):
  """Per-token side inputs, all [B, T] int32; document_ids: the packed document of each
  token (the public `segment_ids`), None without packing."""
  control_flow: jnp.ndarray
  positions: jnp.ndarray
  document_ids: Optional[jnp.ndarray]


def positions_from_documents(document_ids_BT):
  """Position ids restarting at 0 wherever the document id changes."""
  B, T = document_ids_BT.shape
  t = jnp.arange(T)[None, :]
  start = jnp.concatenate(
      [jnp.ones((B, 1), bool), document_ids_BT[:, 1:] != document_ids_BT[:, :-1]], axis=1)
  return t - jax.lax.cummax(jnp.where(start, t, 0), axis=1)


def side_inputs(params, cfg: ModelConfig, x0, tokens, dist, memory=None) -> Optional[LayerSide]:
  """The LayerSide this config's layers read (None when they read nothing but x)."""
  mem = recurrence.uses_memory(cfg)
  if not (cfg.x0_lambdas or mem or cfg.layer_windows is not None):
    return None
  return LayerSide(x0=x0 if cfg.x0_lambdas else None, memory=memory if mem else None,
                   tokens=tokens if mem else None,
                   shared=params.get("recurrence") if mem else None,
                   dist=dist if cfg.layer_windows is not None else None)


def context(params, cfg: ModelConfig, inp: SeqInputs, tokens_BT, x0_BTD) -> LayerCtx:
  """RoPE tables, the [B,T,T] attention mask and the side inputs shared by every layer
  (LRT's memory: zero, the parallel full pass)."""
  B, T = tokens_BT.shape
  q_slot = jnp.broadcast_to(jnp.arange(T)[None], (B, T))
  mask = attention_mask(q_slot, inp.control_flow != CF_PAD,
                        inp.document_ids, inp.document_ids)
  dist = jnp.arange(T)[:, None] - jnp.arange(T)[None, :]
  zero = jnp.zeros((B, T, cfg.d_model), jnp.float32) if recurrence.uses_memory(cfg) else None
  side = side_inputs(params, cfg, x0_BTD, tokens_BT, dist[None], zero)
  fused = None
  if kernels.resolve(cfg.attention, cfg.dtype, head_dim=cfg.head_dim) != "xla":
    fused = kernels.kernel_inputs(inp.control_flow, inp.document_ids)
  return LayerCtx(rope_tables(cfg, inp.positions), mask, side,
                  value_embed_inputs(params, cfg, tokens_BT), kernel_inputs=fused)


def segments(params, cfg, unrolled=()) -> dict:
  """{name: (first layer, layers)} over cfg.segments: stacked trees, or per-layer tuples
  for the names in `unrolled` (`transformer.split_segments`)."""
  parts = tuple((lo, hi, name in unrolled) for name, lo, hi in cfg.segments)
  segs = transformer.split_segments(params["layers"], parts)
  return {name: (lo, seg) for (name, lo, _), seg in zip(cfg.segments, segs)}


def run_segment_layers(seg, cfg, x, ctx: LayerCtx):
  """A segment (first layer, layers) over the whole sequence."""
  first, layers = seg
  return transformer.run_layers(layers, cfg, x, ctx, first)


def run_segment(segs, cfg, name, x, ctx: LayerCtx):
  """Run one named segment in parallel over the sequence; identity if it is empty."""
  seg = segs.get(name)
  return (x, None) if seg is None else run_segment_layers(seg, cfg, x, ctx)


def stacked(kvs):
  """Per-layer keys/values as one stacked pytree (unrolled runs return a tuple)."""
  if isinstance(kvs, tuple) and kvs and not isinstance(kvs, KV):
    return jax.tree.map(lambda *a: jnp.stack(a), *kvs)
  return kvs


def logits(params, cfg: ModelConfig, y_BTD, last_only: bool, hidden: bool = False):
  """The LM head over every position, or only the last (prefill: [B, 1, V]); with
  `hidden`, the last layer's output itself (a chunked loss applies the head piecewise)."""
  if hidden:
    return y_BTD
  return head(params, cfg, y_BTD[:, -1:] if last_only else y_BTD)
