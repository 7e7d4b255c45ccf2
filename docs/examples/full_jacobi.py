"""A training schedule of one's own, outside the library: Jacobi without the no-gradient
sweeps. `full_sweeps` sweeps of the recurrent span, every one with gradient (what the built-in
jacobi computes with d_backward = d_forward, unrolled here in Python), then the final
pass. Any recurrence type, the library's or a user's, trains under it once it is
registered, at the end of this file. Its one option, `full_sweeps`, is its own: declared
with its default and its check below, set as `model.schedule_options.full_sweeps` (or
per call, `forward(..., mode="full_jacobi", full_sweeps=4)`).

    python -m t2mlr_jax.main --user_module=docs/examples/full_jacobi.py \\
        --config=configs/s5_retrieval.py:tiny --config.train.mode=full_jacobi \\
        --config.model.schedule_options.full_sweeps=3 --workdir=/tmp/full_jacobi
"""

from __future__ import annotations

import dataclasses

import t2mlr_jax as t2
from t2mlr_jax.config import invalid
from t2mlr_jax.model.sequence import ModeOut, context, logits, run_segment, segments
from t2mlr_jax.model.span import previous_states, run_span, zero_states
from t2mlr_jax.model.transformer import embed


@dataclasses.dataclass(frozen=True)
class FullJacobiOptions:
  """Its options: each field one, with its default; __post_init__ checks the values."""
  full_sweeps: int = 3           # span sweeps, every one with gradient

  def __post_init__(self):
    if isinstance(self.full_sweeps, bool) or not isinstance(self.full_sweeps, int) \
        or self.full_sweeps < 1:
      invalid("full_sweeps", self.full_sweeps, "an integer >= 1")


def run(params, cfg, tokens, inp, options, hidden=False):
  segs = segments(params, cfg, unrolled=("middle",))
  x0 = embed(params, cfg, tokens)
  ctx = context(params, cfg, inp, tokens, x0)
  h, _ = run_segment(segs, cfg, "lower", x0, ctx)
  S = zero_states(cfg, *tokens.shape)
  for _ in range(options["full_sweeps"]):
    S = previous_states(cfg, run_span(params, cfg, segs["middle"], h, S, ctx,
                                      inp.control_flow).state, inp.positions)
  out = run_span(params, cfg, segs["middle"], h, S, ctx, inp.control_flow)
  y, _ = run_segment(segs, cfg, "upper", out.o, out.ctx)
  return ModeOut(logits(params, cfg, y, False, hidden), {})


def flops(costs, options, sweeps=None):
  """Lower once, `full_sweeps` span sweeps with the recurrence's matmuls, the final pass; all
  of it with gradient (t2mlr_jax.flops.PassCosts)."""
  sweep = costs.middle + costs.span_mixer
  final = costs.middle + costs.upper + costs.above_mixer
  forward = costs.head + costs.lower + options["full_sweeps"] * sweep + final
  return forward, forward


SCHEDULE = t2.register_schedule(t2.Schedule(
    name="full_jacobi", run=run, flops=flops, options=FullJacobiOptions, hidden=True,
    source=__name__))
