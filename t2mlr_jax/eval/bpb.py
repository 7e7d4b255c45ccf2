"""Bits per byte (SPEC §5, nanochat's rule): Σ CE in nats over the predicted tokens that
have at least one UTF-8 byte / (ln 2 · Σ their UTF-8 bytes). Special tokens (0 bytes)
leave both sums, so the number does not depend on the tokenizer and compares with the
LRT paper's. Accumulate `bpb_sums` over held-out batches, then `bits_per_byte`."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from t2mlr_jax.losses import token_nll


def byte_tokenizer_lengths() -> np.ndarray:
  """[V] UTF-8 bytes of each id of the library's byte tokenizer: 0 for <pad>/<bos>/<eos>,
  1 for each byte id."""
  from t2mlr_jax.data import byte_tokenizer as bt
  lengths = np.ones(bt.VOCAB_SIZE, np.int32)
  lengths[:bt.OFFSET] = 0
  return lengths


def bpb_sums(logits_BTV, labels_BT, token_bytes_V, mask_BT=None):
  """(Σ nats, Σ bytes) over the supervised positions whose label has ≥ 1 byte.
  labels follow the library's rule (negative = not predicted); token_bytes_V [V] int."""
  nll, valid = token_nll(logits_BTV, labels_BT, mask_BT)
  token_bytes = jnp.asarray(token_bytes_V, jnp.int32)
  nbytes = jnp.where(valid, token_bytes[jnp.where(valid, labels_BT, 0)], 0)
  return jnp.sum(jnp.where(nbytes > 0, nll, 0.0)), jnp.sum(nbytes)


def bits_per_byte(nats, nbytes) -> float:
  """Bits per byte from accumulated sums (nan when no byte was predicted)."""
  nats, nbytes = float(nats), int(nbytes)
  return nats / (math.log(2) * nbytes) if nbytes else float("nan")
