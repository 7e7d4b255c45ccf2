"""T2MLR's temporal pathway: what the recurrence reads, how it enters, what it carries.

T2MLR (docs/models.md#t2mlr): the state R_t (built at position t-1 from the output of layer
l_end; the paper's "cache") is fused into the residual stream entering layer l_start,

    r = W_rec R;  g = [h, r];  Φ(h, R) = h + tanh(γ_rec) σ(f_rec g) ⊙ r + tanh(γ_cur) σ(f_cur g) ⊙ h

and after l_end the state is rewritten (residual + clipped RMS scale at
recurrent positions, the raw output elsewhere). This module is T2MLR's side of the
interface of `recurrence/__init__.py` (init_params, zero_state, read, enter, memory,
carry, stats, layer_stats, scalars, value_embed_rows) and its hooks: `plain_state` (the
release's Jacobi sweep 0 takes the raw span output as the first state) and no
`refresh_kv`. Everything runs in fp32 whatever the compute dtype.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from typing import ClassVar, Optional

import chex
import jax
import jax.numpy as jnp

from t2mlr_jax.config import ModelConfig, RecurrenceConfig, invalid
from t2mlr_jax.model import mixers
from t2mlr_jax.model.control_flow import CF_PAD, CF_PLAIN, CF_RECURRENT
from t2mlr_jax.model.mixers import MIXERS, GateStats
from t2mlr_jax.registry import RECURRENCES, RecurrenceType

CACHE_NORMS = ("clipped_rms", "rmsnorm", "none")
CURRICULUM_SCHEDULES = ("linear", "cosine", "exponential", "step")   # the release's four


@dataclasses.dataclass(frozen=True)
class T2MLRConfig(RecurrenceConfig):
  """Temporal middle-layer recurrence (docs/models.md#t2mlr) and its Jacobi defaults.

  l_start/l_end are 0-based and both inclusive; negative values count from the
  end as in Python (l_end=-1 is the last layer). They are resolved against the
  number of layers by `ModelConfig`.
  """
  type: ClassVar[str] = "t2mlr"
  default_schedule: ClassVar[str] = "jacobi"     # train.mode "auto"
  parallel_runs_mixer: ClassVar[bool] = False   # parallel mode: the plain transformer
  replaces_value_embeds: ClassVar[bool] = False
  l_start: int = 1             # first layer of the recurrent span (0-based)
  l_end: int = -2              # last layer of the span (inclusive; negative from the end)
  residual: bool = True        # state z = o_t + R_t at recurrent positions
  residual_detach: bool = True  # R_t under stop_gradient in that residual
  residual_weight: float = 1.0  # z = o_t + w·R_t (the release's _residual_to_recurrent_cache_weight)
  cache_norm: str = "clipped_rms"   # "clipped_rms", "rmsnorm" or "none"
  cache_norm_eps: float = 1e-6
  cache_norm_clip: float = 5.0      # clipped_rms: clip of the normalised state
  gate_init: float = 0.5       # sigmoid gates start at this value (bias = logit)
  gate_gain: float = 1.0       # Xavier-normal gain of f_rec/f_cur (1e-2 for retrofit)
  mixer: str = "gated"         # the fusion Φ: a registered mixer (model/mixers.py)
  mixer_options: tuple = ()    # its options: (name, value) pairs or "name=value" strings
  # the state read under stop_gradient (the release's option: no gradient through the
  # recurrent connection)
  connection_detach: bool = False
  # the release's recurrent_skip_to_l_end: l_end's output plus w·R_t at recurrent positions
  # (R_t as l_start read it), which the layers above and the state read; residual off
  skip_to_l_end: bool = False
  skip_weight: float = 1.0
  skip_detach: bool = False         # R_t under stop_gradient in the skip
  skip_post_norm: bool = False      # the skip RMS-scaled (clipped, stop-gradient scale)
  skip_post_norm_eps: float = 1e-6
  skip_post_norm_clamp: float = 5.0
  # the release's recurrent_weight curriculum: the mixer's fixed recurrent weight moved from
  # start to end over warm-up steps (else ratio x train steps, else all of them), set by the
  # trainer before every step (`at_step`); schedules in CURRICULUM_SCHEDULES
  use_recurrent_weight_curriculum: bool = False
  recurrent_weight_curriculum_start: float = 0.0       # the weight at step 0
  recurrent_weight_curriculum_end: float = 1.0         # from the warm-up's end on
  recurrent_weight_curriculum_schedule: str = "linear"   # its shape over the warm-up
  recurrent_weight_curriculum_warmup_steps: Optional[int] = None   # None: by the ratio
  recurrent_weight_curriculum_warmup_ratio: Optional[float] = None  # None: the whole run

  def __post_init__(self):
    if self.cache_norm not in CACHE_NORMS:
      invalid("cache_norm", self.cache_norm, f"one of {CACHE_NORMS}")
    if not 0.0 < self.gate_init < 1.0:
      invalid("gate_init", self.gate_init, "a float in (0, 1)")
    if not self.cache_norm_clip >= 1.0:
      invalid("cache_norm_clip", self.cache_norm_clip, ">= 1")
    if not self.cache_norm_eps > 0:
      invalid("cache_norm_eps", self.cache_norm_eps, "> 0")
    if not self.gate_gain > 0:
      invalid("gate_gain", self.gate_gain, "> 0")
    if not self.skip_post_norm_clamp >= 1.0:
      invalid("skip_post_norm_clamp", self.skip_post_norm_clamp, ">= 1")
    if not self.skip_post_norm_eps > 0:
      invalid("skip_post_norm_eps", self.skip_post_norm_eps, "> 0")
    if self.skip_to_l_end and self.residual:
      raise ValueError("recurrence.skip_to_l_end=True needs recurrence.residual=False: the "
                       "state is l_end's output with the skip added, not a residual of it "
                       "(the release applies one or the other)")
    MIXERS.get(self.mixer, "recurrence.mixer")
    object.__setattr__(self, "mixer_options",
                       mixers.canonical_options(self.mixer, self.mixer_options))
    self._check_curriculum()

  def _check_curriculum(self) -> None:
    prefix = "recurrence.recurrent_weight_curriculum_"
    if self.recurrent_weight_curriculum_schedule not in CURRICULUM_SCHEDULES:
      invalid(prefix + "schedule", self.recurrent_weight_curriculum_schedule,
              f"one of {CURRICULUM_SCHEDULES}")
    steps, ratio = (self.recurrent_weight_curriculum_warmup_steps,
                    self.recurrent_weight_curriculum_warmup_ratio)
    if steps is not None and (not isinstance(steps, int) or steps < 0):
      invalid(prefix + "warmup_steps", steps, "None or an integer >= 0")
    if ratio is not None and not 0.0 <= ratio <= 1.0:
      invalid(prefix + "warmup_ratio", ratio, "None or a float in [0, 1]")
    if steps is not None and ratio is not None:
      raise ValueError(f"{prefix}warmup_steps={steps} and {prefix}warmup_ratio={ratio} are "
                       "both set: allowed one of them (or neither: every train step)")
    if self.use_recurrent_weight_curriculum:
      mixers.check_fixed_weight(self)

  @property
  def gate_bias(self) -> float:
    """The gates' initial bias: logit(gate_init), so sigmoid(bias) = gate_init."""
    return math.log(self.gate_init / (1.0 - self.gate_init))

  def span(self, model: "ModelConfig") -> tuple[int, int]:
    """(first, last) layer of the recurrent span, both inclusive: l_start..l_end."""
    L = model.n_layers
    for name in ("l_start", "l_end"):
      value = getattr(self, name)
      if not -L <= value < L:
        invalid(f"recurrence.{name}", value, f"a layer index in [{-L}, {L - 1}] for n_layers={L}")
    start, end = self.l_start % L, self.l_end % L
    if start > end:
      raise ValueError(
          f"recurrence.l_start={self.l_start} (layer {start}) is after recurrence.l_end="
          f"{self.l_end} (layer {end}): need l_start <= l_end, both inclusive, in [0, {L - 1}]")
    return start, end

  def num_params(self, model: "ModelConfig") -> int:
    """The mixer's parameters (the paper's Φ: W_rec and two gates, 5D² + 2D, γ_rec, γ_cur)
    and an RMSNorm scale."""
    D = model.d_model
    return mixers.num_params(self, D) + (D if self.cache_norm == "rmsnorm" else 0)

  def mixer_flops(self, model: "ModelConfig", tokens: int, layers=None) -> float:
    """The mixer's FLOPs, once per run of the span whatever the `layers` run (the paper's
    Φ: W_rec (D²) and the two gates (2D·D each), 5D² multiply-adds)."""
    return mixers.flops_per_token(self, model.d_model) * tokens


def init_params(cfg: ModelConfig, rng) -> dict:
  rcfg = cfg.recurrence
  D = cfg.d_model
  dummy = jnp.zeros((1, 1, D), jnp.float32)
  params = dict(mixers.module_of(rcfg, D).init(rng, dummy, dummy).get("params", {}))
  if rcfg.residual and rcfg.cache_norm == "rmsnorm":
    params["cache_norm"] = {"scale": jnp.ones((D,), jnp.float32)}
  return params


def zero_state(cfg: ModelConfig, batch: int) -> jnp.ndarray:
  """The recurrent state carried between tokens: one fp32 D-vector per sequence."""
  return jnp.zeros((batch, cfg.d_model), jnp.float32)


layer_module = None      # T2MLR adds nothing inside the layers
refresh_kv = None        # its memory never enters keys or values


def read(cfg: ModelConfig, state_BTD, positions_BT, slots_BT=None):
  """The state a position reads: zero where the position id is 0 (a sequence or packed
  document starts); a constant to the gradient with `connection_detach`."""
  if cfg.recurrence.connection_detach:
    state_BTD = jax.lax.stop_gradient(state_BTD)
  return jnp.where((positions_BT == 0)[..., None], 0.0, state_BTD)


def memory(cfg: ModelConfig, state_BTD, cf_BT):
  return None


def enter(params, cfg: ModelConfig, h_BTD, prev_BTD, cf_BT):
  """Residual stream entering l_start: Φ(h, R) (R = prev, the state read) where cf == 2, h
  elsewhere; and the gates."""
  chex.assert_equal_shape([h_BTD, prev_BTD])
  p = {k: v for k, v in params["recurrence"].items() if k != "cache_norm"}
  dtype = h_BTD.dtype
  h32 = h_BTD.astype(jnp.float32)
  module = mixers.module_of(cfg.recurrence, cfg.d_model)
  fused, gates = module.apply({"params": p} if p else {}, h32, prev_BTD)
  out = jnp.where((cf_BT == CF_RECURRENT)[..., None], fused, h32)
  return out.astype(dtype), gates


def _cache_norm(params, rcfg: T2MLRConfig, z):
  if rcfg.cache_norm == "none":
    return z
  if rcfg.cache_norm == "rmsnorm":
    ms = jnp.mean(z * z, axis=-1, keepdims=True) + rcfg.cache_norm_eps
    return z * jax.lax.rsqrt(ms) * params["cache_norm"]["scale"]
  return _clipped_rms(z, rcfg.cache_norm_eps, rcfg.cache_norm_clip)


def _clipped_rms(z, eps: float, clip: float):
  """z · sg(clip(1/√(mean(z²) + eps), 1/clip, clip)): the release's post-norm."""
  ms = jnp.mean(z * z, axis=-1, keepdims=True) + eps
  return z * jax.lax.stop_gradient(jnp.clip(jax.lax.rsqrt(ms), 1.0 / clip, clip))


def span_exit(params, cfg: ModelConfig, o_BTD, prev_BTD, cf_BT):
  """l_end's output as the layers above and `carry` read it: with `skip_to_l_end`, plus
  w·R_t at recurrent positions (R_t the state the position read; `skip_detach`,
  `skip_post_norm` as the release's)."""
  rcfg = cfg.recurrence
  if not rcfg.skip_to_l_end:
    return o_BTD
  skip = jax.lax.stop_gradient(prev_BTD) if rcfg.skip_detach else prev_BTD
  skip = rcfg.skip_weight * skip.astype(jnp.float32)
  if rcfg.skip_post_norm:
    skip = _clipped_rms(skip, rcfg.skip_post_norm_eps, rcfg.skip_post_norm_clamp)
  on = (cf_BT == CF_RECURRENT)[..., None]
  return o_BTD + jnp.where(on, skip, 0.0).astype(o_BTD.dtype)


def carry(params, cfg: ModelConfig, o_BTD, prev_BTD, cf_BT):
  """The state each position leaves for the next one, from l_end's output o and the state
  R_t = prev it read. cf 2: norm of o_t + w·R_t (raw o_t when residual is off);
  cf 1: raw o_t; cf 0 (padding): zeros."""
  rcfg = cfg.recurrence
  o = o_BTD.astype(jnp.float32)
  if rcfg.residual:
    prev = jax.lax.stop_gradient(prev_BTD) if rcfg.residual_detach else prev_BTD
    z = _cache_norm(params["recurrence"], rcfg, o + rcfg.residual_weight * prev)
  else:
    z = o
  cf = cf_BT[..., None]
  return jnp.where(cf == CF_RECURRENT, z, jnp.where(cf == CF_PLAIN, o, 0.0))


def plain_state(cfg: ModelConfig, o_BTD, cf_BT):
  """Hook of the Jacobi schedule's sweep 0 (the release's): the span runs without the
  fusion and its raw output, zero at padding, is the first state."""
  return jnp.where((cf_BT == CF_PAD)[..., None], 0.0, o_BTD.astype(jnp.float32))


def stats(gates: GateStats, cf_BT):
  """Mean gate values over recurrent positions (0 when there are none)."""
  w = (cf_BT == CF_RECURRENT).astype(jnp.float32)[..., None]
  denom = jnp.maximum(jnp.sum(w) * gates.s_rec.shape[-1], 1.0)
  return {"gate_rec": jnp.sum(gates.s_rec * w) / denom,
          "gate_cur": jnp.sum(gates.s_cur * w) / denom}


def layer_stats(collected, cfg: ModelConfig) -> dict:
  return {}


def scalars(params, cfg: ModelConfig) -> dict:
  """The learned scalars a training log shows: the mixer's (γ_rec and γ_cur for Φ)."""
  return {k: v for k, v in params["recurrence"].items()
          if k != "cache_norm" and not isinstance(v, dict) and jnp.ndim(v) == 0}


def value_embed_rows(params, cfg: ModelConfig, tokens_BT):
  return None


def curriculum_weight(rcfg: T2MLRConfig, step, num_steps: Optional[int]):
  """The recurrent weight at (0-based) train step `step`, as the release's
  RecurrentWeightCurriculumScheduler.get_value: start + (end - start)·f(step / warm-up),
  f = p, (1 - cos πp)/2, p² or [p >= 1/2] (linear, cosine, exponential, step), the end
  value from the warm-up's last step on. Traceable in `step`."""
  warm = rcfg.recurrent_weight_curriculum_warmup_steps
  if warm is None:
    if num_steps is None:
      raise ValueError("the recurrent_weight curriculum needs the run's train steps (its "
                       "warm-up defaults to them): pass num_steps, or set recurrence."
                       "recurrent_weight_curriculum_warmup_steps")
    ratio = rcfg.recurrent_weight_curriculum_warmup_ratio
    warm = num_steps if ratio is None else int(num_steps * ratio)
  elif num_steps is not None and warm > num_steps:
    invalid("recurrence.recurrent_weight_curriculum_warmup_steps", warm,
            f"at most the run's {num_steps} train steps")
  start, end = rcfg.recurrent_weight_curriculum_start, rcfg.recurrent_weight_curriculum_end
  if warm == 0:
    return jnp.float32(end)
  p = jnp.clip(jnp.asarray(step, jnp.float32) / warm, 0.0, 1.0)
  f = {"linear": lambda: p, "cosine": lambda: (1.0 - jnp.cos(p * math.pi)) / 2,
       "exponential": lambda: p * p,
       "step": lambda: (p >= 0.5).astype(jnp.float32)}[rcfg.recurrent_weight_curriculum_schedule]
  return jnp.float32(start) + (end - start) * f()


def at_step(params, cfg: ModelConfig, step, num_steps: Optional[int]):
  """The trainer's hook before every step: with the curriculum on, the mixer's
  `recurrent_weight` leaf set to the curriculum's value at `step` (what the step trains
  with and a checkpoint then keeps); else the parameters as they are."""
  rcfg = cfg.recurrence
  if not rcfg.use_recurrent_weight_curriculum:
    return params
  rec = dict(params["recurrence"])
  rec[mixers.FIXED_WEIGHT_LEAF] = curriculum_weight(rcfg, step, num_steps).astype(
      rec[mixers.FIXED_WEIGHT_LEAF].dtype)
  return {**params, "recurrence": rec}


def fixed_leaves(cfg: ModelConfig) -> tuple:
  """Leaves `at_step` sets, which the optimizer never updates."""
  return ((mixers.FIXED_WEIGHT_LEAF,) if cfg.recurrence.use_recurrent_weight_curriculum
          else ())


def retrofit(rcfg: T2MLRConfig) -> T2MLRConfig:
  """Any T2MLR block can be added to a pretrained model: γ_rec = γ_cur = 0 at init, so
  Φ(h, R) = h and the model computes the pretrained function until it trains; so can any
  mixer whose fresh init is the identity (`Mixer.identity_at_init`)."""
  mixers.check_identity_at_init(rcfg)
  return rcfg


TYPE = RECURRENCES.register(RecurrenceType.from_module(
    sys.modules[__name__], name=T2MLRConfig.type, config=T2MLRConfig, default=True,
    retrofit=retrofit,
    # every registered mixer's declarations, read when asked (the cache norm's scale is
    # the backbone's rule: `scale`)
    no_decay=mixers.EVERY_NO_DECAY, partition_rules=mixers.EVERY_PARTITION_RULE))
