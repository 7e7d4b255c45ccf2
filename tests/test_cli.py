"""Command-line errors: one line naming what is wrong, exit status 2; the traceback only
with --verbose."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "configs", "s5_retrieval.py") + ":tiny"


def _run(*args, cwd):
  return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True,
                        cwd=cwd, timeout=300, env=dict(os.environ, JAX_PLATFORMS="cpu"))


@pytest.mark.parametrize("args,message", [
    (("t2mlr_jax.main", f"--config={TINY}", "--config.train.num_stepz=5"),
     "error: unknown config field --config.train.num_stepz: did you mean num_steps?"),
    (("t2mlr_jax.main", "--config=configs/nope.py"),
     "error: no such file or directory: configs/nope.py"),
    (("t2mlr_jax.main", f"--config={TINY}", "--config.train.num_steps=-1", "--workdir=wd"),
     "error: config field train.num_steps=-1 is invalid: allowed an integer >= 1"),
    (("t2mlr_jax.evaluate", "--workdir=empty"), "error: no checkpoint found under"),
    (("t2mlr_jax.convert", "--from=empty", "--to-hf=out"), "error: no checkpoint found under"),
], ids=["misspelled-field", "missing-config", "bad-value", "evaluate-empty", "convert-empty"])
def test_errors_are_one_line_with_exit_status_2(tmp_path, args, message):
  (tmp_path / "empty").mkdir()
  run = _run(*args, cwd=tmp_path)
  assert run.returncode == 2, run.stderr[-2000:]
  lines = [line for line in run.stderr.splitlines() if line.strip()]
  assert len(lines) == 1 and lines[0].startswith(message), run.stderr[-2000:]
  assert "Traceback" not in run.stderr


def test_verbose_keeps_the_traceback(tmp_path):
  run = _run("t2mlr_jax.main", f"--config={TINY}", "--config.train.num_steps=-1",
             "--workdir=wd", "--verbose", cwd=tmp_path)
  assert run.returncode != 0 and "Traceback" in run.stderr
  assert "train.num_steps=-1 is invalid" in run.stderr
