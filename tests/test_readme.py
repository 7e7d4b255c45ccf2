"""The README's code runs as written: the API example, and the quick start's training
command (at the tiny variant) followed by the "Loading a checkpoint" snippet."""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def blocks(language: str) -> list[str]:
  with open(os.path.join(ROOT, "README.md")) as f:
    text = f.read()
  return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


def _python(code: str, cwd, timeout=600):
  return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True,
                        text=True, timeout=timeout)


def test_readme_stays_a_manual():
  size = os.path.getsize(os.path.join(ROOT, "README.md"))
  assert size <= 12 * 1024, f"README.md is {size} bytes: keep it under 12 KB (details in docs/)"


def test_api_example_runs(capsys):
  api = next(b for b in blocks("python") if "t2.init_params" in b)
  exec(compile(api, "README.md (the API)", "exec"), {})
  diff, sweeps = capsys.readouterr().out.split()[:2]
  assert float(diff) < 1e-4                          # Jacobi with D_f >= T equals exact
  assert sweeps == "32"                              # the sweeps run: d_forward=32


@pytest.mark.slow
def test_quick_start_then_loading_a_checkpoint(tmp_path):
  setup = next(b for b in blocks("bash") if "python -m t2mlr_jax.main" in b)
  command = next(line for line in setup.splitlines() if "t2mlr_jax.main" in line)
  command = command.split("&&")[-1].strip()           # after the pip installs
  assert command == ("python -m t2mlr_jax.main --config=configs/s5_retrieval.py "
                     "--workdir=workdirs/s5")
  args = command.split()[1:]
  args[2] = f"--config={ROOT}/configs/s5_retrieval.py:tiny"
  train = subprocess.run([sys.executable, *args], cwd=tmp_path, capture_output=True,
                         text=True, timeout=600)
  assert train.returncode == 0, train.stderr[-3000:]
  snippet = next(b for b in blocks("python") if "checkpoint.load" in b)
  run = _python(snippet, tmp_path)
  assert run.returncode == 0, run.stderr[-3000:]
  right = int(re.search(r"(\d+)/20 sequences right", run.stdout).group(1))
  # the same count from the library's own S5 metric on the same examples
  check = snippet.replace('print(f"{right.sum()}/20 sequences right")', "") + (
      "\nfrom t2mlr_jax.eval.s5 import S5Metrics\nm = S5Metrics()\n"
      "batch['control_flow'] = s5_examples.control_flow(batch['input_ids'])\n"
      "m.update(np.asarray(logits).argmax(-1), batch)\nprint(round(m.result()['seq_acc'] * 20))")
  ref = _python(check, tmp_path)
  assert ref.returncode == 0, ref.stderr[-3000:]
  assert right == int(ref.stdout.split()[-1])
