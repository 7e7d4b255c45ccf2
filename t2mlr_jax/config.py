"""Model configuration: frozen, hashable dataclasses validated on construction.

`ModelConfig` describes the backbone (Llama family, with nanochat's options); its
`recurrence` is the config of one registered recurrence type (docs/models.md;
`registry.py`), a `RecurrenceConfig` kept in the type's own module (`T2MLRConfig` in
`model/recurrence/t2mlr.py`, `LRTConfig` in `lrt.py`, a user's); its `schedule_options`
the training schedules' options, each declared by its schedule (`ScheduleOptions`). All
are hashable so they can be static arguments of `jax.jit`. `invalid` is the one helper
every config in the library raises its errors through. Of ours it imports only the
registry (a leaf), where the types and the schedules' options are looked up.
"""

from __future__ import annotations

import ast
import dataclasses
import types
import typing
from typing import Any, ClassVar, Mapping, Optional

from t2mlr_jax.registry import (
  SCHEDULES,
  default_recurrence,
  recurrence_config_classes,
  schedule_option_defaults,
)

ROPE_SCALING_TYPES = ("llama3",)
DTYPES = ("float32", "bfloat16")
REMAT_POLICIES = ("none", "full", "dots")
MLP_TYPES = ("swiglu", "relu2")
ATTENTION_IMPLS = ("xla", "cudnn", "splash", "auto")     # see model/kernels.py
VALUE_EMBEDS = ("alternating", "every")
FLOAT32_EPS = 1.1920929e-07     # nanochat's RMSNorm epsilon (F.rms_norm with eps=None)


def invalid(field: str, value: Any, allowed: str, prefix: str = "") -> None:
  """Raise the library's one kind of configuration error: the field, its value, what is
  allowed. `prefix` names where the field lives (e.g. "config field ")."""
  raise ValueError(f"{prefix}{field}={value!r} is invalid: allowed {allowed}")


# what a field of a config dataclass may hold (each also `| None` / Optional): the
# experiment config's groups hold these, each overridable on the command line as its type
FIELD_TYPES = (bool, int, float, str, tuple)
FIELD_TYPES_TEXT = ("bool, int, float, str or tuple (tuple[int, ...] too), each optionally "
                    "| None (Optional[...])")


def field_types(cls, skip=(), nested: bool = True) -> dict:
  """{field: (type, may be None)} of a config dataclass, the annotations read with
  typing.get_type_hints (strings, as `from __future__ import annotations` leaves them, or
  real ones): one of FIELD_TYPES, or (`nested`) a nested config dataclass, its class
  (ModelConfig.rope_scaling). Any other type is a ValueError naming the class, the field
  and the types allowed. `skip`: fields not read."""
  try:
    hints = typing.get_type_hints(cls)
  except Exception as e:   # a string annotation naming what the class's module lacks
    raise ValueError(f"{cls.__name__}: its field annotations cannot be resolved ({e}): "
                     f"allowed {FIELD_TYPES_TEXT}") from None
  return {f.name: _field_type(cls, f.name, hints[f.name], nested)
          for f in dataclasses.fields(cls) if f.name not in skip}


def _field_type(cls, name: str, hint, nested: bool) -> tuple:
  """(type, may be None) of one annotation; see `field_types`."""
  optional, inner = False, hint
  if typing.get_origin(hint) in (typing.Union, types.UnionType):
    args = typing.get_args(hint)
    rest = [a for a in args if a is not type(None)]
    optional = len(rest) < len(args)
    inner = rest[0] if len(rest) == 1 else hint
  base = typing.get_origin(inner) or inner
  if base in FIELD_TYPES or (nested and isinstance(base, type)
                             and dataclasses.is_dataclass(base)):
    return base, optional
  shown = getattr(hint, "__name__", None) if isinstance(hint, type) else None
  raise ValueError(f"{cls.__name__}.{name}: {shown or hint} is a type a config field cannot "
                   f"hold: allowed {FIELD_TYPES_TEXT}")


def moved_option(owner: str, name: str, value: Any = ...) -> Optional[str]:
  """The error of a training schedule's option given as a field of `owner` (code written
  before the options moved to `ModelConfig.schedule_options`); None for any other name."""
  if name not in schedule_option_defaults():
    return None
  shown = "..." if value is ... else repr(value)
  return (f"{owner} has no field {name}: schedule options moved to "
          f"ModelConfig(schedule_options={{{name!r}: {shown}}}) "
          f"(or --config.model.schedule_options.{name})")


def unknown_field(path: str, value: str = "...") -> str:
  """The one-line error of a command-line override of a field the experiment config lacks
  (`--config.model.recurrence.d_forward=8`: path "model.recurrence.d_forward", value
  "8"): a schedule's option given as a recurrence field names its place."""
  head, _, name = path.rpartition(".")
  try:
    value = ast.literal_eval(value)
  except (ValueError, SyntaxError):
    pass
  moved = moved_option(head, name, value) if head == "model.recurrence" else None
  return moved or f"unknown config field --config.{path}"


class _Replaceable:
  """Mixin giving frozen dataclasses a validated `.replace(**kw)`."""

  def replace(self, **kw):
    """A copy with the given fields changed, validated again (unknown names refused)."""
    names = {f.name for f in dataclasses.fields(self)}
    unknown = sorted(set(kw) - names)
    for name in unknown:
      moved = moved_option(type(self).__name__, name, kw[name])
      if moved:
        raise ValueError(moved)
    if unknown:
      raise ValueError(
          f"{type(self).__name__} has no field(s) {unknown}; fields are {sorted(names)}")
    return dataclasses.replace(self, **kw)

  def to_dict(self) -> dict:
    """The fields as a plain dict (JSON-ready; what checkpoints record)."""
    return dataclasses.asdict(self)


def json_ready(value):
  """`value` with its tuples as lists, at any depth: a config as JSON records it."""
  if isinstance(value, (tuple, list)):
    return [json_ready(v) for v in value]
  if isinstance(value, dict):
    return {k: json_ready(v) for k, v in value.items()}
  return value


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
class RecurrenceConfig(_Replaceable):
  """The base of every recurrence type's config: a frozen dataclass of the type's fields,
  kept in its own module (`model/recurrence/t2mlr.py`'s `T2MLRConfig`, `lrt.py`'s
  `LRTConfig`, a user's file). Class attributes: `type` (the registered name),
  `default_schedule` (train.mode "auto"), `parallel_runs_mixer` (parallel mode runs the
  type's pathway with zero state), `replaces_value_embeds` (presets drop nanochat's
  tables). Methods: `span(model)` (its layers), `num_params(model)`, `mixer_flops(model,
  tokens, layers)`."""
  type: ClassVar[str] = ""
  default_schedule: ClassVar[str] = ""
  parallel_runs_mixer: ClassVar[bool] = False
  replaces_value_embeds: ClassVar[bool] = False

  def __new__(cls, *args, **kw):
    """A schedule's option given as a field (`T2MLRConfig(d_forward=8)`) is one ValueError
    naming its place, `ModelConfig.schedule_options`."""
    names = {f.name for f in dataclasses.fields(cls)}
    for name in kw:
      moved = None if name in names else moved_option(cls.__name__, name, kw[name])
      if moved:
        raise ValueError(moved)
    return super().__new__(cls)

  def to_dict(self) -> dict:
    """The fields and the type name, as `recurrence_from_dict` reads them back (tuples as
    lists: what JSON gives back)."""
    return {"type": type(self).type, **json_ready(dataclasses.asdict(self))}


class ScheduleOptions:
  """The training schedules' options a model config sets (`ModelConfig.schedule_options`):
  a hashable, immutable mapping of option → value. Each option, its default and its
  checks belong to the schedule that declares it (`registry.Schedule.options`,
  `model/schedules/`); values are checked by every schedule declaring them. A value at
  its default is not stored: configs that mean the same compare equal, and an option of
  a schedule registered later reads its default. `cfg.schedule_options.d_forward`."""

  __slots__ = ("_items",)

  def __init__(self, values: Optional[Mapping] = None, **kw):
    given = {**dict(values or {}), **kw}
    if not given:          # all defaults: nothing to check (ModelConfig's default, at import)
      object.__setattr__(self, "_items", ())
      return
    defaults = schedule_option_defaults()
    unknown = [k for k in given if k not in defaults]
    if unknown:
      invalid(f"schedule_options.{unknown[0]}", given[unknown[0]],
              f"an option of a registered schedule: {', '.join(defaults) or '(none)'}")
    resolved = {**defaults, **given}
    checked = {}
    for schedule in SCHEDULES.values():      # each declaring schedule checks its values
      names = schedule.option_defaults()
      if names and set(names) & set(given):
        declared = field_types(schedule.options)     # a tuple read back from JSON: a list
        try:
          options = schedule.options(**{k: _as_tuple(resolved[k]) if declared[k][0] is tuple
                                        else resolved[k] for k in names})
        except ValueError as e:
          raise ValueError(f"schedule_options.{e}") from None
        checked.update({k: getattr(options, k) for k in names})
    items = {k: checked.get(k, v) for k, v in given.items()}
    object.__setattr__(self, "_items",
                       tuple(sorted((k, v) for k, v in items.items() if v != defaults[k])))

  def __setattr__(self, name, value):
    raise AttributeError("ScheduleOptions is immutable: use .replace(**options)")

  def __getattr__(self, name):
    try:
      return self[name]
    except KeyError:
      raise AttributeError(f"no schedule declares an option {name!r}: allowed "
                           f"{sorted(schedule_option_defaults())}") from None

  def __getitem__(self, name):
    for k, v in self._items:
      if k == name:
        return v
    return schedule_option_defaults()[name]

  def keys(self):
    """Every declared option (those at their default included)."""
    return tuple(schedule_option_defaults())

  def __iter__(self):
    return iter(self.keys())

  def explicit(self) -> dict:
    """The options set away from their defaults."""
    return dict(self._items)

  def replace(self, **options) -> "ScheduleOptions":
    """A copy with the given options changed, checked again."""
    return ScheduleOptions({**self.explicit(), **options})

  def to_dict(self) -> dict:
    """Every declared option with its value (what checkpoints record)."""
    return {k: json_ready(self[k]) for k in self.keys()}

  def __eq__(self, other):
    return isinstance(other, ScheduleOptions) and self._items == other._items

  def __hash__(self):
    return hash(self._items)

  def __repr__(self):
    return "ScheduleOptions(" + ", ".join(f"{k}={v!r}" for k, v in self._items) + ")"

  def __reduce__(self):
    return (ScheduleOptions, (self.explicit(),))

  def __deepcopy__(self, memo):
    return self




def recurrence_from_dict(d: dict) -> RecurrenceConfig:
  """A recurrence config from its dict; `type` defaults to "t2mlr" (exports written
  before LRT existed carry no tag). An option of another type is named as such, a
  schedule's option as moved to `schedule_options`; a tuple field read back from JSON
  (a list) is a tuple again."""
  d = dict(d)
  type_name = d.pop("type", None) or default_recurrence().name
  classes = recurrence_config_classes()
  if type_name not in classes:
    invalid("recurrence.type", type_name, f"one of {sorted(classes)}")
  cls = classes[type_name]
  names = {f.name for f in dataclasses.fields(cls)}
  for key in d:
    if key not in names and key in schedule_option_defaults():
      raise ValueError(f"recurrence.{key} is a training schedule's option, not a field of "
                       f"{cls.__name__}: set schedule_options.{key} (in an experiment "
                       f"config, model.schedule_options.{key})")
    if key not in names:
      owner = [t for t, c in classes.items()
               if t != type_name and key in {f.name for f in dataclasses.fields(c)}]
      what = f"a {owner[0]} option" if owner else "not an option of any recurrence type"
      raise ValueError(f"recurrence.{key} is {what}, not one of {type_name}'s: allowed fields of "
                       f"{cls.__name__} are {sorted(names)}")
  declared = field_types(cls)
  return cls(**{k: _as_tuple(v) if declared[k][0] is tuple else v for k, v in d.items()})


def _as_tuple(value):
  """A list (JSON's tuple) as a tuple, nested lists too; anything else as it is."""
  return tuple(_as_tuple(v) for v in value) if isinstance(value, (list, tuple)) else value


def split_schedule_options(recurrence: dict) -> tuple[dict, dict]:
  """(the recurrence's own fields, the schedule options) of a recurrence dict stored before
  the options moved to their schedules (checkpoint metadata, exports): keys that are not
  fields of the type but options of a registered schedule are the latter."""
  classes = recurrence_config_classes()
  cls = classes.get(recurrence.get("type") or default_recurrence().name)
  fields = {f.name for f in dataclasses.fields(cls)} if cls is not None else set()
  declared = schedule_option_defaults()
  moved = {k: v for k, v in recurrence.items() if k not in fields and k in declared}
  return {k: v for k, v in recurrence.items() if k not in moved}, moved


def migrate_experiment_config(saved: dict) -> dict:
  """An experiment config as saved before the schedules' options moved out of
  `model.recurrence` (checkpoints' `config` item), with them under
  `model.schedule_options`; a config saved since is returned as it is."""
  model = saved.get("model")
  if not isinstance(model, dict) or not isinstance(model.get("recurrence"), dict):
    return saved
  fields, moved = split_schedule_options(model["recurrence"])
  if not moved:
    return saved
  options = {**moved, **(model.get("schedule_options") or {})}
  return {**saved, "model": {**model, "recurrence": fields, "schedule_options": options}}


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
    "qwen2.5-0.5b": dict(n_layers=24, d_model=896, n_heads=14, n_kv_heads=2, d_ff=4864,
                         vocab_size=151936, tie_embeddings=True, rope_theta=1000000.0,
                         max_seq_len=32768, rms_norm_eps=1e-6, qkv_bias=True),
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
  schedule_options: ScheduleOptions = ScheduleOptions()   # the training schedules' options

  def __post_init__(self):
    self._check_shape()
    self._check_options()
    self._check_windows()
    self._check_value_embeds()
    self._resolve_schedule_options()
    self._check_recurrence()

  def _check_shape(self):
    """Sizes, heads, head_dim and RoPE; fills n_kv_heads and head_dim when None."""
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

  def _check_options(self):
    """The named choices (dtypes, remat, attention, MLP), the softcap and the vocab padding."""
    for name, allowed in (("dtype", DTYPES), ("remat", REMAT_POLICIES),
                          ("rope_table_dtype", DTYPES), ("attention", ATTENTION_IMPLS),
                          ("mlp_type", MLP_TYPES)):
      if getattr(self, name) not in allowed:
        invalid(name, getattr(self, name), f"one of {allowed}")
    if self.logit_softcap is not None and not self.logit_softcap > 0:
      invalid("logit_softcap", self.logit_softcap, "None or a float > 0")
    if not isinstance(self.pad_vocab_to, int) or self.pad_vocab_to < 1:
      invalid("pad_vocab_to", self.pad_vocab_to, "an integer >= 1")

  def _check_value_embeds(self):
    if self.value_embeds not in (None,) + VALUE_EMBEDS:
      invalid("value_embeds", self.value_embeds, f"None or one of {VALUE_EMBEDS}")
    if self.value_embeds is not None and (not isinstance(self.ve_gate_channels, int)
                                          or not 0 <= self.ve_gate_channels <= self.d_model):
      invalid("ve_gate_channels", self.ve_gate_channels, f"an integer in [0, d_model={self.d_model}]")

  def _resolve_schedule_options(self):
    """A recurrence dict (stored metadata) to its config, the options that sat in it and
    a dict of options to a ScheduleOptions."""
    options = self.schedule_options
    if isinstance(self.recurrence, dict):       # stored metadata: options may sit in it
      fields, moved = split_schedule_options(self.recurrence)
      object.__setattr__(self, "recurrence", recurrence_from_dict(fields))
      if moved:
        given = options.explicit() if isinstance(options, ScheduleOptions) else dict(options)
        options = {**moved, **given}
    if not isinstance(options, ScheduleOptions):
      if not isinstance(options, Mapping):
        invalid("schedule_options", options, "a ScheduleOptions or a dict of options")
      options = ScheduleOptions(options)
    object.__setattr__(self, "schedule_options", options)

  def _check_recurrence(self):
    if self.recurrence is not None:
      classes = recurrence_config_classes()
      if not isinstance(self.recurrence, tuple(classes.values())):
        invalid("recurrence", self.recurrence, "None or the config of a registered "
                f"recurrence type: {', '.join(c.__name__ for c in classes.values())}")
      _ = self.span  # validates the type's layers against the model

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
    """The fields as a plain dict, the recurrence with its type, every schedule option
  (JSON-ready)."""
    d = dataclasses.asdict(self)
    if self.recurrence is not None:
      d["recurrence"] = self.recurrence.to_dict()
    d["schedule_options"] = self.schedule_options.to_dict()
    return d

  @property
  def span(self) -> tuple[int, int]:
    """(first, last) layer of the recurrent span, resolved to non-negative indices, both
    inclusive: the layers that exact mode runs token by token (the type's `span`: T2MLR
    l_start..l_end, LRT 0..source layer)."""
    if self.recurrence is None:
      raise ValueError("recurrence is None: this model has no recurrent span")
    return self.recurrence.span(self)

  @property
  def recurrent_block(self) -> tuple[int, int]:
    """Deprecated: `span` (the name before the glossary, docs/design.md#glossary)."""
    return self.span

  @property
  def segments(self) -> tuple[tuple[str, int, int], ...]:
    """The layer stack as (name, lo, hi) half-open ranges: below / inside / above."""
    if self.recurrence is None:
      return (("all", 0, self.n_layers),)
    start, end = self.span
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
    rec_class = (recurrence_config_classes().get(rec.get("type") or default_recurrence().name)
                 if isinstance(rec, dict) else type(rec))
    if getattr(rec_class, "replaces_value_embeds", False) and "value_embeds" not in overrides:
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
