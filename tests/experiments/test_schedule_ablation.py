"""experiments/schedule_ablation.py's adoption of already-recorded default jobs: a recorded
run is taken only when the ablation's config trains exactly what it trained."""

import json
import os

import pytest

from _util import REPO_ROOT, load_file

ROOT = REPO_ROOT


def _ablation():
  return load_file("experiments", "schedule_ablation.py")


@pytest.mark.parametrize("task,run", [("retrieval", "t2mlr_jacobi"),
                                      ("retrieval", "lrt_interleaved"),
                                      ("lm", "t2mlr_jacobi"), ("lm", "lrt_interleaved")])
def test_adopted_runs_are_the_configs_default_jobs(task, run):
  ab = _ablation()
  record = ab.adopt(task, run)
  file, keys = ab.ADOPTED[task][run]
  with open(os.path.join(ROOT, "experiments", "results", file)) as f:
    source = json.load(f)
  for key in keys:
    source = source[key]
  assert record["params"] == source["params"]
  if task == "lm":       # pretrain_lm.py's cost model and ours agree on the schedule run
    assert record["train_mode"] == source["train_mode"]
    assert record["train_flops"] == pytest.approx(source["flops"], rel=1e-9)
    assert record["bpb_exact"] == source["final"]["exact"]
  else:
    assert record["seq_acc_by_length"] == source["final_eval"]["seq_acc_by_length"]
    assert record["steps"] == source["num_steps"]


def test_adopt_refuses_a_run_whose_schedule_differs(monkeypatch):
  ab = _ablation()
  module, variant, overrides = ab.TASKS["retrieval"][1]["t2mlr_jacobi"]
  monkeypatch.setitem(ab.TASKS["retrieval"][1], "t2mlr_jacobi",
                      (module, variant, {**overrides, "model.schedule_options.d_forward": 8}))
  with pytest.raises(SystemExit, match="t2mlr_jacobi.*model config differs"):
    ab.adopt("retrieval", "t2mlr_jacobi")
  monkeypatch.setitem(ab.TASKS["retrieval"][1], "t2mlr_jacobi",
                      (module, variant, {"train.mode": "multi_refine"}))
  with pytest.raises(SystemExit, match="schedule differs"):
    ab.adopt("retrieval", "t2mlr_jacobi")
