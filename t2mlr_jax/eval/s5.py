"""S5 metrics: sequence accuracy (every supervised position right), overall and per
number of actions, plus state-token and value accuracy separately."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from t2mlr_jax.data import s5
from t2mlr_jax.data.pipeline import IGNORE_ID


class S5Metrics:
  """Accumulates predictions batch by batch; `result()` gives the summary dict."""

  def __init__(self):
    self.seq_right = defaultdict(int)
    self.seq_total = defaultdict(int)
    self.counts = defaultdict(float)

  def update(self, predictions_BT: np.ndarray, batch: dict) -> None:
    pred, tgt = np.asarray(predictions_BT), np.asarray(batch["target_ids"])
    supervised = tgt != IGNORE_ID
    right = (pred == tgt) | ~supervised
    masks = s5.position_masks(batch)
    n_actions = masks["state"].sum(-1)
    for b in np.nonzero(supervised.any(-1))[0]:        # skip filler rows
      self.seq_total[int(n_actions[b])] += 1
      self.seq_right[int(n_actions[b])] += int(right[b].all())
    for name in ("state", "value"):
      m = masks[name] & supervised
      self.counts[f"{name}_right"] += float((right & m).sum())
      self.counts[f"{name}_total"] += float(m.sum())
    self.counts["token_right"] += float((right & supervised).sum())
    self.counts["token_total"] += float(supervised.sum())

  def result(self) -> dict:
    total = sum(self.seq_total.values())
    out = {"seq_acc": sum(self.seq_right.values()) / max(total, 1),
           "token_acc": self.counts["token_right"] / max(self.counts["token_total"], 1),
           "num_examples": total}
    for name in ("state", "value"):
      if self.counts[f"{name}_total"]:
        out[f"{name}_acc"] = self.counts[f"{name}_right"] / self.counts[f"{name}_total"]
    out["seq_acc_by_length"] = {str(n): self.seq_right[n] / self.seq_total[n]
                                for n in sorted(self.seq_total)}
    return out
