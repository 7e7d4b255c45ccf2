"""Train state, sharded initialisation, the jit-compiled train step, eval logits.

The train step runs the model's training mode (T2MLR: `jacobi`; LRT: `interleaved`,
`chunked` or `multi_refine`; `parallel` for baselines) through `t2mlr_jax.loss`
(negative labels are not supervised), skips the update and raises a sticky flag when
the loss or gradient is not finite, and returns metrics: loss, grad norm, LR, supervised
tokens; T2MLR: γ values, gate means, the Jacobi residual and the sweeps run; LRT: the
per-pass losses and, per layer, α / β / γ and the mean local / fb / ve gates.
"""

from __future__ import annotations

from typing import Any, Optional

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


def recurrence_metrics(params, cfg: AnyModelConfig) -> dict:
  """The recurrence's learned scalars: T2MLR's γ_rec / γ_cur; LRT's per-layer α (resid),
  β (x0) and γ (memory) as [L] vectors (the backbone's α/β when it has them)."""
  if not isinstance(cfg, ModelConfig) or cfg.recurrence is None:
    return {}
  rec = params.get("recurrence") or {}
  if "gamma_rec" in rec:
    return {"gamma_rec": rec["gamma_rec"], "gamma_cur": rec["gamma_cur"]}
  layers, out = params["layers"], {}
  for name, key in (("alpha", "resid_lambda"), ("beta", "x0_lambda")):
    if key in layers:
      out[name] = layers[key]
  if "gamma" in layers.get("memory", {}):
    out["gamma"] = layers["memory"]["gamma"]
  return out


def _schedule_metrics(aux: dict) -> dict:
  """Scalar-or-vector metrics from a training schedule's aux: per-pass losses and the
  mean local / fb / ve gates per layer ([L] each); bulky arrays (h_final) dropped."""
  aux = dict(aux)
  aux.pop("h_final", None)
  gates = aux.pop("gate_means", None)
  if gates is not None:
    aux.update(gate_local=gates[:, 0], gate_fb=gates[:, 1], gate_ve=gates[:, 2])
  return aux


def make_train_step(cfg: AnyModelConfig, tx, schedule, mode: str, mesh,
                    loss_chunk: Optional[int] = None):
  """jit(state, batch) -> (state, metrics); the state buffer is donated. loss_chunk: the
  LM head and CE a chunk of positions at a time (see `model.api.loss`)."""

  def loss_fn(params, batch):
    value, aux = model_loss(
        params, cfg, batch["input_ids"], mode=mode, targets=batch["target_ids"],
        control_flow=batch.get("control_flow"), positions=batch.get("positions"),
        segment_ids=batch.get("segment_ids"), return_aux=True, loss_chunk=loss_chunk)
    count = aux.pop("supervised_tokens")
    return value, (_schedule_metrics(aux), count)

  def step(state: TrainState, batch):
    # the mesh's axes visible to the model's activation constraints (sharding.constrain_batch)
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
      (loss, (aux, count)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params,
                                                                               batch)
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
               "supervised_tokens": count, **aux, **recurrence_metrics(state.params, cfg)}
    return new_state, metrics

  shardings = state_shardings(cfg, tx, mesh)
  return jax.jit(step, in_shardings=(shardings, sharding.batch_sharding(mesh)),
                 out_shardings=(shardings, None), donate_argnums=0)
