"""A recurrence type whose state is not one vector: "two_step" carries the span outputs of
the two previous tokens, {"last": S_{t−1}, "before": S_{t−2}}, and adds both, each
projected and gated, to the stream entering the recurrent span:

    h ← h + tanh(α₁) · (S_{t−1} W₁) + tanh(α₂) · (S_{t−2} W₂)     (at recurrent positions)

The state is whatever pytree `zero_state` returns (here a dict of two [B, D] arrays); the
schedules, decoding, the serving engine and sharding take its shape from there and hand
the type's functions the same pytree with a time axis ([B, T, D] leaves). α₁ = α₂ = 0 at
init, so a fresh model computes its base transformer.

    python -m t2mlr_jax.main --user_module=docs/examples/two_step.py \\
        --config=docs/examples/s5_two_step.py:tiny --workdir=/tmp/two_step
"""

from __future__ import annotations

import dataclasses
import sys
from typing import ClassVar

import jax
import jax.numpy as jnp

import t2mlr_jax as t2
from t2mlr_jax.config import RecurrenceConfig, invalid
from t2mlr_jax.model.control_flow import CF_PAD, CF_RECURRENT
from t2mlr_jax.model.layers import matmul_fp32


@dataclasses.dataclass(frozen=True)
class TwoStepConfig(RecurrenceConfig):
  """two_step's fields (the schedules' options are the model config's `schedule_options`)."""
  type: ClassVar[str] = "two_step"
  default_schedule: ClassVar[str] = "jacobi"        # train.mode "auto"
  parallel_runs_mixer: ClassVar[bool] = False      # parallel mode: the plain transformer
  replaces_value_embeds: ClassVar[bool] = False
  l_start: int = 1             # the span's first layer (where both states enter)
  l_end: int = -2              # its last layer (whose output is carried)
  init_std: float = 0.02       # W₁'s and W₂'s normal init

  def __post_init__(self):
    if not self.init_std > 0:
      invalid("recurrence.init_std", self.init_std, "> 0")

  def span(self, model) -> tuple[int, int]:
    L = model.n_layers
    start, end = self.l_start % L, self.l_end % L
    if start > end:
      invalid("recurrence.l_start", self.l_start, f"a layer at or before l_end={self.l_end}")
    return start, end

  def num_params(self, model) -> int:
    return 2 * model.d_model ** 2 + 2

  def mixer_flops(self, model, tokens: int, layers=None) -> float:
    """S_{t−1}·W₁ and S_{t−2}·W₂ once per run of the span."""
    return float(4 * model.d_model ** 2 * tokens)


# ---- the interface every recurrence type answers (t2mlr_jax/model/recurrence/__init__.py)

layer_module = None      # nothing inside the layers
plain_state = None       # Jacobi's sweep 0 runs the span from zero state
refresh_kv = None        # the memory never enters keys or values


def init_params(cfg, rng):
  k1, k2 = jax.random.split(rng)
  D, std = cfg.d_model, cfg.recurrence.init_std
  return {"alpha": jnp.zeros((2,), jnp.float32),
          "w_last": std * jax.random.normal(k1, (D, D)),
          "w_before": std * jax.random.normal(k2, (D, D))}


def zero_state(cfg, batch: int):
  """The state before the first token: two fp32 D-vectors per sequence."""
  zero = jnp.zeros((batch, cfg.d_model), jnp.float32)
  return {"last": zero, "before": zero}


def read(cfg, state, positions_BT, slots_BT=None):
  """Both vectors zero where a sequence starts (position id 0)."""
  start = (positions_BT == 0)[..., None]
  return jax.tree.map(lambda a: jnp.where(start, 0.0, a), state)


def enter(params, cfg, h_BTD, state, cf_BT):
  p = params["recurrence"]
  alpha = jnp.tanh(p["alpha"])
  fused = (alpha[0] * matmul_fp32(state["last"], p["w_last"], "two_step_w")
           + alpha[1] * matmul_fp32(state["before"], p["w_before"], "two_step_w"))
  on = (cf_BT == CF_RECURRENT)[..., None]
  return (h_BTD.astype(jnp.float32) + jnp.where(on, fused, 0.0)).astype(h_BTD.dtype), None


def memory(cfg, state, cf_BT):
  return None


def carry(params, cfg, o_BTD, state, cf_BT):
  """What position t leaves: its own span output and the one it read as the last."""
  pad = (cf_BT == CF_PAD)[..., None]
  return {"last": jnp.where(pad, 0.0, o_BTD.astype(jnp.float32)),
          "before": jnp.where(pad, 0.0, state["last"])}


def stats(_, cf_BT):
  return {}


def layer_stats(collected, cfg):
  return {}


def scalars(params, cfg):
  alpha = params["recurrence"]["alpha"]
  return {"alpha_last": alpha[0], "alpha_before": alpha[1]}


def value_embed_rows(params, cfg, tokens_BT):
  return None


TYPE = t2.register_recurrence(t2.RecurrenceType.from_module(
    sys.modules[__name__], name=TwoStepConfig.type, config=TwoStepConfig,
    no_decay=("alpha",),                                         # the gates: never decayed
    partition_rules=((r"recurrence/w_(last|before)$", ("embed", None)),)))
