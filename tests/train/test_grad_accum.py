"""Gradient accumulation (train.grad_accum_steps): k microbatches in one jitted step equal
the one-shot step to fp32 rounding, for the parallel, Jacobi and interleaved schedules;
bad batch layouts are named; a run may change k on resume. (Jacobi, interleaved and the
resume run in the slow step, for the default suite's time.)"""

import jax
import numpy as np
import optax
import pytest

import t2mlr_jax
from t2mlr_jax import LRTConfig, ModelConfig, T2MLRConfig, sharding
from t2mlr_jax.train.config import base_config
from t2mlr_jax.train.optimizer import make_optimizer
from t2mlr_jax.train.step import check_batch, create_state, make_train_step

from _util import random_tokens

T2MLR = ModelConfig(vocab_size=40, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, d_ff=64,
                    max_seq_len=32, recurrence=T2MLRConfig(l_start=1, l_end=1),
                    schedule_options=dict(d_forward=4, d_backward=2))
LRT = ModelConfig(vocab_size=40, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64,
                  max_seq_len=32, recurrence=LRTConfig(source_layer=-1, gate_channels=16),
                  schedule_options=dict(passes=2))
PLAIN = T2MLR.replace(recurrence=None)


def _batch(cfg, B=8, T=16, seed=0):
  """A batch with uneven supervision per row (so the token weighting matters)."""
  tokens = random_tokens(cfg, B, T, seed=seed)
  targets = np.roll(tokens, -1, axis=1).astype(np.int32)
  rng = np.random.default_rng(seed)
  for b in range(B):                       # row b: its last few positions unsupervised
    targets[b, T - int(rng.integers(0, T // 2)):] = -100
  return {"input_ids": tokens, "target_ids": targets,
          "control_flow": np.full(tokens.shape, 2, np.int32)}


def _run(cfg, mode, k, mesh, steps=2):
  oc = base_config().optimizer
  oc.update(lr=1e-2, eps=1e-3)
  tx, schedule = make_optimizer(oc, 10)
  state = create_state(cfg, tx, jax.random.PRNGKey(0), mesh)
  step = make_train_step(cfg, tx, schedule, mode, mesh, grad_accum_steps=k)
  losses, metrics = [], None
  for i in range(steps):
    batch = {key: jax.device_put(v, sharding.batch_sharding(mesh))
             for key, v in _batch(cfg, seed=i).items()}
    state, metrics = step(state, batch)
    losses.append(float(metrics["loss"]))
  return losses, jax.device_get(state.params), jax.device_get(metrics)


@pytest.mark.parametrize("cfg,mode,ks", [
    (PLAIN, "parallel", (2, 4)),
    pytest.param(T2MLR, "jacobi", (4,), marks=pytest.mark.slow),      # (the suite's budget)
    pytest.param(LRT, "interleaved", (4,), marks=pytest.mark.slow)],
    ids=["parallel", "jacobi", "interleaved"])
def test_accumulated_step_equals_the_one_shot_step(cfg, mode, ks):
  mesh = sharding.make_mesh({"data": 2}, devices=jax.devices()[:2])
  one_loss, one_params, one_metrics = _run(cfg, mode, 1, mesh)
  for k in ks:
    loss, params, metrics = _run(cfg, mode, k, mesh)
    np.testing.assert_allclose(loss, one_loss, rtol=2e-6)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(one_params)):
      np.testing.assert_allclose(a, b, atol=2e-6, rtol=0)
    assert int(metrics["supervised_tokens"]) == int(one_metrics["supervised_tokens"])
    if mode == "interleaved":   # each pass's mean over the whole batch
      np.testing.assert_allclose(metrics["per_pass_losses"], one_metrics["per_pass_losses"],
                                 rtol=2e-6)
    if mode == "jacobi":        # the most sweeps any microbatch ran
      assert int(metrics["jacobi_sweeps"]) == int(one_metrics["jacobi_sweeps"])


def test_microbatch_averaging_is_the_mean_of_the_microbatches_means():
  """train.grad_accum_average="microbatches" (nanochat's, the LRT release's): the loss and
  gradient are the mean of each microbatch's own token mean; with uneven supervision they
  differ from the default token-weighted one-shot step."""
  mesh = sharding.make_mesh({"data": 1}, devices=jax.devices()[:1])
  tx = optax.sgd(1.0)
  state = create_state(PLAIN, tx, jax.random.PRNGKey(0), mesh)
  batch = _batch(PLAIN, B=4)
  halves = [{k: v[i::2] for k, v in batch.items()} for i in range(2)]   # rows j, j+k, ...

  def mean_loss(params, b):
    return t2mlr_jax.loss(params, PLAIN, b["input_ids"], mode="parallel",
                          targets=b["target_ids"])
  want = np.mean([float(mean_loss(state.params, h)) for h in halves])
  want_grad = jax.tree.map(lambda a, b: (a + b) / 2,
                           *[jax.grad(mean_loss)(state.params, h) for h in halves])
  token_mean = float(mean_loss(state.params, batch))
  assert abs(token_mean - want) > 1e-4        # rows supervise unevenly (fp32 noise: 1e-6)
  before = jax.device_get(state.params)
  step = make_train_step(PLAIN, tx, lambda s: 0.0, "parallel", mesh, grad_accum_steps=2,
                         grad_accum_average="microbatches")
  new, metrics = step(state, batch)           # (the state is donated)
  np.testing.assert_allclose(float(metrics["loss"]), want, rtol=1e-6)
  for p0, p1, g in zip(*(jax.tree.leaves(t) for t in (before, new.params, want_grad))):
    np.testing.assert_allclose(np.asarray(p0) - np.asarray(p1), g, atol=1e-6)
  with pytest.raises(ValueError, match=r"train.grad_accum_average='sum' is invalid: allowed "
                     r"one of \('tokens', 'microbatches'\)"):
    make_train_step(PLAIN, tx, lambda s: 0.0, "parallel", mesh, grad_accum_average="sum")


def test_batch_layouts_accumulation_cannot_split_are_named():
  mesh = sharding.make_mesh({"data": 4}, devices=jax.devices()[:4])
  check_batch(16, 2, mesh)
  with pytest.raises(ValueError, match=r"train.batch_size=18 is invalid with "
                     r"train.grad_accum_steps=4: allowed multiples of 4"):
    check_batch(18, 4, mesh)
  with pytest.raises(ValueError, match=r"microbatch train.batch_size / train.grad_accum_steps "
                     r"= 2 is invalid: allowed multiples of mesh data\*fsdp=4"):
    check_batch(8, 4, mesh)
  with pytest.raises(ValueError, match=r"train.grad_accum_steps=0 is invalid"):
    check_batch(8, 0, mesh)


@pytest.mark.slow
def test_resume_with_another_grad_accum_steps_goes_on(tmp_path):
  """k may change on resume (RESUME_MUTABLE); the run continues from the saved step."""
  from t2mlr_jax.train.loop import train
  from train.test_loop import tiny_config
  c = tiny_config(num_steps=4, batch_size=16, stop_after_steps=2, checkpoint_every=2,
                  eval_every=4)
  train(c, str(tmp_path), progress=False)
  c = tiny_config(num_steps=4, batch_size=16, checkpoint_every=2, eval_every=4,
                  grad_accum_steps=2)
  last = train(c, str(tmp_path), progress=False)
  assert np.isfinite(last["loss"])
  from t2mlr_jax.checkpoint import Checkpointer
  assert Checkpointer(str(tmp_path)).latest_step() == 4
