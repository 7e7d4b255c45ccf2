"""Bits per byte (nanochat's rule, docs/pretraining.md): Σ CE in nats over the predicted
tokens that have at least one UTF-8 byte / (ln 2 · Σ their UTF-8 bytes). Special tokens
(0 bytes) leave both sums, so the number does not depend on the tokenizer and compares
with the LRT paper's. Accumulate `bpb_sums` over held-out batches, then
`bits_per_byte`. A schedule whose passes each predict every position (`pass_views`:
multi_refine) is also scored pass by pass."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from t2mlr_jax.data.pipeline import OPTIONAL_PAD_VALUES, PAD_VALUES
from t2mlr_jax.eval.runner import for_mesh, mesh_context, to_host
from t2mlr_jax.losses import token_nll
from t2mlr_jax.model.api import apply_model
from t2mlr_jax.registry import SCHEDULES
from t2mlr_jax.sharding import shard_eval_batch


def bpb_sums(logits_BTV, labels_BT, token_bytes_V, mask_BT=None):
  """(Σ nats, Σ bytes) over the supervised positions whose label has ≥ 1 byte.
  labels follow the library's rule (negative = not predicted); token_bytes_V [V] int."""
  return _sums(logits_BTV, labels_BT, token_bytes_V, mask_BT)[2:]


def _sums(logits_BTV, labels_BT, token_bytes_V, mask_BT=None):
  """(Σ nll, supervised tokens, Σ nats, Σ bytes) from one log-softmax of the logits."""
  nll, valid = token_nll(logits_BTV, labels_BT, mask_BT)
  token_bytes = jnp.asarray(token_bytes_V, jnp.int32)
  nbytes = jnp.where(valid, token_bytes[jnp.where(valid, labels_BT, 0)], 0)
  return (jnp.sum(nll), jnp.sum(valid), jnp.sum(jnp.where(nbytes > 0, nll, 0.0)),
          jnp.sum(nbytes))


def bits_per_byte(nats, nbytes) -> float:
  """Bits per byte from accumulated sums (nan when no byte was predicted)."""
  nats, nbytes = float(nats), int(nbytes)
  return nats / (math.log(2) * nbytes) if nbytes else float("nan")



def scores_passes(mode: str) -> bool:
  """Whether `mode` is a schedule whose every pass predicts every position."""
  return mode in SCHEDULES and SCHEDULES.get(mode).pass_views


@functools.partial(jax.jit, static_argnames=("cfg", "mode"))
def _bpb_batch(params, batch, token_bytes_V, cfg, mode):
  """(Σ nll, supervised tokens, Σ nats, Σ bytes); with pass views, Σ nll and Σ nats of each
  pass ([P] each) after them."""
  logits, aux = apply_model(params, cfg, batch, mode)
  labels = batch["target_ids"]
  out = _sums(logits, labels, token_bytes_V)
  if not scores_passes(mode) or "pass_logits" not in aux:   # (a family without modes)
    return out

  def one_pass(logits_BTV):
    nll, _, nats, _ = _sums(logits_BTV, labels, token_bytes_V)
    return nll, nats
  return out + jax.lax.map(one_pass, aux["pass_logits"])


def evaluate_bpb(params, cfg, batches, token_bytes_V, mode: str = "exact", mesh=None) -> dict:
  """{'loss' (mean nats per supervised token), 'bpb', 'tokens', 'bytes'} of a model over
  fixed batches (input_ids, target_ids, positions, ...) under one forward mode; with a
  mesh, each batch split over its batch axes like a training batch. A mode scored per
  pass (multi_refine) adds 'pass_loss' and 'pass_bpb' (passes 0..K; its 'bpb' is pass
  K's, the last)."""
  token_bytes_V = jnp.asarray(token_bytes_V, jnp.int32)
  nll_sum, count, nats, nbytes = 0.0, 0, 0.0, 0
  pass_nll = pass_nats = None           # [P] sums, for a mode scored per pass
  cfg = for_mesh(cfg, mesh)
  for batch in batches:
    arrays, _ = shard_eval_batch(batch, mesh, {**PAD_VALUES, **OPTIONAL_PAD_VALUES})
    with mesh_context(mesh):
      out = _bpb_batch(params, arrays, token_bytes_V, cfg, mode)
    a, b, c, d, *per_pass = (to_host(x) for x in out)
    nll_sum, count = nll_sum + float(a), count + int(b)
    nats, nbytes = nats + float(c), nbytes + int(d)
    if per_pass:
      nll_p, nats_p = (np.asarray(x, np.float64) for x in per_pass)
      pass_nll = nll_p if pass_nll is None else pass_nll + nll_p
      pass_nats = nats_p if pass_nats is None else pass_nats + nats_p
  result = {"loss": nll_sum / max(count, 1), "bpb": bits_per_byte(nats, nbytes),
            "tokens": count, "bytes": nbytes}
  if pass_nats is not None:
    result["pass_loss"] = [float(x) / max(count, 1) for x in pass_nll]
    result["pass_bpb"] = [bits_per_byte(x, nbytes) for x in pass_nats]
  return result
