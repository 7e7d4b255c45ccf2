"""Model configuration: frozen, hashable dataclasses validated on construction.

`ModelConfig` describes the Llama-family backbone; `T2MLRConfig` the temporal
middle-layer recurrence added to it (SPEC §2). Both are hashable so they can be
static arguments of `jax.jit`. This module imports nothing else of ours.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional

CACHE_NORMS = ("clipped_rms", "rmsnorm", "none")
ROPE_SCALING_TYPES = ("llama3",)
DTYPES = ("float32", "bfloat16")
REMAT_POLICIES = ("none", "full", "dots")


def _fail(field: str, value: Any, allowed: str) -> None:
  raise ValueError(f"{field}={value!r} is invalid: allowed {allowed}")


class _Replaceable:
  """Mixin giving frozen dataclasses a validated `.replace(**kw)`."""

  def replace(self, **kw):
    names = {f.name for f in dataclasses.fields(self)}
    unknown = sorted(set(kw) - names)
    if unknown:
      raise ValueError(
          f"{type(self).__name__} has no field(s) {unknown}; fields are {sorted(names)}")
    return dataclasses.replace(self, **kw)

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class RopeScaling(_Replaceable):
  """Llama-3.x frequency-dependent RoPE scaling (`rope_type="llama3"`)."""
  rope_type: str = "llama3"
  factor: float = 8.0
  low_freq_factor: float = 1.0
  high_freq_factor: float = 4.0
  original_max_position_embeddings: int = 8192

  def __post_init__(self):
    if self.rope_type not in ROPE_SCALING_TYPES:
      _fail("rope_scaling.rope_type", self.rope_type, f"one of {ROPE_SCALING_TYPES}")
    if not self.factor > 0:
      _fail("rope_scaling.factor", self.factor, "> 0")
    if not self.high_freq_factor > self.low_freq_factor > 0:
      _fail("rope_scaling.high_freq_factor", self.high_freq_factor,
            f"> low_freq_factor ({self.low_freq_factor}) > 0")
    if self.original_max_position_embeddings < 1:
      _fail("rope_scaling.original_max_position_embeddings",
            self.original_max_position_embeddings, ">= 1")


@dataclasses.dataclass(frozen=True)
class T2MLRConfig(_Replaceable):
  """Temporal middle-layer recurrence (SPEC §2) and its Jacobi defaults (SPEC §3).

  l_start/l_end are 0-based and both inclusive; negative values count from the
  end as in Python (l_end=-1 is the last layer). They are resolved against the
  number of layers by `ModelConfig`.
  """
  l_start: int = 1
  l_end: int = -2
  d_forward: int = 16          # D_f: total sweeps (sweep 0 + D_f-1 middle sweeps)
  d_backward: int = 4          # D_b: sweeps that carry gradient (the last ones)
  jacobi_tol: Optional[float] = None   # stop no-grad sweeps once max|dR| < tol
  residual: bool = True        # cache z = o_t + R_t at recurrent positions
  residual_detach: bool = True  # R_t under stop_gradient in that residual
  cache_norm: str = "clipped_rms"
  cache_norm_eps: float = 1e-6
  cache_norm_clip: float = 5.0
  gate_init: float = 0.5       # sigmoid gates start at this value (bias = logit)
  gate_gain: float = 1.0       # Xavier-normal gain of f_rec/f_cur (1e-2 for retrofit)

  def __post_init__(self):
    if self.d_forward < 1:
      _fail("d_forward", self.d_forward, "an integer >= 1")
    if not 1 <= self.d_backward <= self.d_forward:
      _fail("d_backward", self.d_backward, f"1 <= d_backward <= d_forward ({self.d_forward})")
    if self.jacobi_tol is not None and not self.jacobi_tol > 0:
      _fail("jacobi_tol", self.jacobi_tol, "None or a float > 0")
    if self.cache_norm not in CACHE_NORMS:
      _fail("cache_norm", self.cache_norm, f"one of {CACHE_NORMS}")
    if not 0.0 < self.gate_init < 1.0:
      _fail("gate_init", self.gate_init, "a float in (0, 1)")
    if not self.cache_norm_clip >= 1.0:
      _fail("cache_norm_clip", self.cache_norm_clip, ">= 1")
    if not self.cache_norm_eps > 0:
      _fail("cache_norm_eps", self.cache_norm_eps, "> 0")
    if not self.gate_gain > 0:
      _fail("gate_gain", self.gate_gain, "> 0")

  @property
  def gate_bias(self) -> float:
    return math.log(self.gate_init / (1.0 - self.gate_init))


# Shapes from the models' public config.json files (SPEC §1).
PRESETS = {
    "smollm2-135m": dict(n_layers=30, d_model=576, n_heads=9, n_kv_heads=3, d_ff=1536,
                         vocab_size=49152, tie_embeddings=True, rope_theta=100000.0,
                         max_seq_len=8192, rms_norm_eps=1e-5),
    "smollm2-360m": dict(n_layers=32, d_model=960, n_heads=15, n_kv_heads=5, d_ff=2560,
                         vocab_size=49152, tie_embeddings=True, rope_theta=100000.0,
                         max_seq_len=8192, rms_norm_eps=1e-5),
    "smollm2-1.7b": dict(n_layers=24, d_model=2048, n_heads=32, n_kv_heads=32, d_ff=8192,
                         vocab_size=49152, tie_embeddings=True, rope_theta=130000.0,
                         max_seq_len=8192, rms_norm_eps=1e-5),
    "s5": dict(n_layers=6, d_model=384, n_heads=6, n_kv_heads=6, d_ff=1536,
               vocab_size=188, tie_embeddings=False, rope_theta=None,
               max_seq_len=1024, rms_norm_eps=1e-5),
}


@dataclasses.dataclass(frozen=True)
class ModelConfig(_Replaceable):
  """A Llama-family decoder (SmolLM2 / Llama / Qwen2 shape), optionally with T2MLR.

  rope_theta=None means no positional encoding at all (NoPE). `recurrence=None`
  is the plain transformer. `dtype` is the compute dtype; parameters are fp32
  and the recurrence and cache norm always run in fp32.
  """
  vocab_size: int = 256
  d_model: int = 64
  n_layers: int = 4
  n_heads: int = 4
  n_kv_heads: Optional[int] = None      # None: = n_heads (no grouping)
  d_ff: int = 128
  head_dim: Optional[int] = None        # None: d_model // n_heads
  max_seq_len: int = 2048
  rope_theta: Optional[float] = 10000.0
  rope_scaling: Optional[RopeScaling] = None
  rms_norm_eps: float = 1e-5
  tie_embeddings: bool = False
  qkv_bias: bool = False
  init_std: float = 0.02
  dtype: str = "float32"
  scan_layers: bool = True              # False: unrolled Python loop (tests, compile-time study)
  remat: str = "none"                   # rematerialisation of each block in training
  recurrence: Optional[T2MLRConfig] = None

  def __post_init__(self):
    for name in ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "max_seq_len"):
      value = getattr(self, name)
      if not isinstance(value, int) or value < 1:
        _fail(name, value, "an integer >= 1")
    if self.n_kv_heads is None:
      object.__setattr__(self, "n_kv_heads", self.n_heads)
    if self.n_kv_heads < 1 or self.n_heads % self.n_kv_heads:
      _fail("n_kv_heads", self.n_kv_heads, f"a divisor of n_heads ({self.n_heads})")
    if self.head_dim is None:
      if self.d_model % self.n_heads:
        _fail("n_heads", self.n_heads, f"a divisor of d_model ({self.d_model}) or set head_dim")
      object.__setattr__(self, "head_dim", self.d_model // self.n_heads)
    if self.head_dim < 2 or (self.rope_theta is not None and self.head_dim % 2):
      _fail("head_dim", self.head_dim, "an even integer >= 2 with RoPE")
    if self.rope_theta is not None and not self.rope_theta > 0:
      _fail("rope_theta", self.rope_theta, "None (NoPE) or a float > 0")
    if isinstance(self.rope_scaling, dict):
      object.__setattr__(self, "rope_scaling", RopeScaling(**self.rope_scaling))
    if self.rope_scaling is not None and self.rope_theta is None:
      _fail("rope_scaling", self.rope_scaling, "None when rope_theta is None (NoPE)")
    if self.dtype not in DTYPES:
      _fail("dtype", self.dtype, f"one of {DTYPES}")
    if self.remat not in REMAT_POLICIES:
      _fail("remat", self.remat, f"one of {REMAT_POLICIES}")
    if isinstance(self.recurrence, dict):
      object.__setattr__(self, "recurrence", T2MLRConfig(**self.recurrence))
    if self.recurrence is not None:
      self.recurrent_block  # validates the layer range

  @property
  def recurrent_block(self) -> tuple[int, int]:
    """(l_start, l_end) resolved to non-negative indices, both inclusive."""
    rec = self.recurrence
    if rec is None:
      raise ValueError("recurrence is None: this model has no recurrent block")
    L = self.n_layers
    for name in ("l_start", "l_end"):
      value = getattr(rec, name)
      if not -L <= value < L:
        _fail(f"recurrence.{name}", value, f"a layer index in [{-L}, {L - 1}] for n_layers={L}")
    start, end = rec.l_start % L, rec.l_end % L
    if start > end:
      raise ValueError(
          f"recurrence.l_start={rec.l_start} (layer {start}) is after recurrence.l_end="
          f"{rec.l_end} (layer {end}): need l_start <= l_end, both inclusive, in [0, {L - 1}]")
    return start, end

  @property
  def segments(self) -> tuple[tuple[str, int, int], ...]:
    """The layer stack as (name, lo, hi) half-open ranges: below / inside / above."""
    if self.recurrence is None:
      return (("all", 0, self.n_layers),)
    start, end = self.recurrent_block
    parts = (("lower", 0, start), ("middle", start, end + 1), ("upper", end + 1, self.n_layers))
    return tuple(p for p in parts if p[2] > p[1])

  @classmethod
  def preset(cls, name: str, **overrides) -> "ModelConfig":
    """A named shape from SPEC §1, e.g. `ModelConfig.preset("smollm2-135m", recurrence=...)`."""
    if name not in PRESETS:
      _fail("preset", name, f"one of {sorted(PRESETS)}")
    return cls(**{**PRESETS[name], **overrides})

  def num_params(self) -> int:
    """Parameter count (embedding counted once when tied)."""
    D, F, Hd = self.d_model, self.d_ff, self.head_dim
    q, kv = self.n_heads * Hd, self.n_kv_heads * Hd
    attn = D * q + 2 * D * kv + q * D + (q + 2 * kv if self.qkv_bias else 0)
    per_layer = attn + 3 * D * F + 2 * D
    total = self.vocab_size * D + self.n_layers * per_layer + D
    if not self.tie_embeddings:
      total += D * self.vocab_size
    if self.recurrence is not None:
      total += 5 * D * D + 2 * D + 2 + (D if self.recurrence.cache_norm == "rmsnorm" else 0)
    return total
