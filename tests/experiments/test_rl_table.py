"""experiments/rl_table.py: each arm is the two configs with only the listed overrides
(the same task and held-out set in both stages, RL from the first stage's workdir); an arm
is recorded stage by stage with accuracy ± its standard error, skipped on a rerun, tabled."""

import importlib
import json
import math

import pytest

from _util import load_file


def test_the_stages_are_the_configs_with_the_listed_overrides_only():
  table = load_file("experiments", "rl_table.py")
  sft = table.build_config("sft", "transformer", 1)
  rl = table.build_config("rl", "t2mlr", 0, init_from="runs/t2mlr_seed0_sft")
  assert sft.model.recurrence.type == "none" and rl.model.recurrence.type == "t2mlr"
  assert (sft.train.seed, sft.train.num_steps, rl.train.num_steps) == (1, 1200, 100)
  for c in (sft, rl):
    assert (c.data.va_depth, c.data.eval_examples_per_length) == (1, 512)
  assert rl.model.init_from == "runs/t2mlr_seed0_sft" and rl.rl.group_size == 8
  assert (table.rl_stage(1e-4), table.rl_stage(1e-3)) == ("rl", "rl_lr0.001")
  assert rl.optimizer.lr == 1e-4
  assert table.build_config("rl_lr0.001", "t2mlr", 0, init_from="w").optimizer.lr == 1e-3
  assert (rl.model.schedule_options.d_forward, rl.model.schedule_options.d_backward) == (4, 2)
  default = importlib.import_module("rl_variable_assignment").get_config("")
  changed = {k for k in table.overrides("rl", "t2mlr", 0, "x")
             if _get(rl, k) != _get(default, k)}
  assert changed == set(table.overrides("rl", "t2mlr", 0, "x")) - {"train.seed"}
  assert table.command("sft", "transformer", 0, "w").endswith(
      "--config.model.recurrence.type=none --config.train.seed=0 --workdir=w")
  with pytest.raises(SystemExit, match="'lstm' is invalid: allowed"):
    table.main(["--arms=lstm"])


@pytest.mark.slow       # 30 s: configs/variable_assignment.py:tiny, then GRPO on it twice
def test_an_arm_is_recorded_stage_by_stage_then_skipped_and_tabled(tmp_path, monkeypatch,
                                                                   capsys):
  table = load_file("experiments", "rl_table.py")
  results = tmp_path / "rl_table.json"
  monkeypatch.setattr(table, "RESULTS", str(results))
  monkeypatch.setattr(table, "build_config", _tiny)
  argv = ["--arms=t2mlr", f"--workroot={tmp_path / 'runs'}"]
  table.main(argv)
  (name, record), = json.loads(results.read_text())["runs"].items()
  assert name == "t2mlr/seed0" and record["sft"]["steps"] == 3 and record["rl"]["steps"] == 2
  for stage in ("sft", "rl"):
    r = record[stage]
    assert 0 <= r["acc"] <= 1 and r["n"] == 8
    assert r["se"] == pytest.approx(math.sqrt(r["acc"] * (1 - r["acc"]) / 8))
  assert record["rl"]["command"].count("--config.model.init_from=" + record["sft"]["workdir"])
  assert [x["step"] for x in record["rl"]["reward_curve"]] == [1, 2]
  table.main(argv)
  out = capsys.readouterr().out
  assert "sft: recorded, skipped" in out and "rl: recorded, skipped" in out
  table.main(argv + ["--rl_lr=0.001"])        # another RL stage from the same first stage
  record = json.loads(results.read_text())["runs"]["t2mlr/seed0"]
  assert "--config.optimizer.lr=0.001" in record["rl_lr0.001"]["command"]
  out = capsys.readouterr().out
  assert "sft: recorded, skipped" in out
  assert "| t2mlr | 0 |" in out and "| 0.0001 |" in out and "| 0.001 |" in out


def _tiny(stage, arm, seed, init_from=""):
  """The configs' tiny variants (same model), the script's overrides of the task only."""
  name = "variable_assignment" if stage == "sft" else "rl_variable_assignment"
  c = importlib.import_module(name).get_config("tiny")
  c.data.va_depth = 1
  c.train.seed = seed
  if init_from:
    c.model.init_from = init_from
  return c


def _get(config, dotted):
  for k in dotted.split("."):
    config = config[k]
  return config
