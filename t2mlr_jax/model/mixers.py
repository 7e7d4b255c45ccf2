"""T2MLR's fusion mixers: how the state a position reads enters the residual stream at l_start.

Each mixer is a registered `Mixer` (`MIXERS`, `recurrence.mixer`): a Linen module computing
(out_BTD, GateStats) from (h_BTD, prev_BTD) at every position, the frozen dataclass of its
options (`recurrence.mixer_options`: defaults and checks), and what the optimizer, the
partitioner, the FLOPs count and the official importer need of its parameters. The seven
built-ins are the official release's mixing modules (docs/models.md#mixers); `gated` with
its defaults is the paper's Φ. A user's mixer registers the same way (`--user_module`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable, NamedTuple, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from t2mlr_jax.config import field_types, invalid
from t2mlr_jax.model.layers import matmul_fp32
from t2mlr_jax.registry import Registry

ACTIVATIONS = {"gelu": functools.partial(jax.nn.gelu, approximate=False), "relu": jax.nn.relu,
               "silu": jax.nn.silu, "swish": jax.nn.silu, "tanh": jnp.tanh}
PROJ_TYPES = ("auto", "linear", "mlp")
GATE_PROJ_TYPES = ("linear", "mlp")
NORM_TYPES = ("rmsnorm", "layernorm")
FIXED_WEIGHT_LEAF = "recurrent_weight"   # the curriculum's leaf (`fixed_recurrent_weight`)
RMS_EPS = float(jnp.finfo(jnp.float32).eps)   # torch.nn.RMSNorm's default (eps=None), fp32
LAYERNORM_EPS = 1e-5                           # torch.nn.LayerNorm's default


class GateStats(NamedTuple):
  s_rec: jnp.ndarray   # [B, T, D] the weight of the state's branch
  s_cur: jnp.ndarray   # [B, T, D] the weight of the current stream's branch


@dataclasses.dataclass(frozen=True, eq=False)
class Mixer:
  """One fusion mixer.

  module: a Linen module class built as module(options, rcfg, d_model) whose
  __call__(h_BTD, prev_BTD) returns (out_BTD, GateStats), fp32; its `init` declares the
  parameters (params["recurrence"], beside the cache norm's).
  options: the frozen dataclass of its options (None: it has none); each field an option
  with its default, its __post_init__ the checks (`invalid(name, value, allowed)`).
  flops(options, d_model, param_shapes) -> FLOPs per token of one application.
  no_decay: leaf names weight decay leaves alone; partition_rules: (path regex, logical
  axes) rows of its parameters. official_names: (the release's module attribute, our
  parameter name or None for a buffer) pairs, for `convert/official.py`.
  identity_at_init(options) -> bool: its fresh init computes out = h (a pretrained model
  keeps its function when the mixer is added); None: never.
  fixed_weight(options) -> bool: these options leave a fixed recurrent weight (its
  `recurrent_weight` option, read through `fixed_recurrent_weight`), which the
  recurrent_weight curriculum moves; None: never.
  """
  name: str
  module: type
  options: Optional[type] = None
  flops: Optional[Callable] = None
  no_decay: tuple = ()
  partition_rules: tuple = ()
  official_names: tuple = ()
  identity_at_init: Optional[Callable] = None
  fixed_weight: Optional[Callable] = None
  source: str = ""


MIXERS: Registry[Mixer] = Registry("mixer", "recurrence.mixer", __name__)


def register(entry: Mixer) -> Mixer:
  """Register a mixer (a user's file calls this on import)."""
  return MIXERS.register(entry)


class _EveryMixer:
  """An attribute of every registered mixer, joined, read at each iteration (the T2MLR type's
  `no_decay` and `partition_rules`: a mixer registered later is covered)."""

  def __init__(self, attr: str):
    self.attr = attr

  def __iter__(self):
    return iter(tuple(x for m in MIXERS.values() for x in getattr(m, self.attr)))

  def __len__(self):
    return len(tuple(iter(self)))

  def __contains__(self, item):
    return item in tuple(iter(self))


EVERY_NO_DECAY = _EveryMixer("no_decay")
EVERY_PARTITION_RULE = _EveryMixer("partition_rules")


# ----------------------------------------------------------------------------- options


def _parse(value, declared):
  """A "name=value" string's value as the declared (type, may be None)."""
  base, optional = declared
  if optional and value.strip().lower() in ("none", "null"):
    return None
  if base is bool:
    if value.strip().lower() not in ("true", "false", "1", "0"):
      raise ValueError(f"{value!r} is not a bool")
    return value.strip().lower() in ("true", "1")
  return base(value) if base in (int, float) else value


def _pairs(given) -> dict:
  """{option: value} of mixer_options: (name, value) pairs or "name=value" strings."""
  out = {}
  for item in given:
    if isinstance(item, str) and "=" in item:
      out[item.split("=", 1)[0].strip()] = item.split("=", 1)[1]
    elif isinstance(item, (tuple, list)) and len(item) == 2 and isinstance(item[0], str):
      out[item[0]] = item[1]
    else:
      invalid("recurrence.mixer_options", given, "a tuple of (name, value) pairs or "
              "'name=value' strings")
  return out


def _options(mixer: str, given: tuple):
  return _checked_options(MIXERS.get(mixer), given)


@functools.lru_cache(maxsize=None)
def _checked_options(entry: Mixer, given: tuple):
  """The options of `entry` (keyed by the entry: a name registered again is read anew)."""
  mixer = entry.name
  values = _pairs(given)
  if entry.options is None:
    if values:
      invalid(f"recurrence.mixer_options.{next(iter(values))}", next(iter(values.values())),
              f"nothing: mixer {mixer!r} has no options")
    return None
  declared = field_types(entry.options)
  unknown = [k for k in values if k not in declared]
  if unknown:
    invalid(f"recurrence.mixer_options.{unknown[0]}", values[unknown[0]],
            f"an option of mixer {mixer!r}: {', '.join(declared)}")
  typed = {}
  for k, v in values.items():
    try:
      typed[k] = _parse(v, declared[k]) if isinstance(v, str) and declared[k][0] is not str else v
    except ValueError:
      invalid(f"recurrence.mixer_options.{k}", v, f"a {declared[k][0].__name__}")
  try:
    return entry.options(**typed)
  except ValueError as e:
    raise ValueError(f"recurrence.mixer_options.{e}") from None


def options_of(rcfg):
  """The checked options of rcfg.mixer (None for a mixer without options)."""
  return _options(rcfg.mixer, tuple(tuple(p) if isinstance(p, list) else p
                                    for p in rcfg.mixer_options))


def canonical_options(mixer: str, given: tuple) -> tuple:
  """mixer_options as sorted (name, value) pairs of the values away from their defaults
  (configs that mean the same compare equal); checks them."""
  opts = _options(mixer, tuple(tuple(p) if isinstance(p, list) else p for p in given))
  if opts is None:
    return ()
  default = MIXERS.get(mixer).options()
  return tuple(sorted((f.name, getattr(opts, f.name)) for f in dataclasses.fields(opts)
                      if getattr(opts, f.name) != getattr(default, f.name)))


def check_identity_at_init(rcfg) -> None:
  """Raise (`invalid`) unless rcfg's mixer computes out = h at init (a retrofit's need)."""
  entry = MIXERS.get(rcfg.mixer)
  if entry.identity_at_init is None or not entry.identity_at_init(options_of(rcfg)):
    invalid("recurrence.mixer", rcfg.mixer,
            "a mixer whose fresh init computes h (e.g. gated, alpha_coupled or "
            "var_norm_gated with the ReZero γ at 0, concat, none) to add it to a pretrained "
            f"model; mixer_options={rcfg.mixer_options!r}")


def check_fixed_weight(rcfg) -> None:
  """The recurrent_weight curriculum needs a mixer whose options leave a fixed recurrent
  weight (`Mixer.fixed_weight`): otherwise it would move nothing."""
  entry = MIXERS.get(rcfg.mixer, "recurrence.mixer")
  if entry.fixed_weight is None or not entry.fixed_weight(options_of(rcfg)):
    with_one = [m.name for m in MIXERS.values() if m.fixed_weight is not None]
    raise ValueError(
        f"recurrence.use_recurrent_weight_curriculum=True moves the mixer's fixed "
        f"recurrent_weight, and mixer {rcfg.mixer!r} with options {dict(rcfg.mixer_options)} "
        f"has none (a learned gate, or no such option): allowed a mixer of {with_one} with "
        "its recurrent gate fixed (gated: use_learnable_recurrent_gate=False; alpha_coupled "
        "and var_norm_gated: use_learnable_gate=False)")


def fixed_recurrent_weight(module: "MixerModule", value: float):
  """A mixer's fixed recurrent weight: its option's `value`; under the recurrent_weight
  curriculum the scalar leaf FIXED_WEIGHT_LEAF instead (created at the curriculum's start),
  which the trainer sets before every step and nothing learns (read under
  stop_gradient; the optimizer leaves it alone)."""
  rcfg = module.rcfg
  if not getattr(rcfg, "use_recurrent_weight_curriculum", False):
    return jnp.float32(value)
  w = module.param(FIXED_WEIGHT_LEAF, nn.initializers.constant(
      rcfg.recurrent_weight_curriculum_start), (), jnp.float32)
  return jax.lax.stop_gradient(w)


def module_of(rcfg, d_model: int) -> nn.Module:
  """The Linen module of rcfg's mixer."""
  return MIXERS.get(rcfg.mixer).module(options_of(rcfg), rcfg, d_model)


def param_shapes(rcfg, d_model: int) -> dict:
  """The mixer's parameter tree as ShapeDtypeStructs ({} without parameters)."""
  return _param_shapes(MIXERS.get(rcfg.mixer), rcfg, d_model)


@functools.lru_cache(maxsize=None)
def _param_shapes(entry: Mixer, rcfg, d_model: int) -> dict:
  dummy = jax.ShapeDtypeStruct((1, 1, d_model), jnp.float32)
  tree = jax.eval_shape(lambda: module_of(rcfg, d_model).init(
      jax.random.PRNGKey(0), jnp.zeros(dummy.shape), jnp.zeros(dummy.shape)))
  return dict(tree.get("params", {}))


def num_params(rcfg, d_model: int) -> int:
  return sum(math.prod(x.shape) for x in jax.tree_util.tree_leaves(param_shapes(rcfg, d_model)))


def flops_per_token(rcfg, d_model: int) -> float:
  """FLOPs of one application at one position (the mixer's `flops`)."""
  entry = MIXERS.get(rcfg.mixer)
  fn = entry.flops or kernel_flops
  return float(fn(options_of(rcfg), d_model, param_shapes(rcfg, d_model)))


def kernel_flops(options, d_model: int, shapes: dict) -> float:
  """2 × the entries of every `kernel` (each matmul runs once per position)."""
  flat = jax.tree_util.tree_flatten_with_path(shapes)[0]
  return float(sum(2 * math.prod(x.shape) for path, x in flat
                   if getattr(path[-1], "key", None) == "kernel"))


def _check_choice(name, value, allowed):
  if value not in allowed:
    invalid(name, value, f"one of {allowed}")


def _check_positive(name, value, optional=True):
  if (value is not None or not optional) and not (isinstance(value, int) and value > 0):
    invalid(name, value, "a positive int" + (" or None" if optional else ""))


def _check_prob(name, value, optional=False):
  if value is None and optional:
    return
  if not (isinstance(value, (int, float)) and 0.0 < value < 1.0):
    invalid(name, value, "a float in (0, 1)" + (" or None" if optional else ""))


@dataclasses.dataclass(frozen=True)
class StreamNormOptions:
  """The release's keys every mixer but `none` takes: norms of the two streams before
  mixing (learned RMSNorm or LayerNorm, `norm_x`, `norm_r`) and a clipped, detached RMS
  scale of the mixed term after it (not in `constant_weight` and `concat`)."""
  pre_norm_streams: bool = False
  pre_norm_type: str = "rmsnorm"
  post_norm: bool = False
  post_norm_eps: float = 1e-6
  post_norm_clamp: float = 5.0

  def __post_init__(self):
    _check_choice("pre_norm_type", self.pre_norm_type, NORM_TYPES)
    if not (isinstance(self.post_norm_eps, (int, float)) and self.post_norm_eps > 0):
      invalid("post_norm_eps", self.post_norm_eps, "> 0")
    if not isinstance(self.post_norm_clamp, (int, float)):
      invalid("post_norm_clamp", self.post_norm_clamp, "a float (used as max(clamp, 1))")


@dataclasses.dataclass(frozen=True)
class ProjectionOptions:
  """The state's projection before mixing (the release's recurrent_* keys)."""
  use_recurrent_projection: bool = False
  recurrent_state_proj_type: str = "auto"      # auto: linear when the dim is D, else mlp
  recurrent_projection_dim: Optional[int] = None   # the MLP's bottleneck (None: D)
  recurrent_state_mlp_hidden_dim: Optional[int] = None   # overrides the bottleneck
  recurrent_state_mlp_num_layers: int = 2
  recurrent_state_mlp_activation: str = "gelu"

  def __post_init__(self):
    _check_choice("recurrent_state_proj_type", self.recurrent_state_proj_type, PROJ_TYPES)
    _check_positive("recurrent_projection_dim", self.recurrent_projection_dim)
    _check_positive("recurrent_state_mlp_hidden_dim", self.recurrent_state_mlp_hidden_dim)
    if not (isinstance(self.recurrent_state_mlp_num_layers, int)
            and self.recurrent_state_mlp_num_layers >= 2):
      invalid("recurrent_state_mlp_num_layers", self.recurrent_state_mlp_num_layers, ">= 2")
    _check_choice("recurrent_state_mlp_activation", self.recurrent_state_mlp_activation,
                  tuple(ACTIVATIONS))


@dataclasses.dataclass(frozen=True)
class GateProjOptions:
  """The gates' projectors (the release's gate_* keys); their Xavier gain is
  T2MLRConfig.gate_gain."""
  gate_proj_type: str = "linear"
  gate_mlp_hidden_dim: Optional[int] = None   # None: D
  gate_mlp_num_layers: int = 2
  gate_mlp_activation: str = "gelu"

  def __post_init__(self):
    _check_choice("gate_proj_type", self.gate_proj_type, GATE_PROJ_TYPES)
    _check_positive("gate_mlp_hidden_dim", self.gate_mlp_hidden_dim)
    if not (isinstance(self.gate_mlp_num_layers, int) and self.gate_mlp_num_layers >= 1):
      invalid("gate_mlp_num_layers", self.gate_mlp_num_layers, ">= 1")
    _check_choice("gate_mlp_activation", self.gate_mlp_activation, tuple(ACTIVATIONS))


# ----------------------------------------------------------------------- building blocks


def torch_linear_uniform(key, shape, dtype=jnp.float32):
  """PyTorch's default nn.Linear init: U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
  bound = 1.0 / jnp.sqrt(shape[0])
  return jax.random.uniform(key, shape, dtype, -bound, bound)


def _torch_bias_uniform(fan_in: int):
  bound = 1.0 / math.sqrt(fan_in)
  return lambda key, shape, dtype=jnp.float32: jax.random.uniform(key, shape, dtype, -bound,
                                                                  bound)


def _logit(p: float) -> float:
  p = min(max(float(p), 1e-4), 1 - 1e-4)
  return math.log(p / (1.0 - p))


class LinearParams(nn.Module):
  """The kernel [in, out] (and bias) of a Linear, declared exactly as nn.Dense declares
  them (same names, order and RNG stream) but returned instead of applied."""
  features: int
  kernel_init: Callable
  bias_init: Optional[Callable] = None

  @nn.compact
  def __call__(self, in_features: int):
    kernel = self.param("kernel", self.kernel_init, (in_features, self.features), jnp.float32)
    if self.bias_init is None:
      return kernel, None
    return kernel, self.param("bias", self.bias_init, (self.features,), jnp.float32)


class _GateMLP(nn.Module):
  """A gate's MLP: (Linear → act) × (layers − 1) → Linear (`layer_i`), Xavier-normal kernels,
  PyTorch's uniform biases but the last one's."""
  opts: Any
  features: int
  gain: float
  last_bias: Callable

  @nn.compact
  def __call__(self, g_BTI, scope: str):
    o = self.opts
    kernel_init = nn.initializers.variance_scaling(self.gain ** 2, "fan_avg", "normal")
    act = ACTIVATIONS[o.gate_mlp_activation]
    x = g_BTI
    for i in range(o.gate_mlp_num_layers):
      last = i == o.gate_mlp_num_layers - 1
      width = self.features if last else (o.gate_mlp_hidden_dim or self.features)
      bias_init = self.last_bias if last else _torch_bias_uniform(x.shape[-1])
      k, b = LinearParams(width, kernel_init, bias_init, name=f"layer_{i}")(x.shape[-1])
      x = matmul_fp32(x, k, scope) + b
      x = x if last else act(x)
    return x


def gate_logits(opts, name: str, features: int, gain: float, bias_prob: Optional[float],
                g_BTI, scope: str):
  """A gate's logits from its features g: Linear, or an MLP (gate_proj_type); Xavier-normal
  kernels (gain), the last bias at logit(bias_prob) (None: PyTorch's uniform). Called in
  a compact module's scope: the parameters are its child `name`."""
  n_in = g_BTI.shape[-1]
  last_bias = (_torch_bias_uniform(n_in) if bias_prob is None
               else nn.initializers.constant(_logit(bias_prob)))
  if opts.gate_proj_type == "linear" or opts.gate_mlp_num_layers <= 1:
    kernel_init = nn.initializers.variance_scaling(gain ** 2, "fan_avg", "normal")
    k, b = LinearParams(features, kernel_init, last_bias, name=name)(n_in)
    return matmul_fp32(g_BTI, k, scope) + b
  return _GateMLP(opts, features, gain, last_bias, name=name)(g_BTI, scope)


def project_state(opts, d_model: int, prev_BTD):
  """prev projected as the options say: W_rec (Linear D → D, no bias: `w_rec/kernel`), the
  residual bottleneck MLP x + scaling · net(x) (`w_rec/layer_i/kernel`, orthogonal, and
  `w_rec/scaling` at 1e-4) or nothing; its parameters declared in the calling module's scope."""
  if not opts.use_recurrent_projection:
    return prev_BTD
  dim = opts.recurrent_projection_dim or d_model
  proj = opts.recurrent_state_proj_type
  proj = ("linear" if dim == d_model else "mlp") if proj == "auto" else proj
  if proj == "linear":
    w_rec, _ = LinearParams(d_model, torch_linear_uniform, name="w_rec")(d_model)
    return matmul_fp32(prev_BTD, w_rec, "t2mlr_w_rec")
  return _StateMLP(opts, d_model, name="w_rec")(prev_BTD)


class _StateMLP(nn.Module):
  opts: Any
  d_model: int

  @nn.compact
  def __call__(self, x_BTD):
    o, D = self.opts, self.d_model
    width = o.recurrent_state_mlp_hidden_dim or o.recurrent_projection_dim or D
    act = ACTIVATIONS[o.recurrent_state_mlp_activation]
    y = x_BTD
    n = o.recurrent_state_mlp_num_layers
    for i in range(n):
      out = D if i == n - 1 else width
      k, _ = LinearParams(out, nn.initializers.orthogonal(), name=f"layer_{i}")(y.shape[-1])
      y = matmul_fp32(y, k, "t2mlr_w_rec")
      y = y if i == n - 1 else act(y)
    scaling = self.param("scaling", nn.initializers.constant(1e-4), (), jnp.float32)
    return x_BTD + scaling * y


class _StreamNorm(nn.Module):
  """torch's RMSNorm (eps: fp32's) or LayerNorm (eps 1e-5, with a bias) over the last axis."""
  norm_type: str

  @nn.compact
  def __call__(self, x_BTD):
    D = x_BTD.shape[-1]
    scale = self.param("scale", nn.initializers.ones, (D,), jnp.float32)
    if self.norm_type == "rmsnorm":
      return x_BTD * jax.lax.rsqrt(jnp.mean(x_BTD * x_BTD, -1, keepdims=True) + RMS_EPS) * scale
    bias = self.param("bias", nn.initializers.zeros, (D,), jnp.float32)
    centred = x_BTD - jnp.mean(x_BTD, -1, keepdims=True)
    var = jnp.mean(centred * centred, -1, keepdims=True)
    return centred * jax.lax.rsqrt(var + LAYERNORM_EPS) * scale + bias


def pre_norm(opts, h_BTD, r_BTD):
  """(h, r) as the mixing reads them: each normed (`norm_x`, `norm_r`) with
  pre_norm_streams, else as they are."""
  if not opts.pre_norm_streams:
    return h_BTD, r_BTD
  return (_StreamNorm(opts.pre_norm_type, name="norm_x")(h_BTD),
          _StreamNorm(opts.pre_norm_type, name="norm_r")(r_BTD))


def post_norm(opts, y_BTD):
  """y · clip(1/√(mean(y²) + eps), 1/c, c), the scale from sg(y), c = max(clamp, 1)."""
  if not opts.post_norm:
    return y_BTD
  y = jax.lax.stop_gradient(y_BTD)
  clamp = max(float(opts.post_norm_clamp), 1.0)
  rms = jnp.sqrt(jnp.mean(y * y, -1, keepdims=True) + opts.post_norm_eps)
  return y_BTD * jnp.clip(1.0 / rms, 1.0 / clamp, clamp)


def _stats(h_BTD, s_rec, s_cur) -> GateStats:
  return GateStats(jnp.broadcast_to(jnp.asarray(s_rec, jnp.float32), h_BTD.shape),
                   jnp.broadcast_to(jnp.asarray(s_cur, jnp.float32), h_BTD.shape))


def _sg(x, detach: bool):
  return jax.lax.stop_gradient(x) if detach else x


def _clamp_alpha(alpha):
  """The release's alpha safety: NaN → 0.5, ±inf → 1 / 0, then clip to [1e-4, 1 − 1e-4]."""
  alpha = jnp.nan_to_num(alpha, nan=0.5, posinf=1.0, neginf=0.0)
  return jnp.clip(alpha, 1e-4, 1.0 - 1e-4)


# ----------------------------------------------------------------------------- mixers


class MixerModule(nn.Module):
  """A mixer's Linen module: its options, the recurrence config and the model width;
  called as (h_BTD, prev_BTD) -> (out_BTD, GateStats)."""
  opts: Any
  rcfg: Any
  d_model: int


class NoMixer(MixerModule):
  """`none`: out = h (the state is read but not used)."""

  def __call__(self, h_BTD, prev_BTD):
    return h_BTD, _stats(h_BTD, 0.0, 1.0)


@dataclasses.dataclass(frozen=True)
class ConstantWeightOptions(StreamNormOptions):
  recurrent_alpha: float = 0.5     # α, clipped to [0, 1] when applied
  use_learnable_gate: bool = False   # α a parameter (`alpha`) instead of a constant

  def __post_init__(self):
    StreamNormOptions.__post_init__(self)
    if not isinstance(self.recurrent_alpha, (int, float)):
      invalid("recurrent_alpha", self.recurrent_alpha, "a float")


class ConstantWeightMixer(MixerModule):
  """`constant_weight`: out = (1 − α) h + α R, α = clip(alpha, 0, 1)."""

  @nn.compact
  def __call__(self, h_BTD, prev_BTD):
    o = self.opts
    alpha = (self.param("alpha", nn.initializers.constant(o.recurrent_alpha), (), jnp.float32)
             if o.use_learnable_gate else jnp.float32(o.recurrent_alpha))
    alpha = jnp.clip(alpha, 0.0, 1.0)
    x, r = pre_norm(o, h_BTD, prev_BTD)
    out = x * (1 - alpha) + r * alpha
    return out, _stats(h_BTD, alpha, 1 - alpha)


@dataclasses.dataclass(frozen=True)
class ConcatOptions(ProjectionOptions, StreamNormOptions):

  def __post_init__(self):
    ProjectionOptions.__post_init__(self)
    StreamNormOptions.__post_init__(self)


class ConcatMixer(MixerModule):
  """`concat`: out = W_cat [h, r], r = the projected state; W_cat starts at [I | 0]."""

  @nn.compact
  def __call__(self, h_BTD, prev_BTD):
    D = self.d_model
    x, r = pre_norm(self.opts, h_BTD, project_state(self.opts, D, prev_BTD))
    eye = lambda key, shape, dtype=jnp.float32: jnp.concatenate(
        [jnp.eye(D, dtype=dtype), jnp.zeros((D, D), dtype)], axis=0)
    k, _ = LinearParams(D, eye, name="w_concat")(2 * D)
    out = matmul_fp32(jnp.concatenate([x, r], axis=-1), k, "t2mlr_concat")
    return out, _stats(h_BTD, 0.0, 1.0)


@dataclasses.dataclass(frozen=True)
class GatedOptions(GateProjOptions, ProjectionOptions, StreamNormOptions):
  """The release's `gated` keys; the defaults are the paper's Φ (W_rec on, both gates
  learned from [h, r], ReZero scalars γ at 0)."""
  use_recurrent_projection: bool = True
  use_learnable_recurrent_gate: bool = True
  use_learnable_input_gate: bool = True
  recurrent_gate_init: Optional[float] = None   # σ(bias) at init; None: T2MLRConfig.gate_init
  input_gate_init: Optional[float] = None
  recurrent_weight: float = 1.0      # the recurrent gate when not learned
  orig_weight: float = 0.0           # the input gate when not learned
  disable_x_branch: bool = False     # no h term in y
  gate_input_detach: bool = False    # both gates read stop_gradient([h, r])
  recurrent_gate_input_detach: Optional[bool] = None   # per gate (None: gate_input_detach)
  input_gate_input_detach: Optional[bool] = None
  normalize_gates: bool = False      # s_rec, s_cur divided by their (detached) sum
  use_rezero_residual: bool = True   # out = h + y (else y), γ = tanh(raw)
  rezero_gamma_scalar: bool = True   # γ scalars (else D-vectors)
  rezero_gamma_recurrent_gate_init: float = 0.0
  rezero_gamma_input_gate_init: float = 0.0

  def __post_init__(self):
    GateProjOptions.__post_init__(self)
    ProjectionOptions.__post_init__(self)
    StreamNormOptions.__post_init__(self)
    _check_prob("recurrent_gate_init", self.recurrent_gate_init, optional=True)
    _check_prob("input_gate_init", self.input_gate_init, optional=True)

  def detach(self, which: str) -> bool:
    own = getattr(self, f"{which}_gate_input_detach")
    return self.gate_input_detach if own is None else own


class GatedMixer(MixerModule):
  """`gated` (the paper's Φ with the defaults): r = W_rec R, g = [h, r],
  s_rec = σ(f_rec g), s_cur = σ(f_cur g), out = h + tanh(γ_rec) s_rec ⊙ r + tanh(γ_cur) s_cur ⊙ h.
  With both gates linear and read alike, their kernels are concatenated so one [2D, 2D]
  matmul computes both (inside scans and loops XLA hoists the concatenation)."""

  @nn.compact
  def __call__(self, h_BTD, prev_BTD):
    o, D = self.opts, self.d_model
    shape = () if o.rezero_gamma_scalar else (D,)
    gamma_rec = self.param("gamma_rec", nn.initializers.constant(
        o.rezero_gamma_recurrent_gate_init), shape, jnp.float32)
    gamma_cur = self.param("gamma_cur", nn.initializers.constant(
        o.rezero_gamma_input_gate_init), shape, jnp.float32)
    x, r = pre_norm(o, h_BTD, project_state(o, D, prev_BTD))
    s_rec, s_cur = self._gates(x, r)
    if o.normalize_gates and not o.disable_x_branch:
      denom = jax.lax.stop_gradient(jnp.maximum(s_rec + s_cur, 1e-6))
      s_rec, s_cur = s_rec / denom, s_cur / denom
    # written in the order of the paper's Φ (the order of h's uses orders its gradient's sum)
    if o.use_rezero_residual and not o.post_norm:
      out = h_BTD + jnp.tanh(gamma_rec) * s_rec * r
      if not o.disable_x_branch:
        out = out + jnp.tanh(gamma_cur) * s_cur * x
      return out, _stats(h_BTD, s_rec, s_cur)
    t_rec, t_cur = ((jnp.tanh(gamma_rec), jnp.tanh(gamma_cur)) if o.use_rezero_residual
                    else (1.0, 1.0))
    y = r * s_rec * t_rec
    y = post_norm(o, y if o.disable_x_branch else y + x * s_cur * t_cur)
    return (h_BTD + y if o.use_rezero_residual else y), _stats(h_BTD, s_rec, s_cur)

  def _gates(self, h_BTD, r_BTD):
    o, rcfg, D = self.opts, self.rcfg, self.d_model
    g = jnp.concatenate([h_BTD, r_BTD], axis=-1)
    bias_rec = rcfg.gate_bias if o.recurrent_gate_init is None else _logit(o.recurrent_gate_init)
    bias_cur = rcfg.gate_bias if o.input_gate_init is None else _logit(o.input_gate_init)
    fused = (o.use_learnable_recurrent_gate and o.use_learnable_input_gate
             and not o.disable_x_branch and o.detach("recurrent") == o.detach("input")
             and (o.gate_proj_type == "linear" or o.gate_mlp_num_layers <= 1))
    if fused:     # the paper's path: one matmul for both gates
      gate_kernel = nn.initializers.variance_scaling(rcfg.gate_gain ** 2, "fan_avg", "normal")
      k_rec, b_rec = LinearParams(D, gate_kernel, nn.initializers.constant(bias_rec),
                                  name="f_rec")(2 * D)
      k_cur, b_cur = LinearParams(D, gate_kernel, nn.initializers.constant(bias_cur),
                                  name="f_cur")(2 * D)
      s = jax.nn.sigmoid(matmul_fp32(_sg(g, o.detach("recurrent")),
                                     jnp.concatenate([k_rec, k_cur], axis=1), "t2mlr_gates")
                         + jnp.concatenate([b_rec, b_cur]))
      return s[..., :D], s[..., D:]
    s_rec = (jax.nn.sigmoid(gate_logits(o, "f_rec", D, rcfg.gate_gain, o.recurrent_gate_init
                                        or rcfg.gate_init, _sg(g, o.detach("recurrent")),
                                        "t2mlr_gates"))
             if o.use_learnable_recurrent_gate else fixed_recurrent_weight(self, o.recurrent_weight))
    if o.disable_x_branch:
      return s_rec, jnp.float32(0.0)
    s_cur = (jax.nn.sigmoid(gate_logits(o, "f_cur", D, rcfg.gate_gain, o.input_gate_init
                                        or rcfg.gate_init, _sg(g, o.detach("input")),
                                        "t2mlr_gates"))
             if o.use_learnable_input_gate else jnp.float32(o.orig_weight))
    return s_rec, s_cur


@dataclasses.dataclass(frozen=True)
class AlphaOptions(GateProjOptions, ProjectionOptions, StreamNormOptions):
  """The release's `alpha_coupled` / `var_norm_gated` keys."""
  use_learnable_gate: bool = False   # α = σ(f_alpha [h, r]); else α = recurrent_weight
  gate_input_detach: bool = False
  recurrent_gate_init: float = 0.2   # σ(bias) of f_alpha at init
  recurrent_weight: float = 0.5      # α when not learned
  use_rezero_residual: bool = True   # out = h + tanh(γ) y (else y)
  rezero_gamma_scalar: bool = True
  rezero_gamma_init: float = 0.0

  def __post_init__(self):
    GateProjOptions.__post_init__(self)
    ProjectionOptions.__post_init__(self)
    StreamNormOptions.__post_init__(self)
    _check_prob("recurrent_gate_init", self.recurrent_gate_init)


class AlphaMixer(MixerModule):
  """`alpha_coupled` (w(α) = (α, 1 − α)) and `var_norm_gated` (w(α) = (√α, √(1 − α))):
  y = w_rec r + w_cur h, out = h + tanh(γ) y; α clipped to [1e-4, 1 − 1e-4]."""
  root: bool = False

  @nn.compact
  def __call__(self, h_BTD, prev_BTD):
    o, D = self.opts, self.d_model
    gamma = (self.param("gamma", nn.initializers.constant(o.rezero_gamma_init),
                        () if o.rezero_gamma_scalar else (D,), jnp.float32)
             if o.use_rezero_residual else None)
    x, r = pre_norm(o, h_BTD, project_state(o, D, prev_BTD))
    if o.use_learnable_gate:
      g = _sg(jnp.concatenate([x, r], axis=-1), o.gate_input_detach)
      alpha = jax.nn.sigmoid(gate_logits(o, "f_alpha", D, self.rcfg.gate_gain,
                                         o.recurrent_gate_init, g, "t2mlr_gates"))
    else:
      alpha = fixed_recurrent_weight(self, o.recurrent_weight)
    alpha = _clamp_alpha(alpha)
    w_rec, w_cur = (jnp.sqrt(alpha), jnp.sqrt(1.0 - alpha)) if self.root else (alpha, 1 - alpha)
    y = post_norm(o, r * w_rec + x * w_cur)
    out = h_BTD + jnp.tanh(gamma) * y if o.use_rezero_residual else y
    return out, _stats(h_BTD, w_rec, w_cur)


class VarNormMixer(AlphaMixer):
  root: bool = True


@dataclasses.dataclass(frozen=True)
class RotationalOptions(StreamNormOptions):
  """The release's `exponential_rotational_gated` keys."""
  concat_recurrent: bool = False     # the gates read [h, R] (else h)
  exponential_rotational_gate_c_value: float = 8.0
  exponential_rotational_gate_r_min: float = 0.99    # a = exp(−c softplus(Λ)) at init
  exponential_rotational_gate_r_max: float = 0.999
  exponential_rotational_gate_sqrt_eps: float = 1e-8
  exponential_rotational_gate_input_gate_input_detach: bool = False
  exponential_rotational_gate_recurrent_gate_input_detach: bool = False

  def __post_init__(self):
    StreamNormOptions.__post_init__(self)
    if not self.exponential_rotational_gate_c_value > 0:
      invalid("exponential_rotational_gate_c_value", self.exponential_rotational_gate_c_value,
              "> 0")
    lo, hi = self.exponential_rotational_gate_r_min, self.exponential_rotational_gate_r_max
    if not 0.0 < lo <= hi < 1.0:
      invalid("exponential_rotational_gate_r_min", lo,
              f"0 < r_min <= r_max ({hi}) < 1")
    if not self.exponential_rotational_gate_sqrt_eps >= 0:
      invalid("exponential_rotational_gate_sqrt_eps", self.exponential_rotational_gate_sqrt_eps,
              ">= 0")


class RotationalMixer(MixerModule):
  """`exponential_rotational_gated`: r_t = σ(W_a u), i_t = σ(W_x u) (u = h or [h, R]),
  a = exp(−c softplus(Λ) r_t), out = a h + √(1 − a² + ε) i_t R."""

  @nn.compact
  def __call__(self, h_BTD, prev_BTD):
    o, D = self.opts, self.d_model
    c = o.exponential_rotational_gate_c_value
    x, r = pre_norm(o, h_BTD, prev_BTD)
    u = jnp.concatenate([x, r], axis=-1) if o.concat_recurrent else x
    n_in = u.shape[-1]
    k_r, b_r = LinearParams(D, torch_linear_uniform, _torch_bias_uniform(n_in), name="f_r")(n_in)
    k_i, b_i = LinearParams(D, torch_linear_uniform, _torch_bias_uniform(n_in), name="f_i")(n_in)

    def lambda_init(key, shape, dtype=jnp.float32):
      lo, hi = o.exponential_rotational_gate_r_min, o.exponential_rotational_gate_r_max
      p = jax.random.uniform(key, shape, dtype, lo, hi)
      return jnp.log(p ** (-1.0 / c) - 1.0)
    lam = self.param("lambda", lambda_init, (D,), jnp.float32)
    r_t = jax.nn.sigmoid(matmul_fp32(
        _sg(u, o.exponential_rotational_gate_recurrent_gate_input_detach), k_r, "t2mlr_gates")
        + b_r)
    i_t = jax.nn.sigmoid(matmul_fp32(
        _sg(u, o.exponential_rotational_gate_input_gate_input_detach), k_i, "t2mlr_gates") + b_i)
    rate = c * jax.nn.softplus(lam) * r_t
    a_t = jnp.exp(-rate)
    # 1 − a² as −expm1(−2·rate): a is near 1 (0.99 at init), where 1 − a² cancels in fp32
    coeff = jnp.sqrt(-jnp.expm1(-2.0 * rate) + o.exponential_rotational_gate_sqrt_eps)
    out = post_norm(o, a_t * x + coeff * (i_t * r))
    return out, _stats(h_BTD, coeff * i_t, a_t)


# the release's module attribute -> our parameter name (None: a buffer, not a parameter)
_NORM_NAMES = (("norm_x", "norm_x"), ("norm_r", "norm_r"))
_PROJECTION_NAMES = (("recurrent_projection", "w_rec"),) + _NORM_NAMES
_KERNEL_RULES = ((r"recurrence/(w_rec|w_concat|f_rec|f_cur|f_alpha|f_r|f_i)(/layer_0)?/kernel$",
                  ("embed", None)),)

def _always(opts) -> bool:
  return True


def _rezero_at_0(opts) -> bool:
  """out = h + tanh(γ) y with γ = 0 at init."""
  return opts.use_rezero_residual and opts.rezero_gamma_init == 0



for _entry in (
    Mixer("none", NoMixer, identity_at_init=_always),
    Mixer("constant_weight", ConstantWeightMixer, ConstantWeightOptions, no_decay=("alpha",),
          official_names=(("recurrent_alpha", "alpha"),) + _NORM_NAMES,
          identity_at_init=lambda opts: opts.recurrent_alpha <= 0),
    Mixer("concat", ConcatMixer, ConcatOptions, kernel_flops, no_decay=("scaling",),
          partition_rules=_KERNEL_RULES, identity_at_init=_always,
          official_names=_PROJECTION_NAMES + (("concat_projection", "w_concat"),)),
    Mixer("gated", GatedMixer, GatedOptions, kernel_flops,
          fixed_weight=lambda opts: not opts.use_learnable_recurrent_gate,
          identity_at_init=lambda opts: opts.use_rezero_residual and (
              opts.rezero_gamma_recurrent_gate_init == 0 == opts.rezero_gamma_input_gate_init),
          # γ_rec / γ_cur are the gates' scalars (biases are the backbone's rule: `bias`);
          # W_rec and the gate kernels decay as matrices
          no_decay=("gamma_rec", "gamma_cur", "scaling"), partition_rules=_KERNEL_RULES,
          official_names=_PROJECTION_NAMES + (
              ("recurrent_gate_proj", "f_rec"), ("input_gate_proj", "f_cur"),
              ("rezero_gamma_recurrent_gate", "gamma_rec"),
              ("rezero_gamma_input_gate", "gamma_cur"))),
    Mixer("var_norm_gated", VarNormMixer, AlphaOptions, kernel_flops, identity_at_init=_rezero_at_0,
          fixed_weight=lambda opts: not opts.use_learnable_gate,
          no_decay=("gamma", "scaling"), partition_rules=_KERNEL_RULES,
          official_names=_PROJECTION_NAMES + (("alpha_gate_proj", "f_alpha"),
                                              ("rezero_gamma", "gamma"))),
    Mixer("alpha_coupled", AlphaMixer, AlphaOptions, kernel_flops, identity_at_init=_rezero_at_0,
          fixed_weight=lambda opts: not opts.use_learnable_gate,
          no_decay=("gamma", "scaling"), partition_rules=_KERNEL_RULES,
          official_names=_PROJECTION_NAMES + (("alpha_gate_proj", "f_alpha"),
                                              ("rezero_gamma", "gamma"))),
    Mixer("exponential_rotational_gated", RotationalMixer, RotationalOptions, kernel_flops,
          no_decay=("lambda",), partition_rules=_KERNEL_RULES,
          official_names=(("erg_r_proj", "f_r"), ("erg_i_proj", "f_i"),
                          ("erg_lambda_param", "lambda")) + _NORM_NAMES),
):
  MIXERS.register(dataclasses.replace(_entry, source=__name__))
