"""Evaluation loop: exact-recurrence logits over fixed batches, loss and task metrics."""

from __future__ import annotations

import contextlib
import functools
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

from t2mlr_jax.data.pipeline import OPTIONAL_PAD_VALUES, PAD_VALUES
from t2mlr_jax.losses import token_nll
from t2mlr_jax.model.api import AnyModelConfig, apply_model
from t2mlr_jax.model.kernels import for_devices
from t2mlr_jax.sharding import shard_eval_batch


@functools.partial(jax.jit, static_argnames=("cfg", "mode"))
def _eval_batch(params, batch, cfg, mode):
  """Greedy predictions, summed NLL and supervised-token count of one batch."""
  logits = apply_model(params, cfg, batch, mode)[0]
  nll, valid = token_nll(logits, batch["target_ids"])
  return jnp.argmax(logits, -1), jnp.sum(nll), jnp.sum(valid)


def for_mesh(cfg, mesh):
  """cfg with its attention kernel resolved for the mesh's devices (unchanged without a
  mesh, or for the LSTM)."""
  return cfg if mesh is None else for_devices(cfg, mesh.devices.flat)


def mesh_context(mesh):
  """The mesh's abstract form in context while a step traces (its batch axes for the
  activation constraints, its devices' kind for the kernels); nothing without a mesh."""
  return (contextlib.nullcontext() if mesh is None
          else jax.sharding.use_abstract_mesh(mesh.abstract_mesh))


def to_host(x) -> np.ndarray:
  """x as a NumPy array on every process, also when it is sharded over devices of other
  processes (a multi-host run): gathered with multihost_utils then."""
  if getattr(x, "is_fully_addressable", True):
    return np.asarray(x)
  return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def evaluate(params, cfg: AnyModelConfig, batches, metrics_factory, mode: str = "exact",
             mesh=None) -> dict:
  """{'loss': mean NLL over supervised tokens, **task metrics} over `batches`. With a
  mesh (the trainer's), each batch is split over its batch axes like a training batch."""
  acc = metrics_factory()
  nll_sum, count = 0.0, 0
  cfg = for_mesh(cfg, mesh)
  for batch in batches:
    arrays, rows = shard_eval_batch(batch, mesh, {**PAD_VALUES, **OPTIONAL_PAD_VALUES})
    with mesh_context(mesh):
      pred, nll, n = _eval_batch(params, arrays, cfg, mode)
    acc.update(to_host(pred)[:rows], batch)
    nll_sum += float(to_host(nll))
    count += int(to_host(n))
  return {"loss": nll_sum / max(count, 1), **acc.result()}


def eval_modes(cfg, train_mode: Optional[str] = "auto") -> tuple[str, ...]:
  """The modes a model is evaluated in, exact (the true recurrence) last: parallel (zero
  memory), the training mode `train_mode` ("auto": the type's own schedule; none when it
  is None, exact or parallel) and exact for a recurrent model; parallel alone for a model
  without one, where every mode computes the same."""
  rec = getattr(cfg, "recurrence", None)
  if rec is None:
    return ("parallel",)
  train_mode = rec.default_schedule if train_mode == "auto" else train_mode
  extra = (train_mode,) if train_mode not in (None, "exact", "parallel") else ()
  return ("parallel", *extra, "exact")


