"""experiments/reasoning_table.py: one run trained and recorded from its last evaluation
(written as it goes), a recorded run skipped on a rerun, the table per size; the arms are
the configs' variants with only the seed and the budget changed."""

import importlib
import json

import pytest

from _util import load_file


def test_the_arms_are_the_configs_variants_with_seed_and_budget_changed():
  table = load_file("experiments", "reasoning_table.py")
  c = table.build_config("prosqa", "all_layers", 2, steps=40)
  assert (c.train.seed, c.train.num_steps, c.train.eval_every) == (2, 40, 40)
  assert (c.model.recurrence.l_start, c.model.recurrence.l_end) == (0, -1)
  assert table.build_config("pathfinding", "transformer", 0).model.recurrence.type == "none"
  assert table.command("pathfinding", "t2mlr", 1, None) == (
      "python -m t2mlr_jax.main --config=configs/pathfinding.py --config.train.seed=1")


def test_a_setting_is_the_configs_variant_prefix_and_keys_its_records():
  """`--setting=short`: each arm is the config's `short_` variant (T2MLR's `short`); its
  records are keyed apart; a task whose config names no such setting is refused."""
  table = load_file("experiments", "reasoning_table.py")
  c = table.build_config("pathfinding", "transformer", 1, setting="short")
  assert (c.name, c.data.pf_path_max, c.data.pf_lanes, c.model.recurrence.type) == (
      "pathfinding_short_transformer", 4, 1, "none")
  t2mlr = table.build_config("pathfinding", "t2mlr", 1, setting="short")
  assert (t2mlr.name, t2mlr.model.recurrence.type) == ("pathfinding_short", "t2mlr")
  assert table.command("pathfinding", "lrt", 2, None, "short") == (
      "python -m t2mlr_jax.main --config=configs/pathfinding.py:short_lrt "
      "--config.train.seed=2")
  assert table.key("pathfinding", "lrt", 2, None, "short") == (
      "pathfinding_short/lrt/stepsdefault/seed2")
  with pytest.raises(SystemExit, match=r"--setting='short' is invalid for prosqa: allowed \[''\]"):
    table.main(["--tasks=prosqa", "--setting=short"])


@pytest.mark.slow       # 9 s: trains configs/pathfinding.py:tiny
def test_a_run_is_recorded_then_skipped_and_tabled(tmp_path, monkeypatch, capsys):
  table = load_file("experiments", "reasoning_table.py")
  results = tmp_path / "reasoning_table.json"
  monkeypatch.setattr(table, "RESULTS", str(results))
  monkeypatch.setattr(table, "build_config",      # the tiny variant, the script's overrides
                      lambda task, arm, seed, steps=None, setting="": _tiny(task, seed, steps))
  argv = ["--tasks=pathfinding", "--arms=t2mlr", "--seeds=0", "--steps=2",
          f"--workroot={tmp_path / 'runs'}"]
  table.main(argv)
  runs = json.loads(results.read_text())["runs"]
  (name, record), = runs.items()
  assert name == "pathfinding/t2mlr/steps2/seed0" and record["steps"] == 2
  assert set(record["seq_acc_by_length"]) == {"3", "4"} and record["params"] > 0
  assert 0 < record["train_s"] < record["wall_s"]     # the steps alone, every stretch
  table.main(argv)
  out = capsys.readouterr().out
  assert "recorded, skipped" in out and "| t2mlr |" in out and "| 3 | 4 | train time |" in out


def _tiny(task, seed, steps):
  c = importlib.import_module(task).get_config("tiny")
  c.train.update(seed=seed, num_steps=steps, eval_every=steps, checkpoint_every=steps)
  return c

