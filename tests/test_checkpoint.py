"""Checkpoints (t2mlr_jax/checkpoint.py): a run's steps saved and restored by the
`Checkpointer`, the public loader (`load`, `load_config`) of run steps and parameter
exports (`export`), the steps kept aside on a resume from an earlier one, the errors that
say which step, file or module is missing, and the checksums: a damaged step refused in one
line by `load`, evaluate and the resume."""

import contextlib
import glob
import hashlib
import logging
import os
import re
import shutil
import subprocess
import sys

import grain
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from model.test_recurrence_lrt import active, lrt_cfg

from t2mlr_jax import checkpoint, init_params
from t2mlr_jax.checkpoint import Checkpointer
from t2mlr_jax.train import loop
from t2mlr_jax.train.step import TrainState

from _util import REPO_ROOT, tiny_cfg


def train_state(cfg, step):
  """A TrainState of `cfg`'s fresh params (seeded by `step`) and a small optimizer state."""
  params = init_params(cfg, jax.random.PRNGKey(step))
  opt_state = {"mu": jax.tree.map(jnp.zeros_like, params), "count": jnp.int32(step)}
  return TrainState(step=jnp.int32(step), params=params, opt_state=opt_state,
                    nonfinite_step=jnp.int32(-1))


def data_iterator(skip=0):
  """A Grain iterator over 0..9, `skip` records on."""
  it = iter(grain.MapDataset.range(10).to_iter_dataset())
  for _ in range(skip):
    next(it)
  return it


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  """A workdir with steps 2 and 4 of a tiny model (the data iterator 2 and 4 records on)."""
  wd = str(tmp_path_factory.mktemp("run"))
  cfg = tiny_cfg()
  ckpt = Checkpointer(wd, async_save=False)
  states = {}
  for step in (2, 4):
    states[step] = train_state(cfg, step)
    config = {"model": {"d_model": cfg.d_model}, "train": {"num_steps": 4, "step": step}}
    ckpt.save(step, states[step], data_iterator(step), config, cfg)
  ckpt.close()
  return wd, cfg, states


def _same(a, b):
  jax.tree.map(np.testing.assert_array_equal, a, b)


def test_a_run_saves_and_restores_its_steps(run):
  """The steps, their meta (format, model config), the train state restored into the
  abstract layout given, and the data iterator restored in place."""
  wd, cfg, states = run
  ckpt = Checkpointer(wd, read_only=True)
  try:
    assert ckpt.latest_step() == 4 and ckpt.all_steps() == [2, 4]
    meta = ckpt.check_format(2)
    assert meta["step"] == 2 and meta["model_family"] == "ModelConfig"
    assert meta["model_config"] == cfg.to_dict()
    assert ckpt.read_json(4, "config")["train"]["step"] == 4
    with pytest.raises(ValueError, match=r"has format_version=0: this library reads "
                                         rf"format_version={checkpoint.FORMAT_VERSION}"):
      ckpt.check_format(2, {"format_version": 0})
    abstract = jax.eval_shape(lambda: states[2])
    it = data_iterator()
    restored = ckpt.restore(2, abstract, it)
    _same(restored, states[2])
    assert next(it) == 2                  # the iterator goes on where step 2 left it
  finally:
    ckpt.close()
  assert checkpoint.saved_steps(wd) == [2, 4]


def test_load_and_load_config_read_a_step(run):
  wd, cfg, states = run
  loaded_cfg, params = checkpoint.load(wd)
  assert loaded_cfg == cfg
  _same(params, states[4].params)
  _same(checkpoint.load(wd, 2)[1], states[2].params)
  assert checkpoint.load_config(wd).train.step == 4
  assert checkpoint.load_config(wd, 2).train.step == 2
  with pytest.raises(ValueError, match=r"step=3 is not saved in .*checkpoints: allowed one "
                                       r"of \[2, 4\]"):
    checkpoint.load(wd, 3)


def test_missing_or_empty_runs_are_named(tmp_path):
  with pytest.raises(ValueError, match=r"no checkpoint found under .*nothing.checkpoints "
                                       r"\(is --workdir right\?\)"):
    checkpoint.load(str(tmp_path / "nothing"))
  Checkpointer(str(tmp_path / "empty")).close()          # a run that saved nothing yet
  for read in (checkpoint.load, checkpoint.load_config):
    with pytest.raises(ValueError, match=r"no checkpoint found under .*empty.checkpoints$"):
      read(str(tmp_path / "empty"))
  assert checkpoint.saved_steps(str(tmp_path / "nothing")) == []


def test_resuming_from_an_earlier_step_sets_the_later_ones_aside(tmp_path):
  """Later steps move to checkpoints_set_aside/ (an earlier set-aside of the same step is
  kept beside, numbered); a step that was not saved is refused listing the saved ones."""
  root = tmp_path / "checkpoints"
  for step in (10, 20, 30):
    (root / str(step)).mkdir(parents=True)
  (root / "40.orbax-checkpoint-tmp-1").mkdir()            # an unfinished save: not a step
  (tmp_path / checkpoint.SET_ASIDE / "30").mkdir(parents=True)
  assert checkpoint.saved_steps(str(tmp_path)) == [10, 20, 30]
  with pytest.raises(ValueError, match=r"train.resume_step=15 is invalid: allowed one of the "
                                       r"steps saved in .*: \[10, 20, 30\]"):
    checkpoint.set_aside_after(str(tmp_path), 15)
  assert checkpoint.set_aside_after(str(tmp_path), 10) == [20, 30]
  assert checkpoint.saved_steps(str(tmp_path)) == [10]
  assert sorted(os.listdir(tmp_path / checkpoint.SET_ASIDE)) == ["20", "30", "30.1"]


def test_an_export_is_refused_as_a_step_and_never_overwritten(tmp_path):
  cfg = tiny_cfg()
  params = init_params(cfg, jax.random.PRNGKey(0))
  path = str(tmp_path / "export")
  assert not checkpoint.is_export(path)
  checkpoint.export(cfg, params, path)
  assert checkpoint.is_export(path) and not checkpoint.is_export(str(tmp_path))
  with pytest.raises(ValueError, match=r"is a parameter export \(one step\): pass step=None"):
    checkpoint.load(path, step=1)
  with pytest.raises(ValueError, match=r"export.params already exists: refusing to "
                                       r"overwrite an export"):
    checkpoint.export(cfg, params, path)
  (tmp_path / "a_file").write_text("")
  with pytest.raises(ValueError, match="is a file: an export is a directory"):
    checkpoint.check_export_target(str(tmp_path / "a_file"))
  with pytest.raises(ValueError, match=r"model_family='LinearConfig': allowed \["):
    checkpoint.model_config_from_meta({"model_family": "LinearConfig", "model_config": {}})


def test_export_and_load(tmp_path):
  cfg = lrt_cfg(passes=3)
  params = active(cfg)
  checkpoint.export(cfg, params, str(tmp_path / "lrt"))
  cfg2, params2 = checkpoint.load(str(tmp_path / "lrt"))
  assert cfg2 == cfg
  jax.tree.map(np.testing.assert_array_equal, params2, params)


def test_a_checkpoint_of_an_unregistered_type_names_the_module(tmp_path):
  meta = {"model_family": "ModelConfig", "user_modules": [str(tmp_path / "gone.py")],
          "model_config": {"recurrence": {"type": "no_such_type"}}}
  with pytest.raises(ValueError, match=r"recurrence type 'no_such_type' is not registered.*"
                                       r"--user_module=.*gone\.py"):
    checkpoint.model_config_from_meta(meta)


def test_the_public_loader_does_not_import_the_trainer():
  """checkpoint.load is for downstream scripts: importing it pulls in neither the
  trainer nor the pretrained-model converters (no import circle)."""
  code = ("import sys, t2mlr_jax.checkpoint; "
          "print(sorted(m for m in sys.modules if m.startswith(('t2mlr_jax.train', "
          "'t2mlr_jax.convert'))))")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert out.stdout.strip() == "[]"


# Integrity: a damaged step is one line naming the step, the array and the last intact step

S5_CONFIG = os.path.join(REPO_ROOT, "configs", "s5_retrieval.py")
RUN_FLAGS = ["--config.train.num_steps=2", "--config.train.checkpoint_every=1",
             "--config.train.eval_every=1000"]


def _s5_tiny():
  """configs/s5_retrieval.py:tiny with RUN_FLAGS' fields."""
  sys.path.insert(0, os.path.dirname(S5_CONFIG))
  import s5_retrieval
  sys.path.pop(0)
  config = s5_retrieval.get_config("tiny")
  config.train.update(num_steps=2, checkpoint_every=1, eval_every=1000)
  return config


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """A tiny s5 run's workdir with steps 1 and 2 as the trainer saves them (its fresh
  state: the train step is never compiled, to keep these tests cheap)."""
  wd = str(tmp_path_factory.mktemp("trained"))
  run = loop._setup(_s5_tiny(), wd)
  with contextlib.ExitStack() as cleanup:
    loop._open(run, cleanup)
    loop._restore(run)
    for step in (1, 2):
      run.save(step)
  return wd


def _damage(wd, kind):
  """Damage step 2's params: XOR 2000 bytes in the middle of the largest data file ("flip":
  a broken compressed frame, or wrong values), cut it in half ("truncate"), or rewrite them
  with one value changed ("recoded": wrong values in a valid encoding, what a flip inside
  a frame decodes to; only the checksum sees it). Returns the files' hashes after."""
  if kind == "recoded":
    item = os.path.join(wd, "checkpoints", "2", "params")
    with ocp.StandardCheckpointer() as ckptr:
      leaves, treedef = jax.tree.flatten(jax.tree.map(np.asarray, ckptr.restore(item)))
      leaves[-1] = leaves[-1] + 1.0
      ckptr.save(item + ".recoded", jax.tree.unflatten(treedef, leaves))
    shutil.rmtree(item)
    os.rename(item + ".recoded", item)
    return _files(wd)
  files = glob.glob(os.path.join(wd, "checkpoints", "2", "params", "ocdbt.process_0", "d",
                                 "*"))
  path = max(files, key=os.path.getsize)
  with open(path, "rb") as f:
    data = bytearray(f.read())
  if kind == "flip":
    mid = len(data) // 2
    data[mid:mid + 2000] = bytes(b ^ 0xFF for b in data[mid:mid + 2000])
  else:
    data = data[:len(data) // 2]
  with open(path, "wb") as f:
    f.write(bytes(data))
  return _files(wd)


def _files(wd):
  """{path: content hash} of every file under `wd`."""
  out = {}
  for root, _, names in os.walk(wd):
    for name in names:
      with open(os.path.join(root, name), "rb") as f:
        out[os.path.join(root, name)] = hashlib.sha1(f.read()).hexdigest()
  return out


def _assert_nothing_written(wd, files):
  """No file changed and none added: no metrics, checkpoint, config or TensorBoard file."""
  assert _files(wd) == files


@pytest.fixture(params=["flip", "truncate", "recoded"])
def damaged(request, trained, tmp_path):
  """A copy of `trained` with step 2 damaged: (workdir, kind, its files' hashes)."""
  wd = str(tmp_path / "wd")
  shutil.copytree(trained, wd)
  return wd, request.param, _damage(wd, request.param)


def _assert_names_the_damage(message, wd, kind):
  assert "\n" not in message
  assert message.startswith(f"checkpoint step 2 in {wd} could not be read: array params/")
  if kind == "recoded":
    assert re.search(r"array params/[\w/]+ does not match the checksum saved with it",
                     message), message
  assert ("the last intact step is 1: resume from it with --config.train.resume_step=1 "
          "(saved: [1]; ") in message and "evaluate it with --step=1" in message


def test_a_damaged_step_is_refused_by_load(damaged):
  wd, kind, _ = damaged
  with pytest.raises(checkpoint.DamagedCheckpointError) as e:
    checkpoint.load(wd)
  _assert_names_the_damage(str(e.value), wd, kind)
  checkpoint.load(wd, 1)                  # the intact step still loads


def test_a_damaged_step_is_one_line_from_evaluate_and_writes_nothing(damaged):
  wd, kind, files = damaged
  out = subprocess.run([sys.executable, "-m", "t2mlr_jax.evaluate", f"--workdir={wd}"],
                       cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
  lines = [line for line in out.stderr.splitlines() if line.strip()]
  assert out.returncode == 2 and len(lines) == 1, out.stderr[-3000:]
  assert lines[0].startswith("error: ") and lines[0].endswith("(--verbose for the traceback)")
  _assert_names_the_damage(lines[0][len("error: "):], wd, kind)
  assert _files(wd) == files and out.stdout == ""      # no eval_step2.json


def test_a_damaged_step_stops_the_resume_before_anything_is_written(damaged):
  wd, kind, files = damaged
  with pytest.raises(checkpoint.DamagedCheckpointError) as e:
    loop.train(_s5_tiny(), wd, progress=False)
  _assert_names_the_damage(str(e.value), wd, kind)
  _assert_nothing_written(wd, files)


def test_main_says_a_damaged_step_in_one_line(trained, tmp_path):
  """The resume through the command line: one line, exit 2, nothing written."""
  wd = str(tmp_path / "wd")
  shutil.copytree(trained, wd)
  files = _damage(wd, "recoded")
  out = subprocess.run([sys.executable, "-m", "t2mlr_jax.main", f"--config={S5_CONFIG}:tiny",
                        f"--workdir={wd}", "--progress=false", *RUN_FLAGS], cwd=REPO_ROOT,
                       capture_output=True, text=True, timeout=120)
  lines = [line for line in out.stderr.splitlines() if line.strip()]
  assert out.returncode == 2 and len(lines) == 1, out.stderr[-3000:]
  _assert_names_the_damage(lines[0][len("error: "):-len(" (--verbose for the traceback)")],
                           wd, "recoded")
  _assert_nothing_written(wd, files)


def test_a_step_saved_without_checksums_restores_unverified(trained, tmp_path, caplog):
  """Checkpoints saved before checksums were recorded: restored as before, logged."""
  wd = str(tmp_path / "wd")
  shutil.copytree(trained, wd)
  intact = checkpoint.load(wd)[1]
  shutil.rmtree(os.path.join(wd, "checkpoints", "2", checkpoint.CHECKSUMS))
  with caplog.at_level(logging.INFO, logger="absl"):
    _, params = checkpoint.load(wd)
  _same(params, intact)
  assert "checkpoint step 2 in " + wd + " was saved without checksums" in caplog.text


def test_checksums_cover_every_saved_array(run):
  """Each array of params and the train state is recorded by its tree path; a changed
  value is named by that path."""
  wd, _, states = run
  ckpt = Checkpointer(wd, read_only=True)
  try:
    records = ckpt.read_json(4, checkpoint.CHECKSUMS)["arrays"]
  finally:
    ckpt.close()
  train = {"step": states[4].step, "opt_state": states[4].opt_state,
           "nonfinite_step": states[4].nonfinite_step}
  n_arrays = len(jax.tree.leaves(states[4].params)) + len(jax.tree.leaves(train))
  assert len(records) == n_arrays and "train/opt_state/count" in records
  assert checkpoint.first_mismatch(records, states[4].params, "params") is None
  leaves, treedef = jax.tree.flatten(states[4].params)
  changed = jax.tree.unflatten(treedef, [leaves[0] + 1.0, *leaves[1:]])
  first = next(k for k in records if k.startswith("params/"))   # recorded in tree order
  assert checkpoint.first_mismatch(records, changed, "params") == first


def test_a_damaged_export_is_refused(tmp_path):
  cfg = tiny_cfg()
  params = init_params(cfg, jax.random.PRNGKey(0))
  path = str(tmp_path / "export")
  checkpoint.export(cfg, params, path)
  files = glob.glob(os.path.join(path, "params", "ocdbt.process_0", "d", "*"))
  target = max(files, key=os.path.getsize)
  with open(target, "r+b") as f:
    f.seek(os.path.getsize(target) // 2)
    byte = f.read(1)
    f.seek(-1, os.SEEK_CUR)
    f.write(bytes([byte[0] ^ 0x01]))
  with pytest.raises(checkpoint.DamagedCheckpointError,
                     match=rf"^parameter export {re.escape(path)} could not be read: array "
                           r"params/\S+ .*; export it again$"):
    checkpoint.load(path)
  os.remove(os.path.join(path, checkpoint.EXPORT_CHECKSUMS))   # an export from before
  checkpoint.load(path)


def test_a_nonfinite_loss_right_after_a_resume_suspects_the_restored_state():
  class Ckpt:
    def latest_step(self):
      return 40

    def all_steps(self):
      return [20, 40]
  state = TrainState(step=jnp.int32(41), params={}, opt_state={}, nonfinite_step=jnp.int32(40))
  with pytest.raises(loop.NonFiniteLossError, match=r"at step 41: .*the first step after "
                     r"resuming from step 40: the restored state may be at fault; try "
                     r"--config.train.resume_step=20"):
    loop._check_finite(state, Ckpt(), resumed=40)
  with pytest.raises(loop.NonFiniteLossError, match=r"at step 41: .*\(lower optimizer.lr"):
    loop._check_finite(state, Ckpt(), resumed=30)


# ------------------------------------------- TensorStore's failed reads after a failed restore

_CLOSED_LOOP_READS = """
import asyncio, sys
import numpy as np
import tensorstore as ts
from t2mlr_jax import checkpoint
if sys.argv[1] == "quiet":
  checkpoint.quiet_failed_reads()
arr = ts.open({"driver": "zarr", "kvstore": {"driver": "memory"}}, dtype=ts.float32,
              shape=[2000, 2000], create=True).result()
arr.write(np.ones((2000, 2000), np.float32)).result()
loop = asyncio.new_event_loop()
async def start_reads():   # reads bound to the loop, left pending as a failed restore leaves them
  [asyncio.ensure_future(arr.read()) for _ in range(16)]
  await asyncio.sleep(0)
loop.run_until_complete(start_reads())
loop.close()
import time; time.sleep(2)   # their callbacks arrive on TensorStore's threads, loop closed
async def failed_read():     # a read whose exception nobody retrieves: asyncio's logger says so
  raise Exception("Encountered error while reading array index: (slice(0, 3, 1),)")
async def leave_one():
  task = asyncio.ensure_future(failed_read())
  await asyncio.sleep(0.01)
  del task
other = asyncio.new_event_loop()
other.run_until_complete(leave_one())
import gc; gc.collect()
other.close()
class Dropped:
  def __del__(self):
    raise ValueError("kept")
Dropped()
"""


def test_reads_left_pending_by_a_failed_restore_print_nothing_after_the_error(tmp_path):
  """TensorStore reports callbacks into Orbax's closed event loop through
  sys.unraisablehook, and a read task nobody awaited through asyncio's logger; how many
  arrive before exit depends on timing (CI saw a page of them where this machine saw none),
  so they are made here on purpose."""
  script = tmp_path / "reads.py"
  script.write_text(_CLOSED_LOOP_READS)
  def run(how):
    # the script runs from tmp_path: this checkout's package first on its path
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (REPO_ROOT, os.environ.get("PYTHONPATH")) if p)}
    return subprocess.run([sys.executable, str(script), how], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=120, env=env).stderr
  loud = run("loud")
  assert "Event loop is closed" in loud                 # the noise exists without the hooks
  assert "Task exception was never retrieved" in loud
  quiet = run("quiet")
  assert "Event loop is closed" not in quiet, quiet[-2000:]
  assert "Encountered error while reading array" not in quiet, quiet[-2000:]
  assert "ValueError: kept" in quiet                   # other unraisable errors still print


def test_read_failure_names_the_array_and_tensorstores_reason():
  inner = ValueError('Error reading "layers.mlp.w/0.0" in OCDBT database at local file '
                     '"/wd/checkpoints/60/params/": DATA_LOSS: Error decoding; frame header')
  try:
    try:
      raise inner
    except ValueError as e:
      raise RuntimeError("restore failed") from e
  except RuntimeError as error:
    assert checkpoint.read_failure(error) == "array params/layers.mlp.w (DATA_LOSS: Error decoding)"


def test_read_failure_without_a_named_array_is_the_innermost_message_on_one_line():
  error = RuntimeError("restore failed")
  error.__context__ = OSError("disk\n   gone")
  assert checkpoint.read_failure(error) == "disk gone"
  assert checkpoint.read_failure(ValueError("x" * 400)) == "x" * 300
