"""The library's extension points, each a registry of objects that declare everything the
library needs of them: recurrence types (`RecurrenceType`), training schedules
(`Schedule`), model families (`ModelFamily`) and RL rewards (`Reward`). The built-in entries register themselves in
their own files (`model/recurrence/t2mlr.py`, `model/schedules/jacobi.py`, ...); a
user's file registers its own the same way and is imported first with `--user_module`
(`import_user_module`). Everything else iterates over the registries and reads the
allowed names when asked, never at import time, so an entry registered later is known.
A registry imports the package of its built-in entries on first use, so they come first
and are there whichever of the library's modules a program imported.

This module imports nothing else of the library's at import time.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
import sys
from types import ModuleType
from typing import Any, Callable, Generic, Iterator, Optional, TypeVar

T = TypeVar("T")


def _source_file(entry) -> Optional[str]:
  """The resolved path of the file whose module registered `entry` (None: not a module's)."""
  module = sys.modules.get(getattr(entry, "source", None) or "")
  path = getattr(module, "__file__", None)
  return os.path.realpath(path) if path else None


def _same_file(old, new) -> bool:
  """Both entries come from one file (imported twice, under two module names)."""
  path = _source_file(old)
  return path is not None and path == _source_file(new)


def _where(entry) -> str:
  """Who registered an entry: its module, and the module's file when there is one."""
  path = _source_file(entry)
  source = getattr(entry, "source", None) or "?"
  return f"{source}, {path}" if path else source


class Registry(Generic[T]):
  """Named entries of one extension point, in registration order."""

  def __init__(self, what: str, field: str, builtins: str,
               check: Optional[Callable] = None):
    self.what = what          # what an entry is, for messages ("recurrence type")
    self.field = field        # the config field that names one ("recurrence.type")
    self.builtins = builtins  # the module whose import registers the built-in entries
    self.check = check        # (entry, the other entries) -> None; raises on a clash
    self._entries: dict[str, T] = {}
    self._builtins_loaded = False

  def _load_builtins(self) -> None:
    """Import the built-in entries' module once (they register themselves), before any
    other entry is registered or a name is looked up."""
    if not self._builtins_loaded:
      self._builtins_loaded = True      # first: their own registering reads the registry
      importlib.import_module(self.builtins)

  def register(self, entry: T) -> T:
    """Add `entry` under `entry.name`; registering another object under a taken name is
    refused, unless it comes from the same file (that file imported again under another
    module name: the newer entry replaces the older)."""
    self._load_builtins()
    name = entry.name
    if not isinstance(name, str) or not name.isidentifier():
      raise ValueError(f"{self.what} name {name!r} is invalid: allowed a Python identifier")
    old = self._entries.get(name)
    if old is not None and old is not entry and old != entry and not _same_file(old, entry):
      raise ValueError(f"{self.what} {name!r} is already registered (by {_where(old)}); "
                       f"choose another name for the one of {_where(entry)}")
    if self.check is not None:
      self.check(entry, [e for n, e in self._entries.items() if n != name])
    self._entries[name] = entry
    return entry

  def unregister(self, name: str) -> None:
    """Remove an entry (tests that register temporary ones)."""
    self._entries.pop(name, None)

  def get(self, name: str, field: Optional[str] = None) -> T:
    """The entry called `name`; an unknown name is one error naming the field and the
    names registered now."""
    self._load_builtins()
    if name not in self._entries:
      raise ValueError(f"{field or self.field}={name!r} is invalid: allowed one of "
                       f"{self.names()}")
    return self._entries[name]

  def names(self) -> tuple[str, ...]:
    """The registered names, in registration order."""
    self._load_builtins()
    return tuple(self._entries)

  def values(self) -> tuple[T, ...]:
    """The registered entries, in registration order."""
    self._load_builtins()
    return tuple(self._entries.values())

  def __contains__(self, name) -> bool:
    return name in self.names()

  def __iter__(self) -> Iterator[str]:
    return iter(self.names())

  def __len__(self) -> int:
    return len(self.names())


# The interface functions every recurrence type answers (model/recurrence/__init__.py says
# what each does); `layer_module`, `plain_state` and `refresh_kv` may be None (declined).
RECURRENCE_FUNCTIONS = ("init_params", "zero_state", "read", "enter", "memory", "carry",
                        "stats", "layer_stats", "scalars", "value_embed_rows")
RECURRENCE_OPTIONAL = ("layer_module", "plain_state", "refresh_kv")
# hooks added later: a module without one declines it (files written before keep working)
RECURRENCE_DEFAULTED = ("span_exit", "at_step", "fixed_leaves")


@dataclasses.dataclass(frozen=True, eq=False)
class RecurrenceType:
  """One recurrence type: its config class, the interface the modes and schedules call,
  and what the optimizer and the partitioner need of its parameters.

  no_decay: leaf names of its parameters that weight decay must leave alone (its gates'
  scalars, norms); the backbone's own (norm scales, biases, α/β) are the family's.
  partition_rules: (regex on the parameter path, logical axis per dimension) rows for
  its parameters (`sharding.py`'s table); unmatched leaves are replicated.
  embedding_leaves: (parent, leaf) name pairs of token-indexed tables of its own, which
  Muon trains with the embeddings' AdamW.
  config: the frozen dataclass of its fields (None only for the "none" entry); its class
  attribute `type` is the name.
  retrofit(recurrence config) -> recurrence config: how it is added to a pretrained model
  (`model.init_from`, `python -m t2mlr_jax.convert`): the config whose fresh parameters
  (`init_params`, `layer_module`), beside the pretrained ones, compute the pretrained
  model's function at step 0; it raises (`config.invalid`) for a config whose init would
  not. None: the type cannot be added to a pretrained model.
  """
  name: str                    # what configs call it: model.recurrence.type
  config: Optional[type]       # its fields' frozen dataclass (None: "none")
  init_params: Callable        # (cfg, rng) -> params["recurrence"] or None
  zero_state: Callable         # (cfg, B) -> the state before the first token
  read: Callable               # (cfg, state, positions, slots) -> the state a position sees
  enter: Callable              # (params, cfg, h, state, cf) -> (h at the span's start, stats)
  memory: Callable             # (cfg, state, cf) -> what each layer reads, or None
  carry: Callable              # (params, cfg, o, state, cf) -> the state left for t+1
  stats: Callable              # (enter's stats, cf) -> metrics
  layer_stats: Callable        # (what layer_module sowed, cfg) -> metrics
  scalars: Callable            # (params, cfg) -> learned scalars a training log shows
  value_embed_rows: Callable   # (params, cfg, tokens) -> per-layer value-embedding rows
  layer_module: Any = None     # a Linen module adding per-layer parameters, or None
  plain_state: Optional[Callable] = None   # Jacobi's sweep-0 hook, or None
  refresh_kv: Optional[Callable] = None    # the refinement passes' K/V refresh, or None
  span_exit: Optional[Callable] = None     # (params, cfg, o, state, cf) -> the span's
                                           # output as the layers above read it, or None
  at_step: Optional[Callable] = None       # (params, cfg, step, num_steps) -> params with
                                           # the leaves the trainer sets per step, or None
  fixed_leaves: Optional[Callable] = None  # (cfg) -> names of those leaves, which the
                                           # optimizer never updates, or None
  no_decay: tuple = ()         # leaf names weight decay leaves alone
  partition_rules: tuple = ()  # (path regex, logical axes) rows of its parameters
  embedding_leaves: tuple = ()  # (parent, leaf) tables Muon trains as embeddings
  retrofit: Optional[Callable] = None   # (rcfg) -> rcfg whose fresh init keeps a base model
  default: bool = False        # what a config or an export that names no type gets
  source: str = ""             # the module that registered it

  def __post_init__(self):
    if self.config is not None and getattr(self.config, "type", None) != self.name:
      raise ValueError(f"recurrence type {self.name!r}: its config class "
                       f"{self.config.__name__} must have the class attribute "
                       f"type = {self.name!r}")

  @classmethod
  def from_module(cls, module: ModuleType, *, name: str, config: Optional[type],
                  **declarations) -> "RecurrenceType":
    """The type whose interface functions are `module`'s of the same names; a missing one
    is named (so a user's file learns what it lacks at registration, not mid-trace)."""
    missing = [f for f in RECURRENCE_FUNCTIONS + RECURRENCE_OPTIONAL
               if not hasattr(module, f)]
    if missing:
      raise ValueError(f"recurrence type {name!r} ({module.__name__}) lacks {missing}: "
                       f"define each of {RECURRENCE_FUNCTIONS} and set "
                       f"{RECURRENCE_OPTIONAL} (None declines)")
    fns = {f: getattr(module, f) for f in RECURRENCE_FUNCTIONS + RECURRENCE_OPTIONAL}
    fns.update({f: getattr(module, f, None) for f in RECURRENCE_DEFAULTED})
    return cls(name=name, config=config, source=module.__name__, **fns, **declarations)


@dataclasses.dataclass(frozen=True, eq=False)
class Schedule:
  """One training schedule: a parallel approximation of the sequential recurrence.

  run(params, cfg, tokens, inp, options, hidden) -> ModeOut (`model/sequence.py`).
  options: the frozen dataclass of its options (None: it has none): each field an
  option with its default, its __post_init__ the checks of their values. A model config
  sets them in `schedule_options` (`config.ScheduleOptions`); each is overridable per
  call. Schedules may share an option (interleaved and chunked: `passes`) when they
  declare it with the same default.
  flops(costs, options, sweeps) -> (forward FLOPs, FLOPs of the part with gradient):
  its cost from `flops.PassCosts` (the model's pass pieces); `sweeps` is the number of
  sweeps or passes a step actually ran, when the trainer logged it (else None).
  hidden: it can return hidden states instead of logits (a chunked loss).
  check_options(values, given) -> values: reconciles the options given per call with the
  config's (Jacobi: D_b clamped to a D_f given alone); None: given values win as they are.
  check_run(cfg, options, T) -> None: checks of the options against the model and the
  sequence length, before anything is traced (S <= T; a hook the type must have).
  sweeps_metric: the aux metric holding the sweeps a step ran (its FLOPs vary with it).
  pass_loss(pass_logits, labels, options, totals) -> (loss, per-pass losses): how the
  passes' losses are weighted, for a schedule whose aux returns `pass_logits`.
  token_totals(labels, options) -> [n]: the supervised-token counts each pass's mean
  divides by (gradient accumulation sums parts of a batch against them); None: [1].
  prefill(params, cfg, tokens, inp, tol, last_only) -> ModeOut: the exact prompt states
  computed in parallel, for `generate(prefill=name)`.
  loss_options: options only its `pass_loss` reads (multi_refine's refine_weights): `run`
  never sees them, so they do not key the forward's compilation.
  pass_views: each of its aux `pass_logits` predicts every position (multi_refine's full
  passes): evaluation scores each pass beside the last (bits per byte per pass).
  """
  name: str                    # what `mode=` and train.mode call it
  run: Callable                # (params, cfg, tokens, inp, options, hidden) -> ModeOut
  flops: Callable              # (costs, options, sweeps) -> (forward, with gradient)
  options: Optional[type] = None   # its options' frozen dataclass (fields = defaults)
  hidden: bool = False         # can return hidden states (a chunked loss)
  check_options: Optional[Callable] = None   # (values, given) -> values
  check_run: Optional[Callable] = None       # (cfg, options, T) -> None
  sweeps_metric: Optional[str] = None        # aux metric: sweeps a step ran
  pass_loss: Optional[Callable] = None       # weighting of its passes' losses
  token_totals: Optional[Callable] = None    # per-pass supervised-token counts
  prefill: Optional[Callable] = None         # a parallel exact prefill, generate(prefill=)
  loss_options: tuple = ()     # options only pass_loss reads (kept out of `run`)
  pass_views: bool = False     # every pass predicts every position (scored per pass)
  source: str = ""             # the module that registered it

  def __post_init__(self):
    if self.options is not None and not dataclasses.is_dataclass(self.options):
      raise ValueError(f"schedule {self.name!r}: options={self.options!r} is invalid: "
                       "allowed None or a frozen dataclass whose fields are its options")

  def option_defaults(self) -> dict:
    """{option: default} of its options dataclass ({} without one)."""
    if self.options is None:
      return {}
    return {f.name: (f.default if f.default is not dataclasses.MISSING
                     else f.default_factory()) for f in dataclasses.fields(self.options)}


def _same(cfg, devices=None):
  """The config as it is (a family without device-dependent kernels)."""
  return cfg


def _nothing(cfg) -> None:
  """No check (a family that runs on any backend)."""
  return None


@dataclasses.dataclass(frozen=True, eq=False)
class ModelFamily:
  """One model family (`model.arch`): the transformer (with any recurrence type) or the
  LSTM baseline. What the trainer, the evaluator, the compile tool and the optimizer
  need of it; none of them tells the families apart otherwise."""
  name: str                    # what configs call it: model.arch
  config: type                 # its frozen config dataclass (checkpoints record its name)
  init_params: Callable        # (cfg, rng) -> params
  apply: Callable              # (params, cfg, batch, mode, **options) -> (logits, aux)
  forward_flops: Callable      # (cfg, batch, seq_len, mode) -> FLOPs of one forward
  train_step_flops: Callable   # (cfg, batch, seq_len, mode) -> FLOPs of one train step
  modes: bool = False          # runs forward's modes and schedules (train.mode matters)
  decodes: bool = False        # has prefill + a decode step (generate, chat, lm-eval)
  hidden_states: Optional[Callable] = None   # for a chunked loss (loss_chunk), or None
  bounded_context: bool = True   # sequences longer than max_seq_len are refused
  for_devices: Callable = _same  # (cfg, devices) -> cfg with kernels those devices run
  check: Callable = _nothing     # (cfg) -> None; raises what the local backend cannot run
  no_decay: tuple = ()         # leaf names weight decay leaves alone
  partition_rules: tuple = ()  # (path regex, logical axes) rows of its parameters
  default: bool = False        # base_config()'s model.arch
  source: str = ""             # the module that registered it


@dataclasses.dataclass(frozen=True, eq=False)
class Reward:
  """A verifiable reward for RL (`rl.reward`): fn(completion, record) -> float, where
  completion is a sampled response's text (up to EOS) and record {prompt, response} the
  example's prompt and gold response as text (train/rewards.py has the built-in ones)."""
  name: str                    # what configs call it: rl.reward
  fn: Callable
  source: str = ""             # the module that registered it


def _same_option_defaults(entry: Schedule, others) -> None:
  """Two schedules may share an option only with the same default (one config field)."""
  mine = entry.option_defaults()
  for other in others:
    for name, default in other.option_defaults().items():
      if name in mine and mine[name] != default:
        raise ValueError(f"schedule {entry.name!r} declares option {name}={mine[name]!r}, "
                         f"but {other.name!r} ({other.source}) declares it with default "
                         f"{default!r}: share it with the same default or choose another name")


RECURRENCES: Registry[RecurrenceType] = Registry("recurrence type", "recurrence.type",
                                                  "t2mlr_jax.model.recurrence")
FAMILIES: Registry[ModelFamily] = Registry("model family", "model.arch", "t2mlr_jax.model.api")
SCHEDULES: Registry[Schedule] = Registry("schedule", "mode", "t2mlr_jax.model.schedules",
                                         check=_same_option_defaults)
REWARDS: Registry[Reward] = Registry("reward", "rl.reward", "t2mlr_jax.train.rewards")


def schedule_option_defaults() -> dict:
  """{option: default} of every registered schedule's options, in registration order."""
  out = {}
  for schedule in SCHEDULES.values():
    out.update(schedule.option_defaults())
  return out

# The files given with --user_module, in the order they were imported (checkpoints record
# them so a run that needs one can say so).
USER_MODULES: list[str] = []


def default_recurrence() -> RecurrenceType:
  """The type declared `default` (T2MLR): `base_config()`'s, and that of exports written
  before their recurrence carried a type tag."""
  return next(t for t in RECURRENCES.values() if t.default)


def default_family() -> ModelFamily:
  """The family declared `default` (the transformer): base_config()'s model.arch."""
  return next(f for f in FAMILIES.values() if f.default)


def recurrence_of(cfg) -> RecurrenceType:
  """The registered type of cfg.recurrence (the "no recurrence" entry for None)."""
  if cfg.recurrence is None:
    return next(t for t in RECURRENCES.values() if t.config is None)
  return RECURRENCES.get(type(cfg.recurrence).type)


def family_of(cfg) -> ModelFamily:
  """The registered family whose config class `cfg` is an instance of."""
  for family in FAMILIES.values():
    if isinstance(cfg, family.config):
      return family
  raise ValueError(f"{type(cfg).__name__} is not the config of a registered model family: "
                   f"allowed {[f.config.__name__ for f in FAMILIES.values()]}")


def recurrence_config_classes() -> dict:
  """{name: config class} of every registered type that has fields."""
  return {t.name: t.config for t in RECURRENCES.values() if t.config is not None}


def _imported_from(path: str) -> Optional[ModuleType]:
  """A module already imported from the file `path`, whatever its name (`import mytype`
  or `t2mlr_user_mytype`), or None."""
  real = os.path.realpath(path)
  for module in list(sys.modules.values()):
    file = getattr(module, "__file__", None)
    if isinstance(file, str) and os.path.realpath(file) == real:
      return module
  return None


def import_user_module(path: str) -> ModuleType:
  """Import a user's Python file (fairseq's --user-dir convention): it registers its own
  recurrence types and schedules. A file already imported, by this function or by a
  plain `import` under any name, is that module (its types are not registered twice)."""
  path = os.path.abspath(os.path.expanduser(path))
  if not os.path.isfile(path) or not path.endswith(".py"):
    raise ValueError(f"--user_module={path!r} is invalid: allowed the path of an existing "
                     ".py file")
  module = _imported_from(path)
  if module is not None:        # imported before (by --user_module or a plain import)
    if path not in USER_MODULES:
      USER_MODULES.append(path)
    return module
  stem = name = "t2mlr_user_" + os.path.splitext(os.path.basename(path))[0]
  n = 1
  while name in sys.modules:    # another file of the same name: a module of its own
    n += 1
    name = f"{stem}_{n}"
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module
  try:
    spec.loader.exec_module(module)
  except BaseException:
    del sys.modules[name]
    raise
  if path not in USER_MODULES:
    USER_MODULES.append(path)
  return module


def user_modules_in(argv) -> list[str]:
  """The --user_module values of a command line (`--user_module=P` or `--user_module P`,
  several allowed, comma-separated too), read before flags are parsed: a config file may
  name a type the module registers."""
  found, args = [], list(argv)
  for i, a in enumerate(args):
    if a.startswith("--user_module="):
      found.append(a.split("=", 1)[1])
    elif a == "--user_module" and i + 1 < len(args):
      found.append(args[i + 1])
  return [p for v in found for p in v.split(",") if p]
