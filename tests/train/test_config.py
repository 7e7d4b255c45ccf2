"""The typed `data` group: each task's frozen dataclass (train/data_configs.py) declares its
fields and checks them; saved configs with the flat data group of earlier runs still build."""

import dataclasses
import json
import os
import sys
from typing import ClassVar, Optional

import pytest
from absl import flags
from ml_collections import config_dict, config_flags

from t2mlr_jax import checkpoint, registry
from t2mlr_jax.config import RecurrenceConfig, migrate_experiment_config
from t2mlr_jax.data import lm, sft
from t2mlr_jax.model.recurrence import t2mlr as t2mlr_module
from t2mlr_jax.train import tasks
from t2mlr_jax.train.config import (
  base_config,
  config_fields,
  data_config,
  model_config,
  recurrence_config,
  resume_conflicts,
  validate,
)
from t2mlr_jax.train.data_configs import (
  DATA_CONFIGS,
  LM_DOCUMENTS,
  SFT_FORMATS,
  LMData,
  S5RetrievalData,
  S5WordProblemData,
  VariableAssignmentData,
)

from _util import REPO_ROOT

FIXTURE = os.path.join(REPO_ROOT, "tests", "fixtures", "configs_f3434b1.json")


def _config(task, **data):
  c = base_config()
  c.data.update(task=task, **data)
  return c


def test_each_task_declares_its_data_config_and_the_group_is_their_union():
  """Task.data is the task's DATA_CONFIGS entry; the base config's `data` group holds every
  task's fields at their defaults (a field two tasks share has one default)."""
  assert {name: t.data for name, t in tasks._REGISTRY.items()} == DATA_CONFIGS
  assert tasks.TASKS == tuple(DATA_CONFIGS)
  group = base_config().data
  defaults = {}
  for cls in DATA_CONFIGS.values():
    for f in dataclasses.fields(cls):
      assert f.name in group, (cls.__name__, f.name)
      if f.name != "task":
        assert defaults.setdefault(f.name, f.default) == f.default, f.name
        assert group[f.name] == f.default, f.name
  assert set(group) == set(defaults) | {"task"}
  assert group.task == "s5_retrieval" and SFT_FORMATS == sft.FORMATS
  assert LM_DOCUMENTS == lm.DOCUMENTS


@pytest.mark.parametrize("task,field,value,allowed", [
    ("s5_retrieval", "group", "S7", "one of ('S5', 'S4', 'A4', 'S3', 'Z2')"),
    ("s5_retrieval", "max_actions", 0, ">= data.min_actions=1 >= 1"),
    ("s5_retrieval", "eval_lengths", "8,x", "comma-separated integers, e.g. '8,16,32'"),
    ("s5_retrieval", "value_curriculum", "9:10", "stages 'V:STEP,...'"),
    ("s5_word_problem", "value_curriculum", "1:10",
     "'' for data.task=s5_word_problem (its examples have no values)"),
    ("s5_word_problem", "curriculum_start", 99, "1..data.max_actions=32"),
    ("s5_word_problem", "group_curriculum", "Q8:10", "stages 'GROUP:STEP,...'"),
    ("variable_assignment", "va_depth", 0, "an integer >= 1"),
    ("sft", "format", "csv", "one of ('auto', 'gsm8k_aug', 'prompt_response')"),
    ("sft", "too_long", "truncate", "one of ('error', 'drop')"),
    ("lm", "eval_blocks", 0, "None (every block) or an integer >= 1"),
    ("lm", "eval_batch_size", 0, "an integer >= 1"),
    ("lm", "documents", "joined", "one of ('separate', 'stream')"),
    ("lm", "documents", "stream", "'separate' with data.mask_documents=True"),
    ("imagenet", "task", "imagenet", "one of ['lm', 'pathfinding', 'prosqa', 's5_retrieval', "
     "'s5_word_problem', 'sft', 'variable_assignment']"),
])
def test_a_bad_data_field_is_one_line_naming_it_and_the_allowed_values(task, field, value,
                                                                        allowed):
  c = _config(task)
  c.data[field] = value
  for build in (data_config, validate):
    with pytest.raises(ValueError) as e:
      build(c)
    text = str(e.value)
    assert "\n" not in text, text
    assert text.startswith(f"config field data.{field}={value!r} is invalid: allowed "
                           f"{allowed}"), text


def test_a_task_reads_its_own_fields():
  """The typed config of each task: its class, its fields from the group, no other task's."""
  c = _config("lm", path="/data/lm", eval_blocks=8, va_depth=5, group="Z2")
  d = data_config(c)
  assert type(d) is LMData and (d.path, d.eval_blocks) == ("/data/lm", 8)
  assert not hasattr(d, "va_depth") and not hasattr(d, "group")
  assert type(data_config(_config("s5_word_problem"))) is S5WordProblemData
  assert data_config(_config("variable_assignment", va_depth=5)) == \
      VariableAssignmentData(va_depth=5)
  r = data_config(_config("s5_retrieval", eval_lengths="8, 2,8"))
  assert isinstance(r, S5RetrievalData) and r.lengths() == [2, 8]
  with pytest.raises(dataclasses.FrozenInstanceError):
    r.group = "S3"


def test_saved_configs_with_the_flat_data_group_still_build():
  """The configs saved by earlier runs (tests/fixtures/configs_f3434b1.json: the flat data
  group of every task's fields) build their task's typed config and pass validate; with
  newer fields missing they take the defaults, keys that are no field are ignored, and
  today's configs resume them with no conflicting field."""
  with open(FIXTURE) as f:
    saved = json.load(f)
  sys.path.insert(0, os.path.join(REPO_ROOT, "configs"))
  try:
    for key, old in saved.items():
      read = config_dict.ConfigDict(migrate_experiment_config(old))
      d = data_config(read)
      assert type(d) is DATA_CONFIGS[old["data"]["task"]], key
      assert all(getattr(d, k) == v for k, v in old["data"].items() if hasattr(d, k)), key
      validate(read)
      name, variant = key.split(":")
      assert resume_conflicts(old, __import__(name).get_config(variant).to_dict()) == [], key
  finally:
    sys.path.pop(0)
  s5 = saved["s5_retrieval:"]
  older = {k: v for k, v in s5["data"].items()
           if k not in ("value_curriculum", "group_curriculum", "eval_lengths", "va_depth")}
  read = config_dict.ConfigDict({**s5, "data": {**older, "retired_field": 3}})
  d = data_config(read)
  assert (d.value_curriculum, d.group_curriculum, d.eval_lengths) == ("", "", None)
  assert d.max_actions == s5["data"]["max_actions"]


# A user's recurrence config written without `from __future__ import annotations` (this
# file has none): its annotations are real types, not strings.
@dataclasses.dataclass(frozen=True)
class RealAnnotations(RecurrenceConfig):
  """Every kind of field a config may hold, annotated with real types."""
  type: ClassVar[str] = "real_annotations"
  default_schedule: ClassVar[str] = "jacobi"
  r: int = 2
  scale: float | None = None
  bias: Optional[float] = 0.5
  gated: bool = True
  dims: tuple[int, ...] = (1, 2)

  def span(self, model) -> tuple[int, int]:
    return 0, model.n_layers - 1

  def num_params(self, model) -> int:
    return 0

  def mixer_flops(self, model, tokens: int, layers=None) -> float:
    return 0.0


@dataclasses.dataclass(frozen=True)
class RealOptions:
  """A schedule's options, annotated with real types."""
  real_sizes: tuple[int, ...] = (1,)
  real_tol: float | None = None


@pytest.fixture
def real_annotations(tmp_path):
  """RealAnnotations and a schedule with RealOptions registered (gone after the test) and
  a config file naming the type."""
  registry.RECURRENCES.register(registry.RecurrenceType.from_module(
      t2mlr_module, name="real_annotations", config=RealAnnotations))
  registry.SCHEDULES.register(registry.Schedule(
      name="real_schedule", run=None, flops=lambda costs, options, sweeps: (0.0, 0.0),
      options=RealOptions))
  path = tmp_path / "real_annotations.py"
  path.write_text("from t2mlr_jax.train.config import base_config, recurrence_config\n\n\n"
                  "def get_config():\n  c = base_config()\n"
                  "  c.model.recurrence = recurrence_config('real_annotations')\n"
                  "  return c\n")
  yield str(path)
  registry.RECURRENCES.unregister("real_annotations")
  registry.SCHEDULES.unregister("real_schedule")


def _parsed(path, *overrides):
  """The experiment config as the command line builds it (config_flags, main.py's flag)."""
  argv = ["prog", f"--config={path}", *overrides]
  values = flags.FlagValues()
  holder = config_flags.DEFINE_config_file("config", None, "", flag_values=values,
                                           sys_argv=argv)
  values(argv)
  return holder.value


def test_a_config_without_the_future_import_keeps_every_field(real_annotations):
  """Real annotations (int, float | None, Optional[float], bool, tuple[int, ...]) of a
  type's config and a schedule's options are read with get_type_hints: every field is in
  its group, overridable on the command line as its type, and round-trips through the
  checkpoint's record of the model config and of the experiment config."""
  group = recurrence_config("real_annotations")
  assert set(group) == {"type", "r", "scale", "bias", "gated", "dims"}
  assert {"real_sizes", "real_tol"} <= set(base_config().model.schedule_options)
  c = _parsed(real_annotations, "--config.model.recurrence.r=4",
              "--config.model.recurrence.scale=0.25", "--config.model.recurrence.bias=0.75",
              "--config.model.recurrence.gated=false", "--config.model.recurrence.dims=(3,4,5)",
              "--config.model.schedule_options.real_sizes=(2,3)",
              "--config.model.schedule_options.real_tol=0.5")
  cfg = model_config(c)
  assert cfg.recurrence == RealAnnotations(r=4, scale=0.25, bias=0.75, gated=False,
                                           dims=(3, 4, 5))
  assert cfg.schedule_options.explicit() == {"real_sizes": (2, 3), "real_tol": 0.5}
  meta = json.loads(json.dumps({"model_family": type(cfg).__name__,
                                "model_config": cfg.to_dict()}))
  assert meta["model_config"]["recurrence"]["r"] == 4
  back = checkpoint.model_config_from_meta(meta)
  assert back == cfg and hash(back) == hash(cfg)
  saved = json.loads(json.dumps(c.to_dict()))
  assert model_config(config_dict.ConfigDict(saved)) == cfg
  assert resume_conflicts(saved, c.to_dict()) == []


def test_a_field_no_group_can_hold_is_an_error_naming_it():
  """A field of another type (a dict, a list; in a type's config, a nested dataclass) is
  refused naming the class, the field and the types allowed, not left out of the group."""
  @dataclasses.dataclass(frozen=True)
  class Inner:
    depth: int = 1

  @dataclasses.dataclass(frozen=True)
  class Nesting(RealAnnotations):
    type: ClassVar[str] = "nesting"
    inner: Inner = Inner()

  registry.RECURRENCES.register(registry.RecurrenceType.from_module(
      t2mlr_module, name="nesting", config=Nesting))
  try:
    with pytest.raises(ValueError, match=r"^Nesting.inner: Inner is a type a config field "
                                         "cannot hold: allowed bool, int"):
      recurrence_config("nesting")
  finally:
    registry.RECURRENCES.unregister("nesting")
  @dataclasses.dataclass(frozen=True)
  class Odd:
    table: dict = dataclasses.field(default_factory=dict)

  @dataclasses.dataclass(frozen=True)
  class Listed:
    sizes: list[int] = dataclasses.field(default_factory=list)

  for cls, field, shown in ((Odd, "table", "dict"), (Listed, "sizes", "list[int]")):
    with pytest.raises(ValueError) as e:
      config_fields(cls)
    assert str(e.value).startswith(f"{cls.__name__}.{field}: {shown} is a type a config "
                                   "field cannot hold: allowed bool, int, float, str or tuple")
