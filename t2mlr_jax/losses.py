"""Cross-entropy losses over supervised positions (SPEC §10)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

IGNORE = -100


def cross_entropy(logits_BTV, labels_BT, mask_BT=None):
  """Mean CE over positions whose label is not IGNORE (and mask, if given, is true).

  Returns (mean loss, number of supervised tokens). Label shift 0: position t
  is scored against labels[t].
  """
  valid = labels_BT != IGNORE
  if mask_BT is not None:
    valid = valid & mask_BT.astype(bool)
  logp = jax.nn.log_softmax(logits_BTV.astype(jnp.float32), axis=-1)
  safe = jnp.where(valid, labels_BT, 0)
  nll = -jnp.take_along_axis(logp, safe[..., None], axis=-1)[..., 0]
  count = jnp.sum(valid)
  return jnp.sum(jnp.where(valid, nll, 0.0)) / jnp.maximum(count, 1), count


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
