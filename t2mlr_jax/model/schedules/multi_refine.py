"""The multi-refine schedule (the LRT release's a133a67 `--multi-refine`; equal to it on its
goldens), for any recurrence type: pass 0 over every position with every state zero, then
`refine_passes` full passes, pass k reading the states pass k−1 left (with refine_detach,
under stop_gradient). After p passes positions 0..p are exact; refine_passes >= T−1 is the exact
recurrence. The passes run in one `lax.scan`, so compile time does not grow with their
number. Layers below the recurrent span run once."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from t2mlr_jax.config import ModelConfig, invalid
from t2mlr_jax.losses import cross_entropy
from t2mlr_jax.model import recurrence
from t2mlr_jax.model.sequence import ModeOut, SeqInputs, context, run_segment, segments
from t2mlr_jax.model.span import previous_states, run_span, zero_states
from t2mlr_jax.model.transformer import embed, head, run_layers
from t2mlr_jax.registry import SCHEDULES, Schedule
from t2mlr_jax.sharding import constrain_batch


@dataclasses.dataclass(frozen=True)
class RefineOptions:
  """refine_passes full passes after the zero-state one; the loss weight of each pass
  0..refine_passes (refine_passes+1 values; empty: uniform); refine_detach: no gradient
  through the states between passes."""
  refine_passes: int = 3
  refine_weights: tuple = ()
  refine_detach: bool = False

  def __post_init__(self):
    if isinstance(self.refine_passes, bool) or not isinstance(self.refine_passes, int) \
        or self.refine_passes < 0:
      invalid("refine_passes", self.refine_passes, "an integer >= 0")
    try:
      weights = tuple(float(w) for w in (self.refine_weights or ()))
    except (TypeError, ValueError):
      weights = None
    if weights is None or (weights and (len(weights) != self.refine_passes + 1
                                        or min(weights) < 0 or not sum(weights) > 0)):
      invalid("refine_weights", self.refine_weights,
              f"empty (uniform) or refine_passes+1={self.refine_passes + 1} weights >= 0 "
              "(passes 0..refine_passes) with a positive sum")
    object.__setattr__(self, "refine_weights", weights)


def multi_refine(params, cfg: ModelConfig, tokens_BT, inp: SeqInputs, refine_passes: int,
                 refine_detach: bool) -> ModeOut:
  """ModeOut: the last pass's logits; aux: pass_logits [refine_passes+1, B, T, V], h_final
  [B, T, D] (the last pass's states) and the type's metrics of the last pass (LRT: gate_means
  [L, 3]; T2MLR: gate_rec, gate_cur)."""
  B, T = tokens_BT.shape
  rtype = recurrence.of(cfg)
  cf = inp.control_flow
  x0 = embed(params, cfg, tokens_BT)
  ctx = context(params, cfg, inp, tokens_BT, x0)._replace(collect=True)
  segs = segments(params, cfg)
  h_lo, _ = run_segment(segs, cfg, "lower", x0, ctx._replace(collect=False))

  def full_pass(prev, memory=None):
    out = run_span(params, cfg, segs["middle"], h_lo, prev, ctx, cf, memory=memory)
    collected = [out.kv[1]]
    y = out.o
    if "upper" in segs:
      lo, layers = segs["upper"]
      y, (_, coll) = run_layers(layers, cfg, y, out.ctx, lo)
      collected.append(coll)
    stats = {**rtype.stats(out.stats, cf), **rtype.layer_stats(collected, cfg)}
    return head(params, cfg, y), constrain_batch(out.state), jax.tree.map(
        jax.lax.stop_gradient, stats)

  # pass 0: every state zero, with the memory of the parallel pass (`context`)
  logits0, states, stats = full_pass(zero_states(cfg, B, T),
                                     None if ctx.side is None else ctx.side.memory)

  def refine(carry, _):
    states, _ = carry
    src = jax.lax.stop_gradient(states) if refine_detach else states
    logits, states, stats = full_pass(previous_states(cfg, src, inp.positions))
    return (states, stats), logits

  if refine_passes:
    (states, stats), logits = jax.lax.scan(refine, (states, stats), None, length=refine_passes)
    pass_logits = jnp.concatenate([logits0[None], logits])
  else:
    pass_logits = logits0[None]
  return ModeOut(pass_logits[-1], {"pass_logits": pass_logits, "h_final": states, **stats})


def run(params, cfg: ModelConfig, tokens_BT, inp: SeqInputs, options: dict,
        hidden: bool = False) -> ModeOut:
  return multi_refine(params, cfg, tokens_BT, inp, options["refine_passes"],
                      options["refine_detach"])


def flops(costs, options: dict, sweeps=None) -> tuple[float, float]:
  """Pass 0, then refine_passes passes from the span on (`sweeps` overrides it); all with
  gradient."""
  k = options["refine_passes"] if sweeps is None else sweeps
  forward = costs.full + k * costs.refined
  return forward, forward


def pass_loss(pass_logits, labels_BT, options: dict, totals=None):
  """Σ_k w_k·CE_k / Σ_k w_k over passes 0..refine_passes (refine_weights; uniform when empty)."""
  total = None if totals is None else totals[0]
  per_pass = jax.vmap(lambda lg: cross_entropy(lg, labels_BT, total=total)[0])(pass_logits)
  w = jnp.asarray(options["refine_weights"] or (1.0,) * per_pass.shape[0], jnp.float32)
  return jnp.sum(w * per_pass) / jnp.sum(w), per_pass


SCHEDULE = SCHEDULES.register(Schedule(
    name="multi_refine", run=run, flops=flops, options=RefineOptions, pass_loss=pass_loss,
    loss_options=("refine_weights",), pass_views=True, source=__name__))
