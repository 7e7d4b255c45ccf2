"""The experiment config (ml_collections) and its translation to typed model configs.

An experiment config has the groups `model`, `train`, `optimizer`, `data`,
`mesh`. `base_config()` holds every field with its default; files in
`configs/` start from it and set what they need. `validate()` checks values
before anything is compiled and names the offending field: the `train`, `optimizer` and
`data` groups become frozen typed configs (`TrainConfig`, `OptimizerConfig`, the task's
dataclass in train/data_configs.py) as `model` does.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from absl import logging
from ml_collections import config_dict

from t2mlr_jax.config import (
  FIELD_TYPES,
  ModelConfig,
  field_types,
  invalid,
  migrate_experiment_config,
  recurrence_from_dict,
)
from t2mlr_jax.convert.pretrained import pretrained_config
from t2mlr_jax.flops import exact_bptt_bytes
from t2mlr_jax.model import api  # noqa: F401  (registers the model families)
from t2mlr_jax.model.modes import hidden_modes, mode_names, mode_options
from t2mlr_jax.registry import (
  FAMILIES,
  RECURRENCES,
  SCHEDULES,
  default_family,
  default_recurrence,
  family_of,
  schedule_option_defaults,
)
from t2mlr_jax.train.data_configs import DATA_CONFIGS, DataConfig
from t2mlr_jax.train.optimizer import OptimizerConfig, as_optimizer_config

# Fields a resumed run may change; any other difference is refused.
RESUME_MUTABLE = ("model.attention", "train.stop_after_steps", "train.resume_step",
                  "train.eval_every", "train.checkpoint_every", "train.log_every",
                  "train.grad_accum_steps")


def _fail(field: str, value: Any, allowed: str):
  invalid(field, value, allowed, prefix="config field ")


def _check_mode(mode) -> None:
  """`train.mode`: "auto" or a registered training schedule."""
  allowed = ("auto", *mode_names())
  if mode not in allowed:
    _fail("train.mode", mode, f"one of {allowed}")


# train.grad_accum_average: how microbatches' losses combine (train.step.make_train_step)
GRAD_ACCUM_AVERAGES = ("tokens", "microbatches")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """The `train` group, typed and checked on construction (`train_config(config)`); the
  checks that need the model (seq_len, loss_chunk against the mode) are `validate`'s."""
  num_steps: int = 1000
  stop_after_steps: Optional[int] = None  # stop early (resumable) at this step
  resume_step: Optional[int] = None  # resume from this saved step (None: latest)
  batch_size: int = 16              # global batch (all processes, all devices)
  seq_len: int = 256
  eval_every: int = 500
  checkpoint_every: int = 500
  log_every: int = 50               # steps between metric lines
  seed: int = 0
  mode: str = "auto"                # forward mode of training (auto: the type's default)
  max_to_keep: int = 3              # checkpoints kept
  async_checkpointing: bool = True
  loss_chunk: Optional[int] = None  # head + CE this many positions at a time
  grad_accum_steps: int = 1         # microbatches per optimizer step (the batch split in k)
  grad_accum_average: str = "tokens"  # "tokens" (the whole batch's token mean) or
  #                                     "microbatches" (mean of their means: the LRT release)

  def __post_init__(self):
    for name in ("num_steps", "batch_size", "seq_len", "eval_every", "checkpoint_every",
                 "log_every", "max_to_keep"):
      value = getattr(self, name)
      if not isinstance(value, int) or value < 1:
        _fail(f"train.{name}", value, "an integer >= 1")
    self._check_steps()
    _check_mode(self.mode)
    chunk = self.loss_chunk
    if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, int)
                              or chunk < 1):
      _fail("train.loss_chunk", chunk, "None or an integer >= 1 (positions per chunk)")

  def _check_steps(self):
    """grad_accum_steps (dividing the batch), resume_step and stop_after_steps."""
    if self.grad_accum_average not in GRAD_ACCUM_AVERAGES:
      _fail("train.grad_accum_average", self.grad_accum_average,
            f"one of {GRAD_ACCUM_AVERAGES}")
    k = self.grad_accum_steps
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
      _fail("train.grad_accum_steps", k, "an integer >= 1 (microbatches per optimizer step)")
    if self.batch_size % k:
      _fail("train.batch_size", self.batch_size, f"multiples of train.grad_accum_steps={k}")
    n, resume, stop = self.num_steps, self.resume_step, self.stop_after_steps
    if resume is not None and not (isinstance(resume, int) and 1 <= resume <= n):
      _fail("train.resume_step", resume, f"None or a saved step in [1, train.num_steps={n}]")
    if stop is not None and not 1 <= stop <= n:
      _fail("train.stop_after_steps", stop, f"None or an integer in [1, train.num_steps={n}]")


def _typed(cls, group):
  """A typed group config in one constructor call from the group's values (a field a
  saved config lacks gets its default; keys that are no field are ignored)."""
  return cls(**{f.name: group[f.name] for f in dataclasses.fields(cls) if f.name in group})


def train_config(config) -> TrainConfig:
  """The typed, checked `train` group."""
  return _typed(TrainConfig, config.train)


def optimizer_config(config) -> OptimizerConfig:
  """The typed, checked `optimizer` group."""
  return as_optimizer_config(config.optimizer)


def data_config(config):
  """The typed, checked `data` group of `data.task` (its DATA_CONFIGS entry) from the
  task's own fields (one a saved config lacks at its default; the others ignored)."""
  task = config.data.get("task", DataConfig.task)
  if task not in DATA_CONFIGS:
    _fail("data.task", task, f"one of {sorted(DATA_CONFIGS)}")
  return _typed(DATA_CONFIGS[task], config.data)


def base_config() -> config_dict.ConfigDict:
  """Every field of an experiment config at its default (the configs/ files start here)."""
  c = config_dict.ConfigDict()
  # the model group: the family (arch), a pretrained start, then every field of the
  # default family's config class at its default (ModelConfig: the transformer), one
  # type's recurrence group and every schedule's options among them; model_config()
  # builds the typed config from it
  c.model = config_dict.ConfigDict({
      "arch": default_family().name,
      "init_from": config_dict.placeholder(str),
      **config_fields(default_family().config, skip=("recurrence", "schedule_options"))})
  c.model.recurrence = recurrence_config(default_recurrence().name)
  c.model.schedule_options = schedule_options_config()
  c.train = config_fields(TrainConfig)
  c.optimizer = config_fields(OptimizerConfig)
  c.data = data_fields()
  c.mesh = dict(
      data=-1,                    # data-parallel axis (-1: the devices left over)
      fsdp=1,                     # parameter-sharding axis
      tensor=1)                   # tensor-parallel axis (heads, MLP, vocab)
  return c


def data_fields() -> dict:
  """The `data` group: every task's fields (DATA_CONFIGS, each declared in its task's
  dataclass; two tasks sharing one share its default) at their defaults."""
  out = {}
  for cls in DATA_CONFIGS.values():
    for name, value in config_fields(cls).items():
      out.setdefault(name, value)
  return out


def config_fields(cls, skip=(), **overrides) -> dict:
  """The fields of a frozen config dataclass as the entries of an ml_collections group
  (values, or FieldReferences to keep their types) at their defaults, each overridable on
  the command line as its type; a field that may be None is a typed placeholder
  (`--config.model.n_kv_heads=2` parses as an int). The annotations are read with
  typing.get_type_hints (`config.field_types`: with or without `from __future__ import
  annotations`); a field of a type no group can hold is a ValueError naming it. Nested
  config dataclasses (ModelConfig.rope_scaling) are left out, as are `skip`."""
  return _group_fields(cls, skip, overrides, nested=True)


def _group_fields(cls, skip, overrides: dict, nested: bool) -> dict:
  """`config_fields`; without `nested`, a nested config dataclass is refused too (a
  recurrence type's fields and a schedule's options are each one group of plain values)."""
  out, fields = {}, {f.name: f for f in dataclasses.fields(cls)}
  for name, (field_type, optional) in field_types(cls, skip, nested).items():
    if field_type not in FIELD_TYPES:       # a nested config: not a command-line field
      continue
    value = overrides.get(name, _default(cls, fields[name]))
    if field_type is float and isinstance(value, int) and not isinstance(value, bool):
      value = float(value)                  # `x: float = 1` overridable as a float
    if optional:
      out[name] = config_dict.placeholder(field_type)
      if value is not None:
        out[name].set(value)
    else:
      out[name] = value
  return out


def _default(cls, f):
  """A field's default; a field without one is a ValueError naming it."""
  if f.default is not dataclasses.MISSING:
    return f.default
  if f.default_factory is not dataclasses.MISSING:
    return f.default_factory()
  raise ValueError(f"{cls.__name__}.{f.name} has no default: allowed a field with a default "
                   "(each is the command line's starting value)")


def recurrence_config(type_name: str, **overrides) -> config_dict.ConfigDict:
  """A `model.recurrence` group holding every field of one recurrence type at its default
  (so each can be overridden on the command line), e.g. recurrence_config("lrt",
  projection="shared"). The schedules' options are not here: `schedule_options_config`."""
  entry = RECURRENCES.get(type_name, "config field model.recurrence.type")
  if entry.config is None:
    names = set()
  else:
    names = {f.name for f in dataclasses.fields(entry.config)}
  unknown = sorted(set(overrides) - names)
  moved = [k for k in unknown if k in schedule_option_defaults()]
  if moved:
    _fail(f"model.recurrence.{moved[0]}", overrides[moved[0]],
          f"a field of {type_name}: {sorted(names)} ({moved[0]} is a schedule's option: "
          f"model.schedule_options.{moved[0]}, schedule_options_config({moved[0]}=...))")
  if unknown:
    _fail(f"model.recurrence.{unknown[0]}", overrides[unknown[0]],
          f"a field of {type_name}: {sorted(names)}")
  fields = ({} if entry.config is None
            else _group_fields(entry.config, (), overrides, nested=False))
  return config_dict.ConfigDict({"type": type_name, **fields})


def schedule_options_config(**overrides) -> config_dict.ConfigDict:
  """A `model.schedule_options` group holding every registered schedule's options at their
  defaults (each overridable on the command line as its type), e.g.
  schedule_options_config(d_forward=8, d_backward=2)."""
  unknown = sorted(set(overrides) - set(schedule_option_defaults()))
  if unknown:
    _fail(f"model.schedule_options.{unknown[0]}", overrides[unknown[0]],
          f"an option of a registered schedule: {list(schedule_option_defaults())}")
  fields = {}
  for schedule in SCHEDULES.values():
    if schedule.options is not None:
      fields.update(_group_fields(schedule.options, (), overrides, nested=False))
  return config_dict.ConfigDict(fields)


def _schedule_options(config) -> dict:
  """The `model.schedule_options` group as a dict (the base config's defaults when the
  group is absent)."""
  group = config.model.get("schedule_options")
  return {} if group is None else group.to_dict()


def _recurrence(config):
  r = config.model.recurrence
  rtype = RECURRENCES.get(r.type, "config field model.recurrence.type")
  if rtype.config is None:        # the "none" entry: the plain transformer
    return None
  try:
    return recurrence_from_dict(r.to_dict())
  except ValueError as e:
    raise ValueError(f"config field model.{e} (each type has its own fields: build the group "
                     "with t2mlr_jax.train.config.recurrence_config(type))") from None


# the fields `model.init_from` takes from this config, not from the pretrained model
INIT_FROM_RUNTIME_FIELDS = ("dtype", "remat", "scan_layers", "max_seq_len", "attention")


def _init_from_config(config) -> ModelConfig:
  """A pretrained model's shape (HF config.json or export model.json) + this config's
  recurrence and runtime fields (INIT_FROM_RUNTIME_FIELDS; ModelConfig's default where the
  group lacks one)."""
  m = config.model
  runtime = {f.name: m.get(f.name, f.default) for f in dataclasses.fields(ModelConfig)
             if f.name in INIT_FROM_RUNTIME_FIELDS}
  return pretrained_config(m.init_from, recurrence=_recurrence(config),
                           schedule_options=_schedule_options(config), **runtime)


def model_config(config):
  """The typed model config of the `model` group in one constructor call: the config
  class of its family (`model.arch`, a registered `ModelFamily`) from the group's fields
  of that class, the recurrence from `model.recurrence`; with `model.init_from`, a
  pretrained model's shape and this group's recurrence and runtime fields."""
  m = config.model
  family = FAMILIES.get(m.arch, "config field model.arch")
  if m.get("init_from"):
    cfg = _init_from_config(config)
    if family_of(cfg) is not family:
      _fail("model.init_from", m.init_from, f"None for model.arch={m.arch!r} (a pretrained "
            f"model is a {family_of(cfg).name})")
    return cfg
  fields = {f.name for f in dataclasses.fields(family.config)}
  values = {k: m[k] for k in fields if k in m and k != "recurrence"}
  if "recurrence" in fields:
    values["recurrence"] = _recurrence(config)
  if "schedule_options" in fields:
    values["schedule_options"] = _schedule_options(config)
  try:
    return family.config(**values)
  except ValueError as e:
    raise ValueError(_model_field_error(str(e), m)) from None


def _model_field_error(text: str, m) -> str:
  """ModelConfig's error with the field named as the config spells it (`model.d_model`)."""
  head = text.split("=", 1)[0].split(".", 1)[0]
  if head.isidentifier() and head in m:
    return f"config field model.{text}"
  return text


def train_mode(config, cfg) -> str:
  """The forward mode of the train step; "auto": the recurrence type's default training
  schedule (T2MLR: jacobi, LRT: interleaved), parallel without a recurrence. Every
  schedule trains every recurrence type."""
  mode = config.train.mode
  _check_mode(mode)
  rec = getattr(cfg, "recurrence", None)
  if rec is None:
    return "parallel" if mode == "auto" else mode
  return rec.default_schedule if mode == "auto" else mode


def validate(config, devices=None):
  """Check every group before anything is compiled, naming the field (`train.num_steps`)
  and the allowed values; returns the typed model config, its kernels checked against
  `devices` (those the steps are compiled for; by default this host's backend)."""
  for name in ("train", "optimizer", "data", "mesh", "model"):
    if name not in config:
      _fail(name, None, "a config group (see t2mlr_jax.train.config.base_config)")
  t = train_config(config)
  optimizer_config(config)
  data_config(config)
  _check_init_required(config.model)
  cfg = model_config(config)
  mode = train_mode(config, cfg)
  _check_kernels(cfg, devices)
  _check_train_with_model(t, cfg, mode)
  return cfg


def _check_init_required(m) -> None:
  """A config that fine-tunes a pretrained model (`model.init_required`) names it."""
  if m.get("init_required", False) and not m.get("init_from"):
    _fail("model.init_from", m.init_from,
          "a Hugging Face directory or parameter export (this config fine-tunes a "
          "pretrained model: --config.model.init_from=DIR)")


def _check_kernels(cfg, devices) -> None:
  """The family's own checks, e.g. an attention kernel the devices cannot run."""
  try:
    family = family_of(cfg)
    if devices is None:
      family.check(cfg)
    else:
      family.for_devices(cfg, devices)
  except ValueError as e:
    field = str(e) if str(e).startswith("model.") else f"model.{e}"
    raise ValueError(f"config field {field}") from None


def _check_train_with_model(t: TrainConfig, cfg, mode: str) -> None:
  """The `train` fields checked against the model: seq_len, the schedule's options at it,
  a chunked loss's mode (and the memory exact BPTT would need, warned)."""
  if t.seq_len > cfg.max_seq_len:
    _fail("train.seq_len", t.seq_len, f"<= model.max_seq_len={cfg.max_seq_len}")
  rec = getattr(cfg, "recurrence", None)
  if mode == "exact" and rec is not None:
    _warn_exact_memory(cfg, t.batch_size, t.seq_len)
  if rec is not None:
    # the schedule's options at the training length (passes <= seq_len, kv_refresh only
    # for a type with the hook, ...), checked before anything is compiled
    try:
      mode_options(cfg, mode, t.seq_len)
    except ValueError as e:
      raise ValueError(f"config field model.schedule_options.{e}".replace(
          "T=", "train.seq_len=")) from None
  chunk = t.loss_chunk
  if chunk is not None and (family_of(cfg).hidden_states is None
                            or (rec is not None and mode not in hidden_modes())):
    _fail("train.loss_chunk", chunk, f"None for train.mode={mode!r} (a chunked loss "
          f"needs a transformer trained in one of {hidden_modes()})")


EXACT_BPTT_WARN_BYTES = 4 * 2**30


def _warn_exact_memory(cfg, batch_size: int, seq_len: int) -> None:
  """train.mode="exact" backpropagates through T token steps, each keeping the recurrent
  block's whole KV cache: memory quadratic in T. Warn with the estimate when it is large."""
  need = exact_bptt_bytes(cfg, batch_size, seq_len)
  if need > EXACT_BPTT_WARN_BYTES:
    logging.warning(
        "train.mode='exact' (BPTT) at train.seq_len=%d, train.batch_size=%d keeps ~%.1f GiB "
        "of per-step KV caches for the backward pass (quadratic in seq_len), split over "
        "the data-parallel devices; train.mode='jacobi' needs none of it", seq_len,
        batch_size, need / 2**30)


def flatten(d: dict, prefix: str = "") -> dict:
  """{"a.b.c": value} of a nested dict (tuples as lists, as JSON stores them)."""
  out = {}
  for k, v in d.items():
    key = f"{prefix}{k}"
    if isinstance(v, dict):
      out.update(flatten(v, key + "."))
    else:
      out[key] = list(v) if isinstance(v, tuple) else v    # as JSON stores it
  return out


def resume_conflicts(saved: dict, current: dict) -> list[str]:
  """Dotted fields that differ between a saved and the current config, except
  those a resumed run may change (RESUME_MUTABLE). A field the saved config lacks
  (written before the field existed) conflicts only if it is not at its default."""
  a, b = flatten(migrate_experiment_config(saved)), flatten(current)
  defaults = flatten(base_config().to_dict())
  for k in set(b) - set(a):
    if k in defaults and b[k] == defaults[k]:
      a[k] = b[k]
  return sorted(k for k in set(a) | set(b)
                if k not in RESUME_MUTABLE and a.get(k, "<missing>") != b.get(k, "<missing>"))
