"""Train state, sharded initialisation, the jit-compiled train step, eval logits.

The train step runs the model's training schedule (any of `jacobi`, `interleaved`,
`chunked`, `multi_refine` for either recurrence type, by default T2MLR's `jacobi` and
LRT's `interleaved`; `parallel` for baselines) through `t2mlr_jax.loss` (negative labels
are not supervised), skips the update and raises a sticky flag when the loss or gradient
is not finite, and returns metrics: loss, grad norm, LR, supervised tokens; the type's
learned scalars (T2MLR: γ values; LRT: per layer α / β / γ) and the schedule's metrics
(Jacobi: the residual and the sweeps run; the refinement schedules: the per-pass losses;
T2MLR's gate means, LRT's mean local / fb / ve gates per layer).
"""

from __future__ import annotations

from typing import Any, Optional

import flax.struct
import jax
import jax.numpy as jnp
import optax

from t2mlr_jax import sharding
from t2mlr_jax.model import recurrence
from t2mlr_jax.model.api import AnyModelConfig, init_model, loss as model_loss, loss_token_totals
from t2mlr_jax.registry import family_of
from t2mlr_jax.train.config import GRAD_ACCUM_AVERAGES


class TrainState(flax.struct.PyTreeNode):
  step: jnp.ndarray           # int32 scalar: updates applied
  params: Any
  opt_state: Any
  nonfinite_step: jnp.ndarray  # int32: first step whose loss/grad was not finite, -1 if none


def abstract_state(cfg: AnyModelConfig, tx, rng=None):
  """The train state's shapes and dtypes (`jax.eval_shape`: nothing is allocated)."""
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
  """NamedShardings of every train-state leaf over `mesh` (the partition-spec table)."""
  return sharding.tree_shardings(abstract_state(cfg, tx), mesh, cfg)


def recurrence_metrics(params, cfg: AnyModelConfig) -> dict:
  """The recurrence's learned scalars: T2MLR's γ_rec / γ_cur; LRT's per-layer α (resid),
  β (x0) and γ (memory) as [L] vectors (the backbone's α/β when it has them)."""
  if getattr(cfg, "recurrence", None) is None:
    return {}
  return recurrence.of(cfg).scalars(params, cfg)


def schedule_metrics(aux: dict) -> dict:
  """Scalar-or-vector metrics from a training schedule's aux: per-pass losses and the
  mean local / fb / ve gates per layer ([L] each); bulky arrays (h_final) dropped."""
  aux = dict(aux)
  aux.pop("h_final", None)
  gates = aux.pop("gate_means", None)
  if gates is not None:
    aux.update(gate_local=gates[:, 0], gate_fb=gates[:, 1], gate_ve=gates[:, 2])
  return aux


# How each metric of a schedule's aux is reduced over the microbatches of one step under
# gradient accumulation: the losses are token-weighted over the whole batch (each
# microbatch's is divided by the whole batch's counts, so they add up), the sweeps run and
# the Jacobi residual are the largest any microbatch saw, the rest (gate means) the mean.
ACCUM_SUM = ("per_pass_losses",)
ACCUM_MAX = ("jacobi_residual", "jacobi_sweeps")


def check_batch(batch_size: int, grad_accum_steps: int, mesh) -> None:
  """Refuse a global batch the accumulation steps or the mesh's batch axes do not divide,
  naming the fields."""
  k = grad_accum_steps
  if isinstance(k, bool) or not isinstance(k, int) or k < 1:
    raise ValueError(f"config field train.grad_accum_steps={k!r} is invalid: allowed an "
                     "integer >= 1 (microbatches per optimizer step)")
  if batch_size % k:
    raise ValueError(f"config field train.batch_size={batch_size} is invalid with "
                     f"train.grad_accum_steps={k}: allowed multiples of {k}")
  n = sharding.batch_divisor(mesh)
  if (batch_size // k) % n:
    what = (f"the microbatch train.batch_size / train.grad_accum_steps = {batch_size // k}"
            if k > 1 else f"train.batch_size={batch_size}")
    raise ValueError(f"config field {what} is invalid: allowed multiples of mesh "
                     f"data*fsdp={n} (each microbatch is split over the batch axes)")


def _microbatches(batch: dict, k: int) -> dict:
  """[B, ...] -> [k, B/k, ...] with microbatch j = rows j, j+k, j+2k, ...: each device's
  contiguous block of rows holds B/(k·n) rows of every microbatch, so splitting moves no
  data between devices."""
  def split(a):
    a = a.reshape(a.shape[0] // k, k, *a.shape[1:])
    return jnp.swapaxes(a, 0, 1)
  return jax.tree.map(split, batch)


def _reduce_aux(aux: dict) -> dict:
  """Per-microbatch aux [k, ...] -> one step's (ACCUM_SUM / ACCUM_MAX / mean)."""
  out = {}
  for key, v in aux.items():
    if key in ACCUM_SUM:
      out[key] = jnp.sum(v, axis=0)
    elif key in ACCUM_MAX:
      out[key] = jnp.max(v, axis=0)
    else:
      out[key] = jnp.mean(v.astype(jnp.float32), axis=0)
  return out


def at_step(params, cfg: AnyModelConfig, step, num_steps: Optional[int]):
  """The parameters a step trains with: the recurrence type's per-step leaves set
  (`RecurrenceType.at_step`: T2MLR's recurrent_weight curriculum), else as they are."""
  hook = (recurrence.of(cfg).at_step if getattr(cfg, "recurrence", None) is not None
          else None)
  return params if hook is None else hook(params, cfg, step, num_steps)


def apply_update(state: TrainState, now, grads, loss, tx, advance=True):
  """(new state, grad norm): the optimizer's update of `now` (the step's parameters), or
  the state unchanged with the sticky flag set at the first non-finite loss or gradient;
  the step count moves on when `advance` (RL moves it once per batch of updates)."""
  grad_norm = optax.tree.norm(grads)
  updates, opt_state = tx.update(grads, state.opt_state, now)
  params = optax.apply_updates(now, updates)
  ok = jnp.isfinite(loss) & jnp.isfinite(grad_norm) & (state.nonfinite_step < 0)
  keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(ok, a, b), new, old)
  return TrainState(
      step=jnp.where(ok & advance, state.step + 1, state.step),
      params=keep(params, state.params), opt_state=keep(opt_state, state.opt_state),
      nonfinite_step=jnp.where(ok | (state.nonfinite_step >= 0), state.nonfinite_step,
                               state.step)), grad_norm


def make_train_step(cfg: AnyModelConfig, tx, schedule, mode: str, mesh,
                    loss_chunk: Optional[int] = None, grad_accum_steps: int = 1,
                    num_steps: Optional[int] = None, grad_accum_average: str = "tokens"):
  """jit(state, batch) -> (state, metrics); the state buffer is donated. loss_chunk: the
  LM head and CE a chunk of positions at a time (see `model.api.loss`). grad_accum_steps
  k > 1: the batch runs as k microbatches in a `lax.scan`, their fp32 gradients summed
  into one update. grad_accum_average "tokens": the loss keeps its meaning
  (token-weighted over the whole batch; for LRT each pass's mean over the whole batch,
  then its weighting), so the update equals the one-shot step's to fp32 rounding (with a
  Jacobi tolerance each microbatch stops on its own); "microbatches": the mean of the
  microbatches' own losses (nanochat's and the LRT release's accumulation; the same when
  every microbatch supervises as many tokens). The attention kernel is resolved for the
  mesh's devices here, once. num_steps: the run's length, for leaves set per step
  (`at_step`)."""
  cfg = family_of(cfg).for_devices(cfg, mesh.devices.flat)
  k = grad_accum_steps
  if grad_accum_average not in GRAD_ACCUM_AVERAGES:
    raise ValueError(f"train.grad_accum_average={grad_accum_average!r} is invalid: allowed "
                     f"one of {GRAD_ACCUM_AVERAGES}")
  per_micro = grad_accum_average == "microbatches"

  def loss_fn(params, batch, totals=None):
    value, aux = model_loss(
        params, cfg, batch["input_ids"], mode=mode, targets=batch["target_ids"],
        control_flow=batch.get("control_flow"), positions=batch.get("positions"),
        segment_ids=batch.get("segment_ids"), return_aux=True, loss_chunk=loss_chunk,
        token_totals=totals)
    count = aux.pop("supervised_tokens")
    return value, (schedule_metrics(aux), count)

  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

  def accumulated(params, batch):
    # per_micro: each microbatch's loss its own mean (token_totals None), averaged below
    totals = None if per_micro else loss_token_totals(cfg, mode, batch["target_ids"])

    def body(carry, micro):
      micro = jax.tree.map(sharding.constrain_batch, micro)
      (loss, (aux, count)), grads = grad_fn(params, micro, totals)
      g_sum, l_sum, c_sum = carry
      g_sum = jax.tree.map(lambda a, g: a + g.astype(jnp.float32), g_sum, grads)
      return (g_sum, l_sum + loss, c_sum + count), aux

    zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
    init = (zeros, jnp.zeros((), jnp.float32), jnp.zeros((), jnp.int32))
    (grads, loss, count), auxs = jax.lax.scan(body, init, _microbatches(batch, k))
    aux = _reduce_aux(auxs)
    if per_micro:
      grads, loss = jax.tree.map(lambda g: g / k, grads), loss / k
      aux = {key: v / k if key in ACCUM_SUM else v for key, v in aux.items()}
    grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, params)
    return (loss, (aux, count)), grads

  def step(state: TrainState, batch):
    now = at_step(state.params, cfg, state.step, num_steps)
    # the mesh's axes (and devices' kind) visible to the model's activation constraints
    # (sharding.constrain_batch) and kernel choice (kernels.target)
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
      if k == 1:
        (loss, (aux, count)), grads = grad_fn(now, batch)
      else:
        (loss, (aux, count)), grads = accumulated(now, batch)
    new_state, grad_norm = apply_update(state, now, grads, loss, tx)
    metrics = {"loss": loss, "grad_norm": grad_norm, "lr": schedule(state.step),
               "supervised_tokens": count, **aux, **recurrence_metrics(now, cfg)}
    return new_state, metrics

  shardings = state_shardings(cfg, tx, mesh)
  return jax.jit(step, in_shardings=(shardings, sharding.batch_sharding(mesh)),
                 out_shardings=(shardings, None), donate_argnums=0)
