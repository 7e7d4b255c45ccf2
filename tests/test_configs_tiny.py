"""Every config's `tiny` variant runs as it is: its data is generated on the fly, or what it
reads from disk is what `python -m t2mlr_jax.data.tiny` makes (main makes it itself)."""

import glob
import importlib.util
import os

import pytest

from t2mlr_jax.data import tiny
from t2mlr_jax.train import config as config_lib, tasks

from _util import REPO_ROOT

CONFIGS = sorted(glob.glob(os.path.join(REPO_ROOT, "configs", "*.py")))


def _get_config(path: str, variant: str):
  spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(variant)


@pytest.fixture(scope="module")
def made(tmp_path_factory):
  """data/tiny made once, in a folder of its own (the configs' paths are relative)."""
  root = tmp_path_factory.mktemp("clone")
  here = os.getcwd()
  os.chdir(root)
  try:
    assert sorted(tiny.make()) == sorted(os.path.join(tiny.ROOT, p) for p in tiny.PARTS)
    assert tiny.make() == []            # a second call makes nothing
  finally:
    os.chdir(here)
  return root


def test_every_config_has_a_tiny_variant():
  assert len(CONFIGS) >= 11
  for path in CONFIGS:
    assert _get_config(path, "tiny").train.num_steps <= 10, path


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: os.path.basename(p)[:-3])
def test_a_tiny_variant_builds_its_data_and_validates(path, made, monkeypatch):
  """The checks main's training runs before compiling (the task's data source, the config,
  every example fitting seq_len) pass, and the first training example builds."""
  monkeypatch.chdir(made)
  config = _get_config(path, "tiny")
  for field in tiny.FIELDS:           # a path it names exists once data/tiny is made
    group, name = field.split(".")
    value = config[group].get(name)
    assert not value or os.path.exists(value), (field, value)
  assert tiny.missing(config) == []
  task = tasks.get_task(config)
  tasks.check_source(config, task)
  config_lib.validate(config)
  tasks.validate_data(config, task)
  assert len(task.train_source(config, config.train.batch_size)[0]["input_ids"]) > 0


def test_missing_tiny_inputs_are_named_and_the_command_exists(tmp_path, monkeypatch):
  """Without data/tiny a config names what it lacks; the command that makes it exists."""
  monkeypatch.chdir(tmp_path)
  lm = _get_config(os.path.join(REPO_ROOT, "configs", "lm_gutenberg.py"), "tiny")
  retrofit = _get_config(os.path.join(REPO_ROOT, "configs", "retrofit_smollm2_135m_va.py"),
                         "tiny")
  assert tiny.missing(lm) == ["data.path"]
  assert tiny.missing(retrofit) == ["data.path", "model.init_from"]
  assert tiny.COMMAND == f"python -m {tiny.__name__}" and callable(tiny.main)
