"""A fusion mixer of one's own for T2MLR: "low_rank" adds the state read through a rank-r
bottleneck, scaled by a learned ReZero gate γ (0 at init, so a fresh mixer computes h):

    out = h + tanh(γ) · ((R A) B),    A: D×r, B: r×D

Registered at the end of this file; `T2MLRConfig(mixer="low_rank", mixer_options=
("rank=4",))` (`--config.model.recurrence.mixer=low_rank`) selects it. The T2MLR type, the
schedules, decoding, the optimizer (γ kept out of weight decay), the partitioner and the
FLOP model (2 × its kernels' entries per position) take it from its declaration.

    python -m t2mlr_jax.main --user_module=docs/examples/low_rank_mixer.py \\
        --config=configs/s5_retrieval.py:tiny --config.model.recurrence.mixer=low_rank \\
        --workdir=/tmp/low_rank
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax.numpy as jnp

from t2mlr_jax.config import invalid
from t2mlr_jax.model import mixers


@dataclasses.dataclass(frozen=True)
class LowRankOptions:
  """The mixer's options (`recurrence.mixer_options`, "name=value" strings)."""
  rank: int = 4                # r, the bottleneck's width
  gamma_init: float = 0.0      # γ at init (0: the fresh mixer computes h)

  def __post_init__(self):
    if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
      invalid("rank", self.rank, "an integer >= 1")


class LowRankMixer(mixers.MixerModule):
  """(h_BTD, prev_BTD) -> (h + tanh(γ)·(R A) B, GateStats), fp32."""

  @nn.compact
  def __call__(self, h_BTD, prev_BTD):
    o = self.opts
    gamma = self.param("gamma", nn.initializers.constant(o.gamma_init), (), jnp.float32)
    r = nn.Dense(o.rank, use_bias=False, name="down")(prev_BTD.astype(jnp.float32))
    r = nn.Dense(self.d_model, use_bias=False, name="up")(r)
    out = h_BTD.astype(jnp.float32) + jnp.tanh(gamma) * r
    return out, mixers.GateStats(jnp.broadcast_to(jnp.tanh(gamma), h_BTD.shape),
                                 jnp.ones(h_BTD.shape, jnp.float32))


MIXER = mixers.register(mixers.Mixer(
    name="low_rank", module=LowRankMixer, options=LowRankOptions,
    no_decay=("gamma",),                                            # the gate: never decayed
    partition_rules=((r"recurrence/down/kernel$", ("embed", None)),
                     (r"recurrence/up/kernel$", (None, "embed"))),
    identity_at_init=lambda o: o.gamma_init == 0.0, source=__name__))
