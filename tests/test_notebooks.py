"""The Colab notebooks run end to end offline at tiny size (their code cells, in order)."""

import glob
import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = sorted(glob.glob(os.path.join(ROOT, "notebooks", "*.ipynb")))


def code_of(path: str) -> str:
  """The notebook's code cells as one script; Colab shell lines (! and %) are left out."""
  with open(path) as f:
    nb = json.load(f)
  assert nb["nbformat"] == 4
  cells = [c for c in nb["cells"] if c["cell_type"] == "code"]
  assert cells and all(not c["outputs"] for c in cells), "commit notebooks without outputs"
  lines = [line for c in cells for line in "".join(c["source"]).splitlines() + [""]]
  return "\n".join(line for line in lines if not line.lstrip().startswith(("!", "%")))


def test_there_is_a_notebook():
  assert any(p.endswith("quickstart.ipynb") for p in NOTEBOOKS)


@pytest.mark.slow       # notebooks run in .ci/run's slow step
@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_runs_at_tiny_size(path, tmp_path):
  script = tmp_path / "notebook.py"
  script.write_text(code_of(path))
  env = dict(os.environ, T2MLR_NOTEBOOK_SIZE="tiny", MPLBACKEND="Agg",
             T2MLR_NOTEBOOK_WORKDIR=str(tmp_path / "workdir"))
  run = subprocess.run([sys.executable, str(script)], cwd=os.path.dirname(path), env=env,
                       capture_output=True, text=True, timeout=600)
  assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
  out = run.stdout
  if path.endswith("quickstart.ipynb"):
    assert os.listdir(tmp_path / "workdir" / "checkpoints")
    assert "value_acc_by_length" in out
    # Jacobi with as many sweeps as tokens equals exact; decode equals the exact forward.
    for label in ("max |jacobi - exact| =", "max |decode - exact forward| at the first new token ="):
      value = float(re.search(re.escape(label) + r"\s*(\S+)", out).group(1))
      assert value < 1e-4, (label, value)
