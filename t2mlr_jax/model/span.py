"""The two operations every schedule of every recurrence type is built from: run the
recurrent span over all positions given the states they read (`run_span`: the type's
`enter` at its first layer, the layers with the type's `memory`, its `span_exit` and
`carry` at its last), and
give each position the state the position before it left (`previous_states`: shifted by
one, through the type's `read`, so it resets where a sequence or packed document starts).

Jacobi's sweeps, the interleaved / chunked / multi-refine passes, the Jacobi prefill and
decoding all call these, for T2MLR and LRT alike (`recurrence/__init__.py`).

A state is whatever pytree the type's `zero_state(cfg, B)` returns, each leaf [B, ...] per
sequence (T2MLR and LRT: one [B, D] array); the states of every position are that pytree
with a time axis after the batch ([B, T, ...] leaves). Everything outside a type's own
file handles states only through the functions below, so a type may carry two vectors,
a wider one or a matrix."""

from __future__ import annotations

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

from t2mlr_jax.config import ModelConfig
from t2mlr_jax.model import recurrence
from t2mlr_jax.model.transformer import LayerCtx, run_layers


class SpanOut(NamedTuple):
  """o [B, T, D]: the span's last layer's output; state (leaves [B, T, ...]): what each
  position leaves for the next (`carry`); stats: what `enter` reports; kv: the layers' keys/values
  (with their collections under `ctx.collect`); ctx: the context the span ran with, its
  memory included, which the layers above the span read too."""
  o: jnp.ndarray
  state: jnp.ndarray
  stats: object
  kv: object
  ctx: LayerCtx


def run_span(params, cfg: ModelConfig, span, h_BTD, prev_BTD, ctx: LayerCtx, cf_BT, *,
             kvs=None, index=None, kv_source: Optional[str] = None, memory=None) -> SpanOut:
  """The recurrent span (first layer, layers) over the positions of h, each reading the
  state `prev` its predecessor left (as `read` gives it). `kvs` / `index` / `kv_source`: as
  `run_layers` (a decode cache, or a refinement pass's key buffer); `memory`: the
  per-layer memory when the caller already has it (else the type's `memory` of prev)."""
  rtype = recurrence.of(cfg)
  x, stats = rtype.enter(params, cfg, h_BTD, prev_BTD, cf_BT)
  mem = rtype.memory(cfg, prev_BTD, cf_BT) if memory is None else memory
  if mem is not None:
    ctx = ctx._replace(side=ctx.side._replace(memory=mem))
  first, layers = span
  o, kv = run_layers(layers, cfg, x, ctx, first, kvs, index, kv_source=kv_source)
  o = exit_span(params, cfg, o, prev_BTD, cf_BT)
  return SpanOut(o, rtype.carry(params, cfg, o, prev_BTD, cf_BT), stats, kv, ctx)


def exit_span(params, cfg: ModelConfig, o_BTD, prev_BTD, cf_BT):
  """The span's last output as the layers above and `carry` read it: the type's
  `span_exit` (T2MLR's skip to l_end), o itself when the type declines it."""
  hook = recurrence.of(cfg).span_exit
  return o_BTD if hook is None else hook(params, cfg, o_BTD, prev_BTD, cf_BT)


def previous_states(cfg: ModelConfig, states_BTD, positions_BT):
  """prev[t] = read(states[t−1]): the state position t reads, given the states every
  position left (zero at t = 0 and wherever the type resets)."""
  B, T = positions_BT.shape
  shifted = jax.tree.map(
      lambda a: jnp.pad(a, [(0, 0), (1, 0)] + [(0, 0)] * (a.ndim - 2))[:, :-1], states_BTD)
  slots = jnp.broadcast_to(jnp.arange(T)[None], (B, T))
  return recurrence.of(cfg).read(cfg, shifted, positions_BT, slots)


def zero_states(cfg: ModelConfig, B: int, T: int):
  """The type's zero state at every position (leaves [B, T, ...]): every position reading
  the state before any token."""
  return jax.tree.map(lambda z: jnp.broadcast_to(z[:, None], (B, T) + z.shape[1:]),
                      recurrence.zero_state(cfg, B))


def with_time(state_B):
  """One state per sequence (leaves [B, ...]) as the states of one position ([B, 1, ...])."""
  return jax.tree.map(lambda a: a[:, None], state_B)


def at_time(states_BT, index):
  """The states of position(s) `index` (an int: leaves [B, ...]; an array or slice: [B, n,
  ...])."""
  return jax.tree.map(lambda a: a[:, index], states_BT)


def set_time(states_BT, index, new):
  """states with those of positions `index` replaced by `new`."""
  return jax.tree.map(lambda a, n: a.at[:, index].set(n.astype(a.dtype)), states_BT, new)


def max_change(new, old=None):
  """max |new − old| over every leaf (fp32 scalar; old None: max |new|): how far a sweep
  moved the states."""
  diff = new if old is None else jax.tree.map(jnp.subtract, new, old)
  return jnp.max(jnp.stack([jnp.max(jnp.abs(a)).astype(jnp.float32)
                            for a in jax.tree.leaves(diff)]))
