"""The extension points (t2mlr_jax/registry.py): a registry's names, lookups and refusals,
what a recurrence type, a schedule and a model family declare, the defaults and lookups by
config, a schedule registered after import adding its options, and a user's file imported
with --user_module."""

import dataclasses
import sys
import types

import pytest

from t2mlr_jax import ModelConfig, registry
from t2mlr_jax.model.recurrence import t2mlr as t2mlr_module

from _util import tiny_cfg


@dataclasses.dataclass(frozen=True)
class _Entry:
  name: str
  source: str = "here"


def test_a_registry_keeps_its_entries_in_order_and_refuses_clashes():
  """Built-ins load on first use; a name must be an identifier; a taken name is refused
  naming who took it (the same entry again is not); an unknown name lists the known."""
  reg = registry.Registry("widget", "model.widget", "json")
  first, second = _Entry("first"), _Entry("second")
  assert reg.register(first) is first and reg.register(second) is second
  assert reg.register(_Entry("first")) == first          # the same entry again: kept
  assert reg.names() == ("first", "second") and reg.values() == (first, second)
  assert "first" in reg and list(reg) == ["first", "second"] and len(reg) == 2
  assert reg.get("second") is second
  with pytest.raises(ValueError, match=r"widget 'first' is already registered \(by here\); "
                                       "choose another name"):
    reg.register(_Entry("first", source="elsewhere"))
  with pytest.raises(ValueError, match=r"widget name 'no good' is invalid: allowed a Python "
                                       "identifier"):
    reg.register(_Entry("no good"))
  with pytest.raises(ValueError, match=r"model.widget='third' is invalid: allowed one of "
                                       r"\('first', 'second'\)"):
    reg.get("third")
  with pytest.raises(ValueError, match=r"--widget='third' is invalid"):
    reg.get("third", field="--widget")
  reg.unregister("first")
  reg.unregister("never")                                  # absent: nothing to do
  assert reg.names() == ("second",)
  assert "json" in sys.modules


def test_entries_check_their_declarations():
  """A recurrence type's config class carries its name; a module lacking an interface
  function is named at registration; a schedule's options are a dataclass whose fields
  are the defaults."""
  with pytest.raises(ValueError, match=r"recurrence type 'other': its config class "
                                       r"T2MLRConfig must have the class attribute "
                                       r"type = 'other'"):
    registry.RecurrenceType.from_module(t2mlr_module, name="other",
                                        config=t2mlr_module.T2MLRConfig)
  partial = types.ModuleType("partial_type")
  partial.init_params = lambda cfg, rng: None
  with pytest.raises(ValueError, match=r"recurrence type 'partial' \(partial_type\) lacks "
                                       r"\['zero_state', 'read'"):
    registry.RecurrenceType.from_module(partial, name="partial", config=None)
  flops = lambda costs, options, sweeps: (0.0, 0.0)
  with pytest.raises(ValueError, match=r"schedule 'odd': options=\{'k': 1\} is invalid: "
                                       "allowed None or a frozen dataclass"):
    registry.Schedule(name="odd", run=None, flops=flops, options={"k": 1})

  @dataclasses.dataclass(frozen=True)
  class Options:
    depth: int = 3
    weights: tuple = dataclasses.field(default_factory=tuple)
  schedule = registry.Schedule(name="mine", run=None, flops=flops, options=Options)
  assert schedule.option_defaults() == {"depth": 3, "weights": ()}
  assert registry.Schedule(name="bare", run=None, flops=flops).option_defaults() == {}


def test_the_defaults_and_the_entries_of_a_config():
  assert registry.default_recurrence().name == "t2mlr"
  assert registry.default_family().name == "transformer"
  assert registry.recurrence_of(tiny_cfg()).name == "t2mlr"
  assert registry.recurrence_of(ModelConfig()).config is None           # the "none" entry
  assert registry.family_of(ModelConfig()).name == "transformer"
  classes = registry.recurrence_config_classes()
  assert classes["t2mlr"] is t2mlr_module.T2MLRConfig and "lrt" in classes
  assert "none" not in classes
  with pytest.raises(ValueError, match=r"str is not the config of a registered model "
                                       r"family: allowed \[.*'ModelConfig'"):
    registry.family_of("a model")


def test_a_type_declares_how_it_is_added_to_a_pretrained_model():
  """`retrofit`: T2MLR as it is (γ = 0 at init), LRT only with its identity init; the
  model without a recurrence declares none."""
  from t2mlr_jax import LRTConfig, T2MLRConfig
  t2mlr = T2MLRConfig(l_start=2)
  assert registry.RECURRENCES.get("t2mlr").retrofit(t2mlr) is t2mlr
  lrt = registry.RECURRENCES.get("lrt")
  assert lrt.retrofit(LRTConfig(init="identity")) == LRTConfig(init="identity")
  with pytest.raises(ValueError, match=r"recurrence.init='official' is invalid: allowed "
                                       "'identity'"):
    lrt.retrofit(LRTConfig())
  assert registry.RECURRENCES.get("none").retrofit is None


def test_a_schedule_of_ones_own_declares_its_options_and_may_share_only_with_one_default():
  """A schedule registered after import adds its options (read when asked, never frozen);
  another declaring an option already declared must give it the same default."""
  import dataclasses

  from t2mlr_jax import Schedule, ScheduleOptions, register_schedule
  from t2mlr_jax.registry import SCHEDULES

  @dataclasses.dataclass(frozen=True)
  class Mine:
    my_depth: int = 5
    passes: int = 2          # shared with interleaved / chunked, same default

  @dataclasses.dataclass(frozen=True)
  class Clash:
    passes: int = 7

  flops = lambda costs, options, sweeps: (0.0, 0.0)
  register_schedule(Schedule(name="test_mine", run=None, flops=flops, options=Mine))
  try:
    assert ScheduleOptions(my_depth=9).my_depth == 9
    assert tiny_cfg().schedule_options.my_depth == 5
    with pytest.raises(ValueError, match=r"option passes=7, but 'interleaved' .* default 2"):
      register_schedule(Schedule(name="test_clash", run=None, flops=flops, options=Clash))
    assert "test_clash" not in SCHEDULES
  finally:
    SCHEDULES.unregister("test_mine")
  with pytest.raises(ValueError, match="my_depth"):
    ScheduleOptions(my_depth=9)


def test_a_user_module_is_imported_once_and_recorded(tmp_path, monkeypatch):
  """The file runs once (importing it again returns the same module) and is recorded for
  checkpoints; a file that fails to import leaves no module behind; a path that is no .py
  file is refused."""
  monkeypatch.setattr(registry, "USER_MODULES", [])
  mine = tmp_path / "mine.py"
  mine.write_text("RUNS = []\nRUNS.append(1)\n")
  try:
    module = registry.import_user_module(str(mine))
    assert module.__name__ == "t2mlr_user_mine" and module.RUNS == [1]
    assert registry.import_user_module(str(mine)) is module and module.RUNS == [1]
    assert registry.USER_MODULES == [str(mine)]
  finally:
    sys.modules.pop("t2mlr_user_mine", None)
  broken = tmp_path / "broken.py"
  broken.write_text("raise RuntimeError('broken on purpose')\n")
  with pytest.raises(RuntimeError, match="broken on purpose"):
    registry.import_user_module(str(broken))
  assert "t2mlr_user_broken" not in sys.modules and registry.USER_MODULES == [str(mine)]
  for bad in (tmp_path / "missing.py", tmp_path):
    with pytest.raises(ValueError, match=r"--user_module=.* is invalid: allowed the path of "
                                         r"an existing \.py file"):
      registry.import_user_module(str(bad))


def test_user_modules_are_read_from_the_command_line_before_its_flags():
  argv = ["main", "--user_module=a.py,b.py", "--config=c.py", "--user_module", "d.py",
          "--user_module=", "--user_module"]
  assert registry.user_modules_in(argv) == ["a.py", "b.py", "d.py"]
  assert registry.user_modules_in(["main", "--config=c.py"]) == []
