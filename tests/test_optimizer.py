"""Optimizer: schedule shape, weight-decay mask, the recurrence LR multiplier."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2mlr_jax import init_params
from t2mlr_jax.train.config import base_config
from t2mlr_jax.train.optimizer import decay_mask, make_optimizer, make_schedule
from _util import tiny_cfg


def _opt(**kw):
  oc = base_config().optimizer
  oc.update(**kw)
  return oc


def test_schedule_warmup_then_cosine_to_min():
  sched = make_schedule(_opt(lr=1e-3, warmup_frac=0.1, min_lr_frac=0.01), 100)
  assert float(sched(0)) == 0.0
  assert float(sched(10)) == pytest.approx(1e-3)
  assert float(sched(5)) == pytest.approx(5e-4)
  assert float(sched(100)) == pytest.approx(1e-5)
  assert float(sched(55)) == pytest.approx(1e-5 + (1e-3 - 1e-5) * 0.5, rel=1e-3)


def test_decay_mask():
  params = init_params(tiny_cfg(), jax.random.PRNGKey(0))
  mask = decay_mask(params)
  assert mask["layers"]["mlp"]["up"]["kernel"] and mask["embed"]["embedding"]
  assert mask["recurrence"]["w_rec"]["kernel"]
  assert not mask["recurrence"]["gamma_rec"] and not mask["recurrence"]["gamma_cur"]
  assert not mask["recurrence"]["f_rec"]["bias"] and not mask["layers"]["attn_norm"]["scale"]
  assert not mask["final_norm"]["scale"]


def test_recurrence_lr_multiplier():
  params = init_params(tiny_cfg(), jax.random.PRNGKey(0))
  grads = jax.tree.map(lambda p: jnp.full_like(p, 0.1), params)
  updates = {}
  for mult in (1.0, 100.0):
    tx, _ = make_optimizer(_opt(lr=1e-3, warmup_frac=0.0, weight_decay=0.0, grad_clip=0.0,
                                recurrence_lr_mult=mult), 10)
    updates[mult], _ = tx.update(grads, tx.init(params), params)
  ratio = updates[100.0]["recurrence"]["w_rec"]["kernel"] / updates[1.0]["recurrence"]["w_rec"]["kernel"]
  np.testing.assert_allclose(ratio, 100.0, rtol=1e-5)
  np.testing.assert_array_equal(updates[100.0]["layers"]["mlp"]["up"]["kernel"],
                                updates[1.0]["layers"]["mlp"]["up"]["kernel"])


def test_gamma_gets_no_weight_decay():
  params = init_params(tiny_cfg(), jax.random.PRNGKey(0))
  params["recurrence"]["gamma_rec"] = jnp.float32(0.5)
  zero = jax.tree.map(jnp.zeros_like, params)
  tx, _ = make_optimizer(_opt(lr=1e-2, warmup_frac=0.0, weight_decay=0.5), 10)
  upd, _ = tx.update(zero, tx.init(params), params)
  assert float(upd["recurrence"]["gamma_rec"]) == 0.0
  assert float(jnp.abs(upd["recurrence"]["w_rec"]["kernel"]).max()) > 0
