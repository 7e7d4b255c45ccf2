"""experiments/bench_common.py's results files, which every script reads and writes through
read_json / write_json: rewriting a recorded file unchanged leaves it byte for byte as it
is, and a write that fails or is killed leaves the previous file whole."""

import json
import os
import shutil

import pytest

from _util import REPO_ROOT, load_file

ROOT = REPO_ROOT
RESULTS = os.path.join(ROOT, "experiments", "results")
# The files their scripts write with indent=1 (s5_default_job.py, s5_lstm_gap.py,
# schedule_ablation.py, retrofit_smollm2.py for each task); every other one has indent=2.
INDENT_1 = ("s5_default_job.json", "s5_lstm_gap.json", "schedule_ablation_",
            "retrofit_smollm2")


def _bc():
  return load_file("experiments", "bench_common.py")


def test_rewriting_every_results_file_leaves_it_unchanged(tmp_path):
  """The load + write round trip of each recorded file (a copy) gives the same bytes: the
  writer keeps the format the files have (indent, key order, a final newline where the
  file has one)."""
  bc = _bc()
  names = sorted(f for f in os.listdir(RESULTS) if f.endswith(".json"))
  assert {"pretrain_lm.json", "s5_lstm_gap.json", "tpu_fit.json"} <= set(names)
  for name in names:
    copy = str(tmp_path / name)
    shutil.copyfile(os.path.join(RESULTS, name), copy)
    indent = 1 if name.startswith(INDENT_1) else 2
    bc.write_json(copy, bc.read_json(copy), indent=indent, stamp=False)
    with open(os.path.join(RESULTS, name), "rb") as a, open(copy, "rb") as b:
      assert a.read() == b.read(), f"{name}: rewritten differently"
  assert sorted(os.listdir(tmp_path)) == names                    # no temporary file left


def test_a_name_is_a_results_file_and_a_missing_file_is_a_copy_of_the_default(tmp_path):
  bc = _bc()
  assert bc.results_path("x.json") == os.path.join(RESULTS, "x.json")
  assert bc.results_path(str(tmp_path / "x.json")) == str(tmp_path / "x.json")
  with open(os.path.join(RESULTS, "tpu_fit.json")) as f:
    assert bc.read_json("tpu_fit.json") == json.load(f)
  missing = str(tmp_path / "missing.json")
  default = {"runs": {}}
  got = bc.read_json(missing, default=default)
  got["runs"]["a"] = 1                       # the caller fills what it gets
  assert default == {"runs": {}} and bc.read_json(missing, default=default) == {"runs": {}}
  assert bc.read_json(missing, default=None) is None
  with pytest.raises(FileNotFoundError):
    bc.read_json(missing)


def test_a_failed_or_killed_write_leaves_the_previous_file_whole(tmp_path, monkeypatch):
  bc = _bc()
  path = str(tmp_path / "sub" / "r.json")
  assert bc.write_json(path, {"a": 1}, indent=1, stamp=False) == path   # makes the folder
  with open(path, "rb") as f:
    assert f.read() == b'{\n "a": 1\n}'
  os.chmod(path, 0o640)
  with pytest.raises(TypeError):             # does not serialize: nothing written
    bc.write_json(path, {"a": object()}, stamp=False)

  def killed(*args):
    raise KeyboardInterrupt
  monkeypatch.setattr(os, "replace", killed)   # killed between writing and renaming
  with pytest.raises(KeyboardInterrupt):
    bc.write_json(path, {"a": 2}, stamp=False)
  monkeypatch.undo()
  with open(path, "rb") as f:
    assert f.read() == b'{\n "a": 1\n}'
  assert os.listdir(tmp_path / "sub") == ["r.json"]                     # no temporary file
  with open(path, "ab") as f:                # a file ending with a newline keeps it
    f.write(b"\n")
  bc.write_json(path, {"a": 3}, indent=1, stamp=False)
  with open(path, "rb") as f:
    assert f.read() == b'{\n "a": 3\n}\n'
  assert os.stat(path).st_mode & 0o777 == 0o640                        # and its permissions
