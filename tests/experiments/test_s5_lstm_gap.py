"""experiments/s5_lstm_gap.py: a run is recorded from its workdir's last evaluation; a
run stopped early is refused, or recorded marked as stopped when asked, and resumed."""

import json

import pytest

from _util import load_file


def _workdir(path, steps):
  path.mkdir()
  evals = [{"step": s, "kind": "eval", "seq_acc": 0.0, "state_acc": s / 1e4,
            "value_acc": 0.1, "seq_acc_by_length": {"4": 0.0},
            "state_acc_by_length": {"4": s / 1e4}, "value_acc_by_length": {"4": 0.1}}
           for s in steps]
  (path / "metrics.jsonl").write_text("\n".join(map(json.dumps, evals)) + "\n")
  return str(path)


def test_a_run_is_recorded_from_its_last_evaluation_and_a_stopped_one_only_when_asked(
    tmp_path):
  gap = load_file("experiments", "s5_lstm_gap.py")
  done = gap.record("s4", "lstm", 0, _workdir(tmp_path / "a", [1000, 6000]), 60.0)
  assert (done["group"], done["dict_size"], done["value_len"]) == ("S4", 24, 1)
  assert done["state_acc"] == 0.6 and "stopped_at_eval" not in done
  assert done["command"].endswith("s5_retrieval_lstm.py:s4 --config.train.seed=0")
  stopped = _workdir(tmp_path / "b", [1000, 3000])
  with pytest.raises(SystemExit, match="stopped before step 6000"):
    gap.record("s4", "t2mlr", 0, stopped, 60.0)
  marked = gap.record("s4", "t2mlr", 0, stopped, 0.0, partial=True)
  assert marked["stopped_at_eval"] == 3000 and marked["state_acc"] == 0.3


def test_value_accuracy_per_character_is_added_from_the_last_checkpoint(tmp_path):
  """A record without value_acc_by_slot gets it by rerunning the trainer's evaluation on
  the run's last checkpoint (checked against the recorded value accuracy); one that has it
  is left alone."""
  from t2mlr_jax.train.loop import train
  gap = load_file("experiments", "s5_lstm_gap.py")
  workdir = gap.workdir_of("tiny", "t2mlr", 0, str(tmp_path))
  train(gap.build_config("tiny", "t2mlr", 0), workdir, progress=False)
  run = gap.record("tiny", "t2mlr", 0, workdir, 1.0)
  slots = run.pop("value_acc_by_slot")          # as recorded before the metric existed
  assert sorted(slots) == ["1", "2", "3", "4"]     # tiny: 4-character values
  assert gap.add_slots("tiny/t2mlr/seed0", run, str(tmp_path))
  assert run["value_acc_by_slot"] == pytest.approx(slots)
  assert not gap.add_slots("tiny/t2mlr/seed0", run, str(tmp_path))
