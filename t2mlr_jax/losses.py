"""Cross-entropy over supervised positions (docs/models.md#conventions): the library's one
ignore rule and one cross-entropy. A label is supervised iff it is >= 0: any negative
label (IGNORE, the release's -1) is ignored. Imports nothing of ours (data pipelines use
IGNORE)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

IGNORE = -100    # the label our data pipelines write where nothing is predicted


def supervised(labels_BT, mask_BT=None):
  """[B, T] bool: label >= 0 (and mask true, when given)."""
  valid = labels_BT >= 0
  return valid if mask_BT is None else valid & mask_BT.astype(bool)


def token_nll(logits_BTV, labels_BT, mask_BT=None):
  """(per-position −log p(label) [B, T] in fp32, 0 where unsupervised; supervised mask)."""
  valid = supervised(labels_BT, mask_BT)
  logp = jax.nn.log_softmax(logits_BTV.astype(jnp.float32), axis=-1)
  safe = jnp.where(valid, labels_BT, 0)
  nll = -jnp.take_along_axis(logp, safe[..., None], axis=-1)[..., 0]
  return jnp.where(valid, nll, 0.0), valid


def cross_entropy(logits_BTV, labels_BT, mask_BT=None, total=None):
  """Mean CE over supervised positions; returns (mean loss, number of supervised tokens).
  Label shift 0: position t is scored against labels[t]. total: divide the summed CE by
  this token count instead of this batch's own (gradient accumulation passes the whole
  batch's, so the microbatches' losses add up to the batch's mean)."""
  nll, valid = token_nll(logits_BTV, labels_BT, mask_BT)
  count = jnp.sum(valid)
  return jnp.sum(nll) / jnp.maximum(count if total is None else total, 1), count


def next_token_labels(tokens_BT, mask_BT=None):
  """Language-modelling labels: position t predicts token t+1 (last position IGNORE).

  mask_BT marks tokens that may be predicted (e.g. responses only); masked-out
  targets become IGNORE.
  """
  labels = jnp.concatenate(
      [tokens_BT[:, 1:], jnp.full((tokens_BT.shape[0], 1), IGNORE, tokens_BT.dtype)], axis=1)
  if mask_BT is not None:
    target_ok = jnp.concatenate(
        [mask_BT[:, 1:].astype(bool), jnp.zeros((tokens_BT.shape[0], 1), bool)], axis=1)
    labels = jnp.where(target_ok, labels, IGNORE)
  return labels


def chunked_cross_entropy(head_fn, y_BTD, labels_BT, chunk: int, total=None):
  """`cross_entropy(head_fn(y), labels)` computed `chunk` positions at a time: the same
  value and gradient, but only [B, chunk, V] logits live at once, in the forward and
  (each chunk rematerialised) in the backward, instead of [B, T, V] fp32.

  head_fn: y [B, c, D] -> logits [B, c, V] (closing over its parameters). total: as in
  `cross_entropy`."""
  if not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < 1:
    raise ValueError(f"loss_chunk={chunk!r} is invalid: allowed an integer >= 1")
  B, T, D = y_BTD.shape
  n = -(-T // chunk)
  pad = n * chunk - T
  if pad:
    y_BTD = jnp.pad(y_BTD, ((0, 0), (0, pad), (0, 0)))
    labels_BT = jnp.pad(labels_BT, ((0, 0), (0, pad)), constant_values=IGNORE)
  y_NBCD = jnp.swapaxes(y_BTD.reshape(B, n, chunk, D), 0, 1)
  labels_NBC = jnp.swapaxes(labels_BT.reshape(B, n, chunk), 0, 1)

  @jax.checkpoint
  def one(y_BCD, labels_BC):
    nll, valid = token_nll(head_fn(y_BCD), labels_BC)
    return jnp.sum(nll), jnp.sum(valid)

  def body(carry, xs):
    total, count = one(*xs)
    return (carry[0] + total, carry[1] + count), None

  (nll_sum, count), _ = jax.lax.scan(
      body, (jnp.zeros((), jnp.float32), jnp.zeros((), jnp.int32)), (y_NBCD, labels_NBC))
  return nll_sum / jnp.maximum(count if total is None else total, 1), count
