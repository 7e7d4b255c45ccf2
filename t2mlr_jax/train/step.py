"""Train state, sharded initialisation, the jit-compiled train step, eval logits.

The train step runs the `jacobi` mode for T2MLR models (`parallel` for
baselines) through `t2mlr_jax.loss` (negative labels are not supervised), skips the update
and raises a sticky flag when the loss or gradient is not finite, and returns
metrics: loss, grad norm, LR, supervised tokens, γ values, gate means, the
Jacobi residual and the sweeps run.
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax

from t2mlr_jax import sharding
from t2mlr_jax.config import ModelConfig
from t2mlr_jax.model.api import AnyModelConfig, init_model, loss as model_loss

class TrainState(flax.struct.PyTreeNode):
  step: jnp.ndarray           # int32 scalar: updates applied
  params: Any
  opt_state: Any
  nonfinite_step: jnp.ndarray  # int32: first step whose loss/grad was not finite, -1 if none


def abstract_state(cfg: AnyModelConfig, tx, rng=None):
  rng = jax.random.PRNGKey(0) if rng is None else rng
  return jax.eval_shape(lambda r: _fresh_state(cfg, tx, r), rng)


def _fresh_state(cfg, tx, rng):
  params = init_model(cfg, rng)
  return TrainState(jnp.int32(0), params, tx.init(params), jnp.int32(-1))


def create_state(cfg: AnyModelConfig, tx, rng, mesh):
  """A fresh train state created directly in its sharded layout."""
  shardings = state_shardings(cfg, tx, mesh)
  return jax.jit(lambda r: _fresh_state(cfg, tx, r), out_shardings=shardings)(rng)


def state_shardings(cfg: AnyModelConfig, tx, mesh):
  model_cfg = cfg if isinstance(cfg, ModelConfig) else None
  return sharding.tree_shardings(abstract_state(cfg, tx), mesh, model_cfg)


def _gamma_metrics(params):
  rec = params.get("recurrence") if isinstance(params, dict) else None
  if not rec or "gamma_rec" not in rec:      # T2MLR's γ only
    return {}
  return {"gamma_rec": rec["gamma_rec"], "gamma_cur": rec["gamma_cur"]}


def make_train_step(cfg: AnyModelConfig, tx, schedule, mode: str, mesh):
  """jit(state, batch) -> (state, metrics); the state buffer is donated."""

  def loss_fn(params, batch):
    value, aux = model_loss(
        params, cfg, batch["input_ids"], mode=mode, targets=batch["target_ids"],
        control_flow=batch.get("control_flow"), positions=batch.get("positions"),
        segment_ids=batch.get("segment_ids"), return_aux=True)
    count = aux.pop("supervised_tokens")
    return value, (aux, count)

  def step(state: TrainState, batch):
    (loss, (aux, count)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, batch)
    grad_norm = optax.tree.norm(grads)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    ok = jnp.isfinite(loss) & jnp.isfinite(grad_norm) & (state.nonfinite_step < 0)
    keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(ok, a, b), new, old)
    new_state = TrainState(
        step=jnp.where(ok, state.step + 1, state.step),
        params=keep(params, state.params), opt_state=keep(opt_state, state.opt_state),
        nonfinite_step=jnp.where(ok | (state.nonfinite_step >= 0), state.nonfinite_step,
                                 state.step))
    metrics = {"loss": loss, "grad_norm": grad_norm, "lr": schedule(state.step),
               "supervised_tokens": count, **aux, **_gamma_metrics(state.params)}
    return new_state, metrics

  shardings = state_shardings(cfg, tx, mesh)
  return jax.jit(step, in_shardings=(shardings, sharding.batch_sharding(mesh)),
                 out_shardings=(shardings, None), donate_argnums=0)
