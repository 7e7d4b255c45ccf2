"""Generic sequence metrics: exact match (every supervised position right) and token accuracy."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from t2mlr_jax.losses import supervised as is_supervised


class SequenceMetrics:
  """Accumulates greedy predictions batch by batch; rows without any supervised
  position (batch filler) are skipped. Subclasses add task-specific counts in
  `update_rows`."""

  def __init__(self):
    self.counts = defaultdict(float)

  def update(self, predictions_BT: np.ndarray, batch: dict) -> None:
    """Count one batch's greedy predictions [B, T] against its target_ids."""
    pred, tgt = np.asarray(predictions_BT), np.asarray(batch["target_ids"])
    supervised = np.asarray(is_supervised(tgt))
    right = (pred == tgt) | ~supervised
    rows = np.nonzero(supervised.any(-1))[0]
    self.counts["seq_right"] += float(right[rows].all(-1).sum())
    self.counts["seq_total"] += float(len(rows))
    self.counts["token_right"] += float((right & supervised).sum())
    self.counts["token_total"] += float(supervised.sum())
    self.update_rows(right, supervised, rows, batch)

  def update_rows(self, right, supervised, rows, batch) -> None:
    """Hook for task-specific counts (right/supervised are [B, T] bool)."""

  def result(self) -> dict:
    """{seq_acc, token_acc, num_examples} over the batches counted."""
    c = self.counts
    return {"seq_acc": c["seq_right"] / max(c["seq_total"], 1),
            "token_acc": c["token_right"] / max(c["token_total"], 1),
            "num_examples": int(c["seq_total"])}
