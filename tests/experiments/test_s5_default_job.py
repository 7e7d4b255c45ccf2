"""experiments/s5_default_job.py --check: CI's last step passes the default job when its
final accuracies reach the README's row (a run stopped early: the recorded seeds' curve
at its last eval) and its first 50 steps' mean loss is the committed losses'
(tests/fixtures/default_job_losses.json), and names what moved."""

import json
import subprocess
import sys

import numpy as np

from _util import REPO_ROOT, load_file

FIXTURE = json.load(open(f"{REPO_ROOT}/tests/fixtures/default_job_losses.json"))


def _workdir(path, first_loss, first_step=50, accuracy=1.0, eval_step=6000, curve=None):
  path.mkdir()
  records = [{"step": first_step, "kind": "train", "loss": first_loss, "loss_window": 50},
             {"step": eval_step, "kind": "eval", **(curve or {}),
              "seq_acc_by_length": {n: accuracy for n in ("4", "8", "12", "16")}}]
  (path / "metrics.jsonl").write_text("\n".join(map(json.dumps, records)) + "\n")
  return str(path)


def _check(workdir):
  return subprocess.run([sys.executable, "experiments/s5_default_job.py", "--check",
                         f"--workdir={workdir}"], cwd=REPO_ROOT, capture_output=True,
                        text=True, timeout=120)


def test_the_first_window_is_checked_against_the_committed_losses(tmp_path):
  job = load_file("experiments", "s5_default_job.py")
  mean = float(np.mean(FIXTURE["losses"]))
  assert job.check_first_window(_workdir(tmp_path / "same", mean * (1 + 1e-6)))[2] == []
  loss, want, moved = job.check_first_window(_workdir(tmp_path / "moved", mean * 1.001))
  assert want == mean and len(moved) == 1 and "steps 1-50 moved" in moved[0], moved
  # a run resumed before its first log line (a window that is not steps 1..50) is no guard
  assert "is not steps 1..50" in job.check_first_window(
      _workdir(tmp_path / "resumed", mean, first_step=60))[2][0]


def test_the_check_exits_1_naming_each_failure_and_0_when_all_hold(tmp_path):
  mean = float(np.mean(FIXTURE["losses"]))
  ok = _check(_workdir(tmp_path / "ok", mean))
  assert ok.returncode == 0, ok.stderr
  bad = _check(_workdir(tmp_path / "bad", mean * 1.01, accuracy=0.5))
  assert bad.returncode == 1
  assert "steps 1-50 moved" in bad.stderr and "below the README: 4 actions" in bad.stderr


def test_a_run_stopped_early_is_checked_against_the_recorded_seeds_at_its_last_eval(tmp_path):
  job = load_file("experiments", "s5_default_job.py")
  mean = float(np.mean(FIXTURE["losses"]))
  runs = json.load(open(f"{REPO_ROOT}/experiments/results/s5_default_job.json"))["runs"]
  low = {k: min({r["step"]: r for r in runs[name]["eval_curve"]}[3000][k]
                for name in job.SEEDS) for k in job.CURVE_SLACK}
  ok = _check(_workdir(tmp_path / "ok", mean, eval_step=3000, curve=low))
  assert ok.returncode == 0 and "stopped at step 3000" in ok.stdout, ok.stderr
  under = {**low, "seq_acc": low["seq_acc"] - job.CURVE_SLACK["seq_acc"] - 0.01}
  bad = _check(_workdir(tmp_path / "bad", mean, eval_step=3000, curve=under))
  assert bad.returncode == 1 and "step 3000 seq_acc" in bad.stderr, bad.stderr
  assert "state_acc" not in bad.stderr          # only what fell is named
  # a step the seeds were not evaluated at cannot be judged: refused, not passed
  assert "no eval there" in job.check_curve(
      _workdir(tmp_path / "odd", mean, eval_step=2500, curve=low))[2][0]
