"""The Jacobi schedule (docs/models.md#jacobi): every position's state refined in parallel
sweeps of the recurrent span until it is the fixed point the exact recurrence reaches.

Sweep 0 gives a first guess (the type's `plain_state` hook: T2MLR's raw span output, as
the release; declined: the span run from zero state); then D_f − 1 sweeps, each running
the span over all positions reading the states the previous sweep left, the first ones
inside a `fori_loop` (or a tolerance-stopped `while_loop`) on stop-gradient inputs and
parameters, the last D_b with gradient; then the final pass through the span and the
layers above. D_f >= T sweeps give the exact recurrence. Any recurrence type."""

from __future__ import annotations

import dataclasses
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from t2mlr_jax.config import ModelConfig, invalid
from t2mlr_jax.model import recurrence
from t2mlr_jax.model.sequence import (
  ModeOut,
  SeqInputs,
  context,
  logits,
  run_segment,
  run_segment_layers,
  segments,
  stacked,
)
from t2mlr_jax.model.span import (
  at_time,
  max_change,
  previous_states,
  run_span,
  zero_states,
)
from t2mlr_jax.model.transformer import embed
from t2mlr_jax.registry import SCHEDULES, Schedule
from t2mlr_jax.sharding import constrain_batch


@dataclasses.dataclass(frozen=True)
class JacobiOptions:
  """D_f (sweep 0 + D_f−1 span sweeps), D_b (the last sweeps, with gradient) and the
  tolerance that stops the no-gradient sweeps once max|ΔR| < tol (None: every sweep)."""
  d_forward: int = 16
  d_backward: int = 4
  jacobi_tol: Optional[float] = None

  def __post_init__(self):
    if isinstance(self.d_forward, bool) or not isinstance(self.d_forward, (int, np.integer)) \
        or self.d_forward < 1:
      invalid("d_forward", self.d_forward, "an integer >= 1")
    if isinstance(self.d_backward, bool) or not isinstance(self.d_backward, (int, np.integer)) \
        or not 1 <= self.d_backward <= self.d_forward:
      invalid("d_backward", self.d_backward, f"1 <= d_backward <= d_forward ({self.d_forward})")
    if self.jacobi_tol is not None and not self.jacobi_tol > 0:
      invalid("jacobi_tol", self.jacobi_tol, "None or a float > 0")
    object.__setattr__(self, "d_forward", int(self.d_forward))
    object.__setattr__(self, "d_backward", int(self.d_backward))


def _first_guess(params, cfg, span, h_lo, ctx, inp: SeqInputs):
  """Sweep 0: the states every position reads before any sweep."""
  hook = recurrence.of(cfg).plain_state
  if hook is not None:
    o, _ = run_segment_layers(span, cfg, h_lo, ctx)
    states = hook(cfg, o, inp.control_flow)
  else:
    B, T, _ = h_lo.shape
    zero = zero_states(cfg, B, T)
    states = run_span(params, cfg, span, h_lo, zero, ctx, inp.control_flow).state
  return constrain_batch(previous_states(cfg, states, inp.positions))


def _sweep(params, cfg, span, h_lo, prev, ctx, inp: SeqInputs):
  """One sweep: the span over all positions reading prev; the states the next sweep reads."""
  out = run_span(params, cfg, span, h_lo, prev, ctx, inp.control_flow)
  return constrain_batch(previous_states(cfg, out.state, inp.positions))


def _iterate(sweep, prev, delta, max_sweeps, tol):
  """Up to `max_sweeps` sweeps (a fori_loop), or, with tol, at least one and fewer once
  max|prev_k - prev_{k-1}| < tol (a while_loop). Returns (prev, delta of the last sweep,
  sweeps run)."""
  if tol is None:
    def body(_, carry):
      prev, _ = carry
      prev_new = sweep(prev)
      return prev_new, max_change(prev_new, prev)
    prev, delta = jax.lax.fori_loop(0, max_sweeps, body, (prev, delta))
    return prev, delta, jnp.asarray(max_sweeps, jnp.int32)

  def cond(carry):
    i, _, delta = carry
    return (i < max_sweeps) & (delta >= tol)

  def wbody(carry):
    i, prev, _ = carry
    prev_new = sweep(prev)
    return i + 1, prev_new, max_change(prev_new, prev)
  # The first sweep always runs: max|prev_0| (sweep 0's states against zero ones) says
  # nothing about convergence, and stopping on it skipped every sweep for a loose tol.
  n_run, prev, delta = jax.lax.while_loop(
      cond, wbody, (jnp.int32(0), prev, jnp.full_like(delta, jnp.inf)))
  return prev, delta, n_run


def _frozen_context(ctx):
  """The context the no-gradient sweeps see: its side inputs under stop_gradient."""
  sg = jax.lax.stop_gradient
  ctx_sg = ctx._replace(per_layer=jax.tree.map(sg, ctx.per_layer))
  if ctx.side is not None:
    ctx_sg = ctx_sg._replace(side=ctx.side._replace(
        x0=None if ctx.side.x0 is None else sg(ctx.side.x0),
        shared=None if ctx.side.shared is None else sg(ctx.side.shared)))
  return ctx_sg


def jacobi(params, cfg: ModelConfig, tokens_BT, inp: SeqInputs, d_forward: int,
           d_backward: int, jacobi_tol: Optional[float], hidden: bool = False) -> ModeOut:
  """Jacobi fixed-point training forward (logits and aux of ModeOut)."""
  sg = jax.lax.stop_gradient
  rtype = recurrence.of(cfg)
  cf = inp.control_flow
  # Unrolled over per-layer weights, the sweeps do not re-slice them; with a remat policy
  # the scanned block keeps XLA's peak memory 1.4-2x lower (S5 shape, remat="full").
  segs = segments(params, cfg, unrolled=("middle",) if cfg.remat == "none" else ())
  x0 = embed(params, cfg, tokens_BT)
  ctx = context(params, cfg, inp, tokens_BT, x0)
  h_lo, _ = run_segment(segs, cfg, "lower", x0, ctx)
  first, p_mid = segs["middle"]
  ctx_sg = _frozen_context(ctx)
  n_grad = min(d_backward, d_forward - 1)      # span sweeps with gradient
  n_free = d_forward - 1 - n_grad              # span sweeps without

  if d_backward == d_forward:                  # every sweep, sweep 0 included, has gradient
    prev = _first_guess(params, cfg, (first, p_mid), h_lo, ctx, inp)
  else:
    prev = sg(_first_guess(sg(params), cfg, (first, sg(p_mid)), sg(h_lo), ctx_sg, inp))
  delta = max_change(prev)

  # No-gradient sweeps: stop-gradient inputs and parameters keep no activations.
  n_run = jnp.asarray(0, jnp.int32)
  if n_free:
    frozen_params, frozen_span, frozen_h = sg(params), (first, sg(p_mid)), sg(h_lo)
    free = lambda prev: _sweep(frozen_params, cfg, frozen_span, frozen_h, prev, ctx_sg, inp)
    prev, delta, n_run = _iterate(free, prev, delta, n_free, jacobi_tol)
    prev = sg(prev)

  # The last D_b sweeps carry gradient.
  if n_grad:
    def gbody(prev, _):
      prev_new = _sweep(params, cfg, (first, p_mid), h_lo, prev, ctx, inp)
      return prev_new, max_change(prev_new, prev)
    prev, deltas = jax.lax.scan(gbody, prev, None, length=n_grad)
    delta = deltas[-1]

  # Final pass through the span and the layers above.
  out = run_span(params, cfg, (first, p_mid), h_lo, prev, ctx, cf)
  y, _ = run_segment(segs, cfg, "upper", out.o, out.ctx)
  aux = {"jacobi_residual": sg(delta),
         "jacobi_sweeps": 1 + n_run + n_grad,
         **jax.tree.map(sg, rtype.stats(out.stats, cf))}
  return ModeOut(logits(params, cfg, y, False, hidden), aux)


def jacobi_prefill(params, cfg: ModelConfig, tokens_BT, inp: SeqInputs, tol: Optional[float],
                   last_only: bool = False) -> ModeOut:
  """Exact parallel prefill [ours]: Jacobi sweeps until max|Δprev| < tol, capped at T
  sweeps (exact by construction then). Same outputs as `exact`; aux: sweeps, residual."""
  T = tokens_BT.shape[1]
  rtype = recurrence.of(cfg)
  cf = inp.control_flow
  segs = segments(params, cfg, unrolled=("middle",))
  x0 = embed(params, cfg, tokens_BT)
  ctx = context(params, cfg, inp, tokens_BT, x0)
  h_lo, kv_lo = run_segment(segs, cfg, "lower", x0, ctx)
  span = segs["middle"]
  prev = _first_guess(params, cfg, span, h_lo, ctx, inp)
  sweep = lambda prev: _sweep(params, cfg, span, h_lo, prev, ctx, inp)
  prev, delta, n_run = _iterate(sweep, prev, max_change(prev), T - 1, tol)
  out = run_span(params, cfg, span, h_lo, prev, ctx, cf)
  kv_mid = stacked(out.kv)
  y, kv_up = run_segment(segs, cfg, "upper", out.o, out.ctx)
  state_BD = at_time(rtype.carry(params, cfg, out.o[:, -1:], at_time(prev, slice(-1, None)),
                                 cf[:, -1:]), 0)
  kvs = {k: v for k, v in (("lower", kv_lo), ("middle", kv_mid), ("upper", kv_up))
         if v is not None}
  aux = {"jacobi_residual": delta, "jacobi_sweeps": 1 + n_run, **rtype.stats(out.stats, cf)}
  return ModeOut(logits(params, cfg, y, last_only), aux, kvs, state_BD)


def run(params, cfg: ModelConfig, tokens_BT, inp: SeqInputs, options: dict,
        hidden: bool = False) -> ModeOut:
  return jacobi(params, cfg, tokens_BT, inp, options["d_forward"], options["d_backward"],
                options["jacobi_tol"], hidden)


def check_depths(values: dict, given: dict) -> dict:
  """D_f and D_b given per call: each checked on its own, D_b clamped to D_f (whichever
  side gave it)."""
  if "d_forward" not in given and "d_backward" not in given:
    return values
  for name in ("d_forward", "d_backward"):
    v = values[name]
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
      raise ValueError(f"{name}={v!r} is invalid: allowed an integer >= 1")
  return {**values, "d_backward": min(values["d_backward"], values["d_forward"])}


def flops(costs, options: dict, sweeps: Optional[int]) -> tuple[float, float]:
  """Lower once; sweep 0 (without the recurrence's matmuls when the type's plain_state
  hook runs it); `sweeps` − 1 span sweeps (default D_f); the final span + upper pass.
  Gradient: lower, the final pass, the last min(D_b, D_f − 1) sweeps, sweep 0 too when
  D_b = D_f."""
  d_f, d_b = options["d_forward"], options["d_backward"]
  s = d_f if sweeps is None else sweeps
  sweep = costs.middle + costs.span_mixer
  sweep0 = costs.middle + costs.sweep0_mixer
  final = costs.middle + costs.upper + costs.above_mixer
  forward = costs.head + costs.lower + sweep0 + (s - 1) * sweep + final
  grad = (costs.head + costs.lower + final + min(d_b, d_f - 1) * sweep
          + (sweep0 if d_b == d_f else 0.0))
  return forward, grad


SCHEDULE = SCHEDULES.register(Schedule(
    name="jacobi", run=run, flops=flops, options=JacobiOptions, hidden=True,
    check_options=check_depths, sweeps_metric="jacobi_sweeps", prefill=jacobi_prefill,
    source=__name__))
