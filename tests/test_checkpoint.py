"""Checkpoints (t2mlr_jax/checkpoint.py): a run's steps saved and restored by the
`Checkpointer`, the public loader (`load`, `load_config`) of run steps and parameter
exports (`export`), the steps kept aside on a resume from an earlier one, and the errors
that say which step, file or module is missing."""

import os
import subprocess
import sys

import grain
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from model.test_recurrence_lrt import active, lrt_cfg

from t2mlr_jax import checkpoint, init_params
from t2mlr_jax.checkpoint import Checkpointer
from t2mlr_jax.train.step import TrainState

from _util import tiny_cfg


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
