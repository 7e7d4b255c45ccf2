"""LRT in the trainer: the interleaved train step learns, resumes bit-identically, logs
its per-pass losses, per-layer scalars and gates, and evaluates exact beside parallel."""

import os
import sys

import jax
import numpy as np
import pytest

from t2mlr_jax import checkpoint
from t2mlr_jax.checkpoint import Checkpointer
from t2mlr_jax.train import config as config_lib, loop
from t2mlr_jax.train.metrics import read_metrics

from _util import REPO_ROOT

ROOT = REPO_ROOT
sys.path.insert(0, os.path.join(ROOT, "configs"))
import s5_retrieval  # noqa: E402
import s5_retrieval_lrt  # noqa: E402

STEPS = 16


def lrt_config(**train):
  c = s5_retrieval_lrt.get_config("tiny")
  c.train.update(num_steps=STEPS, eval_every=STEPS, checkpoint_every=STEPS, log_every=1,
                 **train)
  return c


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  wd = str(tmp_path_factory.mktemp("lrt_reference"))
  loop.train(lrt_config(), wd, progress=False)
  return wd


def test_auto_mode_is_interleaved_for_lrt():
  c = lrt_config()
  assert config_lib.train_mode(c, config_lib.validate(c)) == "interleaved"
  c.train.mode = "multi_refine"
  assert config_lib.train_mode(c, config_lib.validate(c)) == "multi_refine"


@pytest.mark.slow       # an LRT training run; slow step
def test_interleaved_training_lowers_the_loss_and_logs_its_metrics(reference):
  records = read_metrics(reference)
  losses = [r["loss"] for r in records]
  assert len(losses) == STEPS
  assert np.mean(losses[-4:]) < np.mean(losses[:4]) - 0.1
  last = records[-1]
  L = 3
  assert len(last["per_pass_losses"]) == 3                  # pass 0 + S = 2
  for name in ("gamma", "gate_local", "gate_fb", "gate_ve"):
    assert len(last[name]) == L, name
  assert all(g != 0.1 for g in last["gamma"])               # γ learned from its 0.1 init
  final = read_metrics(reference, "eval")[-1]
  assert {"loss", "seq_acc", "parallel"} <= set(final)
  assert set(final["parallel"]["seq_acc_by_length"]) == {"2", "6"}
  assert final["loss"] != final["parallel"]["loss"]        # the memory changes the numbers


@pytest.mark.slow       # T2MLR's resume test runs by default
def test_interleaved_training_resumes_bit_identically(reference, tmp_path):
  wd = str(tmp_path)
  loop.train(lrt_config(stop_after_steps=STEPS // 2), wd, progress=False)
  assert Checkpointer(wd).all_steps() == [STEPS // 2]
  loop.train(lrt_config(), wd, progress=False)
  assert [r["loss"] for r in read_metrics(wd)] == [r["loss"] for r in read_metrics(reference)]
  for a, b in zip(jax.tree.leaves(checkpoint.load(wd)[1]),
                  jax.tree.leaves(checkpoint.load(reference)[1])):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  cfg, _ = checkpoint.load(wd)
  assert cfg.recurrence.type == "lrt" and cfg.schedule_options.passes == 2


@pytest.mark.parametrize("edit,match", [
    (lambda c: c.train.update(mode="sweeps"), r"train.mode='sweeps' is invalid: allowed "
     r"one of \('auto', 'parallel', 'exact', 'jacobi', 'interleaved', 'chunked', "
     r"'multi_refine'\)"),
    (lambda c: c.model.schedule_options.update(passes=99),
     r"model.schedule_options.passes=99 is invalid"),
    (lambda c: c.model.recurrence.update(projection="tied"), r"recurrence.projection='tied'"),
])
def test_bad_lrt_config_is_a_clear_error(edit, match):
  c = lrt_config()
  edit(c)
  with pytest.raises(ValueError, match=match):
    config_lib.validate(c)


def test_switching_type_without_its_fields_names_them():
  c = s5_retrieval.get_config("tiny")
  c.model.recurrence.type = "lrt"
  with pytest.raises(ValueError, match=r"recurrence.cache_norm is a t2mlr option.*"
                     r"recurrence_config\(type\)"):
    config_lib.validate(c)
  c.model.recurrence = config_lib.recurrence_config("lrt", projection="shared")
  assert config_lib.validate(c).recurrence.projection == "shared"
  with pytest.raises(ValueError, match=r"model.recurrence.l_start=1 is invalid: allowed a "
                     "field of lrt"):
    config_lib.recurrence_config("lrt", l_start=1)


@pytest.mark.parametrize("variant,depth,width", [("d20", 20, 1280), ("d12", 12, 768)])
def test_lrt_nanochat_configs_hold_the_release_recipe(variant, depth, width):
  import lrt_nanochat
  c = lrt_nanochat.get_config(variant)
  cfg = config_lib.validate(c)
  assert (cfg.n_layers, cfg.d_model, cfg.padded_vocab) == (depth, width, 32768)
  assert cfg.recurrence.type == "lrt" and cfg.value_embeds is None and cfg.qk_norm
  assert config_lib.train_mode(c, cfg) == "interleaved" and c.optimizer.name == "muon"
  tokens = c.train.num_steps * c.train.batch_size * c.train.seq_len
  assert tokens / lrt_nanochat.scaling_params(cfg) == pytest.approx(10, rel=1e-3)
  with pytest.raises(ValueError, match="allowed one of"):
    lrt_nanochat.get_config("d30")
