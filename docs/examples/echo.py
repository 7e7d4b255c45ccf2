"""A recurrence type of one's own, outside the library: "echo" adds the previous token's
span output, projected by W and scaled by a learned gate α, to the stream entering the
recurrent span:

    h ← h + tanh(α) · (S_{t−1} W)          (at recurrent positions, cf 2)

where S_{t−1} is the output of the span's last layer at the previous position. α starts
at 0, so a fresh model computes its base transformer. Everything else (exact mode,
decoding, every training schedule, sharding, both optimizers, the FLOP model) comes from
the library once the type is registered, at the end of this file.

    python -m t2mlr_jax.main --user_module=docs/examples/echo.py \\
        --config=docs/examples/s5_echo.py:tiny --workdir=/tmp/echo
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
class EchoConfig(RecurrenceConfig):
  """echo's fields (the schedules' options are the model config's `schedule_options`)."""
  type: ClassVar[str] = "echo"
  default_schedule: ClassVar[str] = "jacobi"        # train.mode "auto"
  parallel_runs_mixer: ClassVar[bool] = False      # parallel mode: the plain transformer
  replaces_value_embeds: ClassVar[bool] = False
  l_start: int = 1             # the span's first layer (where the echo enters)
  l_end: int = -2              # its last layer (whose output is echoed)
  init_std: float = 0.02       # W's normal init

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
    return model.d_model ** 2 + 1

  def mixer_flops(self, model, tokens: int, layers=None) -> float:
    """S·W once per run of the span."""
    return float(2 * model.d_model ** 2 * tokens)


# ---- the interface every recurrence type answers (t2mlr_jax/model/recurrence/__init__.py)

layer_module = None      # nothing inside the layers
plain_state = None       # Jacobi's sweep 0 runs the span from zero state
refresh_kv = None        # the memory never enters keys or values


def init_params(cfg, rng):
  return {"alpha": jnp.zeros((), jnp.float32),
          "w": cfg.recurrence.init_std * jax.random.normal(rng, (cfg.d_model, cfg.d_model))}


def zero_state(cfg, batch: int):
  return jnp.zeros((batch, cfg.d_model), jnp.float32)


def read(cfg, state_BTD, positions_BT, slots_BT=None):
  return jnp.where((positions_BT == 0)[..., None], 0.0, state_BTD)   # a sequence starts


def enter(params, cfg, h_BTD, state_BTD, cf_BT):
  p = params["recurrence"]
  echo = jnp.tanh(p["alpha"]) * matmul_fp32(state_BTD, p["w"], "echo_w")
  on = (cf_BT == CF_RECURRENT)[..., None]
  return (h_BTD.astype(jnp.float32) + jnp.where(on, echo, 0.0)).astype(h_BTD.dtype), None


def memory(cfg, state_BTD, cf_BT):
  return None


def carry(params, cfg, o_BTD, state_BTD, cf_BT):
  return jnp.where((cf_BT == CF_PAD)[..., None], 0.0, o_BTD.astype(jnp.float32))


def stats(_, cf_BT):
  return {}


def layer_stats(collected, cfg):
  return {}


def scalars(params, cfg):
  return {"alpha": params["recurrence"]["alpha"]}


def value_embed_rows(params, cfg, tokens_BT):
  return None


TYPE = t2.register_recurrence(t2.RecurrenceType.from_module(
    sys.modules[__name__], name=EchoConfig.type, config=EchoConfig,
    no_decay=("alpha",),                                   # the gate: never decayed
    partition_rules=((r"recurrence/w$", ("embed", None)),)))  # W sharded like T2MLR's W_rec
