"""Model configuration: frozen, hashable dataclasses validated on construction.

`ModelConfig` describes the backbone (Llama family, with nanochat's options); its
`recurrence` is one of the registered recurrence types (docs/models.md; `registry.py`):
`T2MLRConfig` (temporal middle-layer recurrence), `LRTConfig` (latent recurrent
transformer) or a user's. All are hashable so they can be static arguments of
`jax.jit`. `invalid` is the one helper every config in the library raises its errors
through. Of ours it imports only the registry (a leaf), where the recurrence types'
config classes are looked up.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar, Optional, Union

from t2mlr_jax.registry import default_recurrence, recurrence_config_classes

CACHE_NORMS = ("clipped_rms", "rmsnorm", "none")
ROPE_SCALING_TYPES = ("llama3",)
DTYPES = ("float32", "bfloat16")
REMAT_POLICIES = ("none", "full", "dots")
MLP_TYPES = ("swiglu", "relu2")
ATTENTION_IMPLS = ("xla", "cudnn", "splash", "auto")     # see model/kernels.py
VALUE_EMBEDS = ("alternating", "every")
LRT_PROJECTIONS = ("layerwise", "shared")
LRT_INITS = ("official", "identity")
FLOAT32_EPS = 1.1920929e-07     # nanochat's RMSNorm epsilon (F.rms_norm with eps=None)


def invalid(field: str, value: Any, allowed: str, prefix: str = "") -> None:
  """Raise the library's one kind of configuration error: the field, its value, what is
  allowed. `prefix` names where the field lives (e.g. "config field ")."""
  raise ValueError(f"{prefix}{field}={value!r} is invalid: allowed {allowed}")



class _Replaceable:
  """Mixin giving frozen dataclasses a validated `.replace(**kw)`."""

  def replace(self, **kw):
    """A copy with the given fields changed, validated again (unknown names refused)."""
    names = {f.name for f in dataclasses.fields(self)}
    unknown = sorted(set(kw) - names)
    if unknown:
      raise ValueError(
          f"{type(self).__name__} has no field(s) {unknown}; fields are {sorted(names)}")
    return dataclasses.replace(self, **kw)

  def to_dict(self) -> dict:
    """The fields as a plain dict (JSON-ready; what checkpoints record)."""
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
      invalid("rope_scaling.rope_type", self.rope_type, f"one of {ROPE_SCALING_TYPES}")
    if not self.factor > 0:
      invalid("rope_scaling.factor", self.factor, "> 0")
    if not self.high_freq_factor > self.low_freq_factor > 0:
      invalid("rope_scaling.high_freq_factor", self.high_freq_factor,
            f"> low_freq_factor ({self.low_freq_factor}) > 0")
    if self.original_max_position_embeddings < 1:
      invalid("rope_scaling.original_max_position_embeddings",
            self.original_max_position_embeddings, ">= 1")


@dataclasses.dataclass(frozen=True)
class ScheduleOptions(_Replaceable):
  """The options of every training schedule (`model/schedules/`), carried by every
  recurrence config so any schedule trains any type (each overridable per call).

  d_forward / d_backward / jacobi_tol: Jacobi's D_f (sweep 0 + D_f−1 span sweeps), D_b
  (the last sweeps, with gradient) and its tolerance (stop the no-gradient sweeps once
  max|ΔR| < tol). passes: S of interleaved training (positions t ≡ p−1 mod S in pass p)
  and the number of contiguous chunks of chunked training. kv_refresh: re-project
  not-yet-visited positions' feedback between passes (a type whose memory enters keys and
  values: LRT). refine_passes: K of multi-refine training (K full passes after the
  zero-state one); refine_weights: its loss weight per pass 0..K (K+1 values; empty =
  uniform); refine_detach: stop the gradient through the states between refine passes.
  """
  d_forward: int = 16           # jacobi: sweeps D_f
  d_backward: int = 4           # jacobi: the last sweeps, with gradient, D_b
  jacobi_tol: Optional[float] = None   # jacobi: stop sweeps once max|dR| < tol
  passes: int = 2               # interleaved / chunked: S passes
  kv_refresh: bool = False      # interleaved / chunked: the type's K/V refresh (LRT)
  refine_passes: int = 3        # multi_refine: K passes after pass 0
  refine_weights: tuple = ()    # multi_refine: loss weight per pass 0..K (empty: uniform)
  refine_detach: bool = False   # multi_refine: no gradient between passes

  def __post_init__(self):
    if isinstance(self.d_forward, bool) or not isinstance(self.d_forward, int) \
        or self.d_forward < 1:
      invalid("d_forward", self.d_forward, "an integer >= 1")
    if not 1 <= self.d_backward <= self.d_forward:
      invalid("d_backward", self.d_backward, f"1 <= d_backward <= d_forward ({self.d_forward})")
    if self.jacobi_tol is not None and not self.jacobi_tol > 0:
      invalid("jacobi_tol", self.jacobi_tol, "None or a float > 0")
    if not isinstance(self.passes, int) or self.passes < 1:
      invalid("recurrence.passes", self.passes, "an integer >= 1 (and <= the sequence length)")
    if not isinstance(self.refine_passes, int) or self.refine_passes < 0:
      invalid("recurrence.refine_passes", self.refine_passes, "an integer >= 0")
    weights = tuple(float(w) for w in (self.refine_weights or ()))
    object.__setattr__(self, "refine_weights", weights)
    if weights and (len(weights) != self.refine_passes + 1 or min(weights) < 0
                    or not sum(weights) > 0):
      invalid("recurrence.refine_weights", self.refine_weights,
              f"empty (uniform) or refine_passes+1={self.refine_passes + 1} weights >= 0 "
              "(passes 0..K) with a positive sum")

  def to_dict(self) -> dict:
    """The fields and the type name (a recurrence config's class attribute `type`), as
    `recurrence_from_dict` reads them back."""
    return {"type": type(self).type, **dataclasses.asdict(self)}


@dataclasses.dataclass(frozen=True)
class T2MLRConfig(ScheduleOptions):
  """Temporal middle-layer recurrence (docs/models.md#t2mlr) and its Jacobi defaults.

  l_start/l_end are 0-based and both inclusive; negative values count from the
  end as in Python (l_end=-1 is the last layer). They are resolved against the
  number of layers by `ModelConfig`.
  """
  type: ClassVar[str] = "t2mlr"
  default_schedule: ClassVar[str] = "jacobi"     # train.mode "auto"
  parallel_runs_mixer: ClassVar[bool] = False   # parallel mode: the plain transformer
  replaces_value_embeds: ClassVar[bool] = False
  l_start: int = 1             # first layer of the recurrent block (0-based)
  l_end: int = -2              # last layer of the block (inclusive; negative from the end)
  residual: bool = True        # cache z = o_t + R_t at recurrent positions
  residual_detach: bool = True  # R_t under stop_gradient in that residual
  cache_norm: str = "clipped_rms"   # "clipped_rms", "rmsnorm" or "none"
  cache_norm_eps: float = 1e-6
  cache_norm_clip: float = 5.0      # clipped_rms: clip of the normalised cache
  gate_init: float = 0.5       # sigmoid gates start at this value (bias = logit)
  gate_gain: float = 1.0       # Xavier-normal gain of f_rec/f_cur (1e-2 for retrofit)

  def __post_init__(self):
    super().__post_init__()
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
    """The fusion's W_rec and two gates (5D² + 2D), γ_rec, γ_cur, an RMSNorm scale."""
    D = model.d_model
    return 5 * D * D + 2 * D + 2 + (D if self.cache_norm == "rmsnorm" else 0)

  def mixer_flops(self, model: "ModelConfig", tokens: int, layers=None) -> float:
    """The fusion's matmuls, once per run of the span whatever the `layers` run: W_rec
    (D²) and the two gates (2D·D each), 5D² multiply-adds."""
    return float(2 * 5 * model.d_model ** 2 * tokens)


@dataclasses.dataclass(frozen=True)
class LRTConfig(ScheduleOptions):
  """Latent Recurrent Transformer (docs/models.md): the previous token's normed hidden
  state m_t fed back into every layer (residual γ_i·m, gated key/value feedback).

  source_layer: -1 = the input of the LM head (the final normed state, as the
  release); k = the parameter-free-normed output of layer k. `residual`, `key`,
  `value`, `value_embeds`: which feedback paths exist (the paper's ablations).
  projection: "layerwise" (W_k, W_v per layer) or "shared" (one pair for all layers).
  gate_channels: channels of norm(x) the triple gate reads (0 = all d_model).
  init: "official" (the release's init_weights) or "identity" (γ = 0 and zero
  feedback weights: a fresh model computes exactly its base transformer).
  The schedules' options (passes, kv_refresh, refine_*, d_forward, ...): `ScheduleOptions`.
  reset_at_segment_start: memory is zero wherever the position id is 0 (packed
  documents, left padding); False is the release, which zeroes it only at t = 0.
  """
  type: ClassVar[str] = "lrt"
  default_schedule: ClassVar[str] = "interleaved"   # train.mode "auto"
  parallel_runs_mixer: ClassVar[bool] = True        # parallel mode: the full pass, m = 0
  replaces_value_embeds: ClassVar[bool] = True      # presets drop nanochat's tables
  source_layer: int = -1
  residual: bool = True
  key: bool = True
  value: bool = True
  value_embeds: bool = True
  projection: str = "layerwise"
  gate_channels: int = 32
  init: str = "official"
  reset_at_segment_start: bool = True

  def __post_init__(self):
    super().__post_init__()
    if self.projection not in LRT_PROJECTIONS:
      invalid("recurrence.projection", self.projection, f"one of {LRT_PROJECTIONS}")
    if self.init not in LRT_INITS:
      invalid("recurrence.init", self.init, f"one of {LRT_INITS}")
    if not isinstance(self.gate_channels, int) or self.gate_channels < 0:
      invalid("recurrence.gate_channels", self.gate_channels, "an integer >= 0 (0 = d_model)")
    if not (self.residual or self.key or self.value or self.value_embeds):
      invalid("recurrence.residual/key/value/value_embeds", False,
              "at least one feedback path on")

  def source_index(self, model: "ModelConfig") -> int:
    """The memory's source layer as a non-negative index (n_layers-1 for -1: the final
    normed state)."""
    L = model.n_layers
    if not -L <= self.source_layer < L:
      invalid("recurrence.source_layer", self.source_layer,
              f"-1 (the LM head's input) or a layer index in [{-L}, {L - 1}] for n_layers={L}")
    if self.gate_channels > model.d_model:
      invalid("recurrence.gate_channels", self.gate_channels, f"0..d_model={model.d_model}")
    return self.source_layer % L

  def span(self, model: "ModelConfig") -> tuple[int, int]:
    """(first, last) layer of the recurrent span: 0..source layer (memory enters every
    layer; the span ends where it is read)."""
    source = self.source_index(model)
    if model.value_embeds is not None:
      invalid("value_embeds", model.value_embeds, "None with an LRT recurrence (LRT carries "
              "its own per-layer value embeddings: recurrence.value_embeds)")
    return 0, source

  def num_params(self, model: "ModelConfig") -> int:
    """Per layer: γ, the triple gate, value embeddings; W_k / W_v per layer or shared."""
    D, L, V = model.d_model, model.n_layers, model.padded_vocab
    kv = model.n_kv_heads * model.head_dim
    C = self.gate_channels or D
    proj = D * kv * (int(self.key) + int(self.value))
    return (L * (int(self.residual) + C * 3 * model.n_kv_heads + (V * kv if self.value_embeds
                                                                    else 0))
            + proj * (L if self.projection == "layerwise" else 1))

  def mixer_flops(self, model: "ModelConfig", tokens: int, layers=None) -> float:
    """In each of the `layers` run (default all): W_k and W_v (D·N_kv·K each, when on) and
    the triple gate (C·3·N_kv)."""
    kv = model.n_kv_heads * model.head_dim
    gate = (self.gate_channels or model.d_model) * 3 * model.n_kv_heads
    per_layer = (int(self.key) + int(self.value)) * model.d_model * kv + gate
    n = model.n_layers if layers is None else layers
    return float(2 * n * per_layer * tokens)


RecurrenceConfig = Union[T2MLRConfig, LRTConfig]    # the built-ins; any registered type's config


def recurrence_from_dict(d: dict) -> RecurrenceConfig:
  """A recurrence config from its dict; `type` defaults to "t2mlr" (exports written
  before LRT existed carry no tag). An option of another type is named as such."""
  d = dict(d)
  kind = d.pop("type", None) or default_recurrence().name
  classes = recurrence_config_classes()
  if kind not in classes:
    invalid("recurrence.type", kind, f"one of {sorted(classes)}")
  cls = classes[kind]
  names = {f.name for f in dataclasses.fields(cls)}
  for key in d:
    if key not in names:
      owner = [t for t, c in classes.items()
               if t != kind and key in {f.name for f in dataclasses.fields(c)}]
      what = f"a {owner[0]} option" if owner else "not an option of any recurrence type"
      raise ValueError(f"recurrence.{key} is {what}, not one of {kind}'s: allowed fields of "
                       f"{cls.__name__} are {sorted(names)}")
  return cls(**d)


# Shapes from the models' public config.json files (docs/models.md#backbone-and-presets).
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

# nanochat's backbone (the LRT release's): parameter-free norms, the norm after the
# embedding, QK-norm, relu² MLP (4x), softcap 15, α/β scalars, "SSSL" windows, untied
# head, vocabulary rows padded to a multiple of 64.
NANOCHAT = dict(norm_scale=False, embed_norm=True, qk_norm=True, mlp_type="relu2",
                logit_softcap=15.0, resid_lambdas=True, x0_lambdas=True, window_pattern="SSSL",
                tie_embeddings=False, rope_theta=10000.0, rms_norm_eps=FLOAT32_EPS,
                pad_vocab_to=64, value_embeds="alternating", ve_gate_channels=32)


def _nanochat(depth: int) -> dict:
  """nanochat's depth rule: d_model = 64·depth rounded up to a multiple of head_dim 128,
  no GQA, vocab 32768, T 2048."""
  d = -(-64 * depth // 128) * 128
  return dict(NANOCHAT, n_layers=depth, d_model=d, n_heads=d // 128, n_kv_heads=d // 128,
              d_ff=4 * d, vocab_size=32768, max_seq_len=2048)


PRESETS.update({"nanochat-d12": _nanochat(12), "nanochat-d20": _nanochat(20)})


@dataclasses.dataclass(frozen=True)
class ModelConfig(_Replaceable):
  """A Llama-family decoder (SmolLM2 / Llama / Qwen2 shape), optionally with T2MLR.

  rope_theta=None means no positional encoding at all (NoPE). `recurrence=None`
  is the plain transformer. `dtype` is the compute dtype; parameters are fp32
  and the recurrence and cache norm always run in fp32.

  nanochat's options (all off by default; `preset("nanochat-d12")` turns them on):
  norm_scale=False parameter-free RMSNorms; embed_norm: x0 = norm(embedding);
  qk_norm: parameter-free RMSNorm of q and k per head after RoPE; mlp_type "relu2":
  down(relu(up x)²); logit_softcap c: c·tanh(z/c); resid_lambdas / x0_lambdas: x ←
  α_i·x + β_i·x0 before block i (α init 1, β init 0.1); window_pattern e.g. "SSSL"
  tiled over layers, S = window_short (default window_long // 2), L = window_long
  (default max_seq_len), the last layer always L; key s is visible from query t iff
  0 <= t - s <= W (a window >= the sequence is full attention); pad_vocab_to: the
  embedding and head carry rows up to a multiple of it (logits keep vocab_size);
  value_embeds "alternating" (layers with the last layer's parity) or "every": a
  token-indexed table per such layer added to the values, v += 2σ(norm(x)[:C] W) · ve
  (one gate per KV head, C = ve_gate_channels, 0 = d_model), before RoPE;
  rope_table_dtype "bfloat16": the cos/sin tables rounded to bfloat16 and used in fp32,
  as the LRT release stores them. attention: the full-sequence attention kernel, "xla",
  "cudnn" (GPU, bf16/fp16), "splash" (Pallas TPU kernel) or "auto" (model/kernels.py).
  """
  vocab_size: int = 256
  d_model: int = 64
  n_layers: int = 4
  n_heads: int = 4
  n_kv_heads: Optional[int] = None      # None: n_heads (no grouped queries)
  d_ff: int = 128                       # MLP hidden width
  head_dim: Optional[int] = None        # None: d_model // n_heads
  max_seq_len: int = 2048               # longest sequence (RoPE tables, decode caches)
  rope_theta: Optional[float] = 10000.0   # None: no positional encoding (NoPE)
  rope_scaling: Optional[RopeScaling] = None
  rms_norm_eps: float = 1e-5
  tie_embeddings: bool = False          # LM head shares the embedding matrix
  qkv_bias: bool = False                # biases on q/k/v projections (Qwen-style)
  init_std: float = 0.02                # normal init std of the backbone's matrices
  dtype: str = "float32"                # "float32" or "bfloat16" (recurrence stays fp32)
  scan_layers: bool = True              # layer stack as lax.scan segments (False: unrolled)
  remat: str = "none"                   # per-block rematerialisation: "none", "full", "dots"
  norm_scale: bool = True               # False: parameter-free RMSNorm (nanochat)
  embed_norm: bool = False              # RMSNorm right after the embedding (nanochat)
  qk_norm: bool = False                 # RMSNorm of q and k per head after RoPE (nanochat)
  mlp_type: str = "swiglu"              # "swiglu" (Llama) or "relu2" (nanochat)
  logit_softcap: Optional[float] = None   # tanh soft cap of the logits
  resid_lambdas: bool = False           # learned per-layer residual scales (nanochat)
  x0_lambdas: bool = False              # learned per-layer mix of the embedding (nanochat)
  window_pattern: Optional[str] = None  # e.g. "SSSL": short/long windows
  window_short: Optional[int] = None    # tokens an "S" layer attends to
  window_long: Optional[int] = None     # tokens an "L" layer attends to
  pad_vocab_to: int = 1                 # round the vocabulary up to a multiple of this
  value_embeds: Optional[str] = None    # layers with value embeddings
  ve_gate_channels: int = 32            # channels the value-embedding gate reads
  rope_table_dtype: str = "float32"
  attention: str = "xla"                # "xla", "cudnn" (GPU), "splash" (TPU) or "auto"
  recurrence: Optional[RecurrenceConfig] = None

  def __post_init__(self):
    for name in ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "max_seq_len"):
      value = getattr(self, name)
      if not isinstance(value, int) or value < 1:
        invalid(name, value, "an integer >= 1")
    if self.n_kv_heads is None:
      object.__setattr__(self, "n_kv_heads", self.n_heads)
    if self.n_kv_heads < 1 or self.n_heads % self.n_kv_heads:
      invalid("n_kv_heads", self.n_kv_heads, f"a divisor of n_heads ({self.n_heads})")
    if self.head_dim is None:
      if self.d_model % self.n_heads:
        invalid("n_heads", self.n_heads, f"a divisor of d_model ({self.d_model}) or set head_dim")
      object.__setattr__(self, "head_dim", self.d_model // self.n_heads)
    if self.head_dim < 2 or (self.rope_theta is not None and self.head_dim % 2):
      invalid("head_dim", self.head_dim, "an even integer >= 2 with RoPE")
    if self.rope_theta is not None and not self.rope_theta > 0:
      invalid("rope_theta", self.rope_theta, "None (NoPE) or a float > 0")
    if isinstance(self.rope_scaling, dict):
      object.__setattr__(self, "rope_scaling", RopeScaling(**self.rope_scaling))
    if self.rope_scaling is not None and self.rope_theta is None:
      invalid("rope_scaling", self.rope_scaling, "None when rope_theta is None (NoPE)")
    if self.dtype not in DTYPES:
      invalid("dtype", self.dtype, f"one of {DTYPES}")
    if self.remat not in REMAT_POLICIES:
      invalid("remat", self.remat, f"one of {REMAT_POLICIES}")
    if self.rope_table_dtype not in DTYPES:
      invalid("rope_table_dtype", self.rope_table_dtype, f"one of {DTYPES}")
    if self.attention not in ATTENTION_IMPLS:
      invalid("attention", self.attention, f"one of {ATTENTION_IMPLS}")
    if self.mlp_type not in MLP_TYPES:
      invalid("mlp_type", self.mlp_type, f"one of {MLP_TYPES}")
    if self.logit_softcap is not None and not self.logit_softcap > 0:
      invalid("logit_softcap", self.logit_softcap, "None or a float > 0")
    if not isinstance(self.pad_vocab_to, int) or self.pad_vocab_to < 1:
      invalid("pad_vocab_to", self.pad_vocab_to, "an integer >= 1")
    self._check_windows()
    if self.value_embeds not in (None,) + VALUE_EMBEDS:
      invalid("value_embeds", self.value_embeds, f"None or one of {VALUE_EMBEDS}")
    if self.value_embeds is not None and (not isinstance(self.ve_gate_channels, int)
                                          or not 0 <= self.ve_gate_channels <= self.d_model):
      invalid("ve_gate_channels", self.ve_gate_channels, f"an integer in [0, d_model={self.d_model}]")
    if isinstance(self.recurrence, dict):
      object.__setattr__(self, "recurrence", recurrence_from_dict(self.recurrence))
    if self.recurrence is not None:
      classes = recurrence_config_classes()
      if not isinstance(self.recurrence, tuple(classes.values())):
        invalid("recurrence", self.recurrence, "None or the config of a registered "
                f"recurrence type: {', '.join(c.__name__ for c in classes.values())}")
      _ = self.recurrent_block  # validates the type's layers against the model

  def _check_windows(self):
    if self.window_pattern is None:
      for name in ("window_short", "window_long"):
        if getattr(self, name) is not None:
          invalid(name, getattr(self, name), "None when window_pattern is None")
      return
    pat = self.window_pattern
    if not isinstance(pat, str) or not pat or set(pat.upper()) - {"S", "L"}:
      invalid("window_pattern", pat, "None or a non-empty string of 'S' and 'L', e.g. 'SSSL'")
    for name in ("window_long", "window_short"):
      value = getattr(self, name)
      if value is not None and (not isinstance(value, int) or not 1 <= value <= self.max_seq_len):
        invalid(name, value, f"None or an integer in [1, max_seq_len={self.max_seq_len}]")

  @property
  def layer_windows(self) -> Optional[tuple]:
    """Per-layer attention window W (key s visible from t iff t - s <= W); None when no
    layer is windowed. A window >= max_seq_len is full attention."""
    if self.window_pattern is None:
      return None
    long = self.window_long if self.window_long is not None else self.max_seq_len
    short = self.window_short if self.window_short is not None else long // 2
    pat = self.window_pattern.upper()
    wins = [long if pat[i % len(pat)] == "L" else short for i in range(self.n_layers)]
    wins[-1] = long
    return tuple(wins)

  @property
  def value_embed_layers(self) -> tuple:
    """Layers with a value-embedding table (nanochat: the last layer's parity)."""
    if self.value_embeds is None:
      return ()
    L = self.n_layers
    return tuple(i for i in range(L) if self.value_embeds == "every" or i % 2 == (L - 1) % 2)

  @property
  def padded_vocab(self) -> int:
    """Rows of the embedding and the LM head: vocab_size rounded up to pad_vocab_to."""
    m = self.pad_vocab_to
    return -(-self.vocab_size // m) * m

  def to_dict(self) -> dict:
    """The fields as a plain dict, the recurrence with its type (JSON-ready)."""
    d = dataclasses.asdict(self)
    if self.recurrence is not None:
      d["recurrence"] = self.recurrence.to_dict()
    return d

  @property
  def recurrent_block(self) -> tuple[int, int]:
    """(first, last) layer of the recurrent span, resolved to non-negative indices, both
    inclusive: the layers that exact mode runs token by token (the type's `span`: T2MLR
    l_start..l_end, LRT 0..source layer)."""
    if self.recurrence is None:
      raise ValueError("recurrence is None: this model has no recurrent block")
    return self.recurrence.span(self)

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
    """A named shape of `PRESETS` (docs/models.md#backbone-and-presets), e.g.
    `ModelConfig.preset("smollm2-135m", recurrence=...)`."""
    if name not in PRESETS:
      invalid("preset", name, f"one of {sorted(PRESETS)}")
    fields = {**PRESETS[name], **overrides}
    rec = fields.get("recurrence")
    kind = (recurrence_config_classes().get(rec.get("type") or default_recurrence().name)
            if isinstance(rec, dict) else type(rec))
    if getattr(kind, "replaces_value_embeds", False) and "value_embeds" not in overrides:
      fields["value_embeds"] = None    # as the release: LRT's own value embeddings replace them
    return cls(**fields)

  def num_params(self) -> int:
    """Parameter count (embedding counted once when tied)."""
    D, F, Hd = self.d_model, self.d_ff, self.head_dim
    q, kv = self.n_heads * Hd, self.n_kv_heads * Hd
    attn = D * q + 2 * D * kv + q * D + (q + 2 * kv if self.qkv_bias else 0)
    norms = 2 * D if self.norm_scale else 0
    mlp = (3 if self.mlp_type == "swiglu" else 2) * D * F
    per_layer = attn + mlp + norms + int(self.resid_lambdas) + int(self.x0_lambdas)
    V = self.padded_vocab
    total = V * D + self.n_layers * per_layer + (D if self.norm_scale else 0)
    total += len(self.value_embed_layers) * (V * kv + (self.ve_gate_channels or D) * self.n_kv_heads)
    if not self.tie_embeddings:
      total += D * V
    if self.recurrence is not None:
      total += self.recurrence.num_params(self)
    return total
