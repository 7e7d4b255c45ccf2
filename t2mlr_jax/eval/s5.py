"""S5 metrics: sequence accuracy (every supervised position right), overall and per
number of actions, plus state-token and value accuracy separately (overall and per
number of actions: a model can track the state at a length and still fail retrieval),
and value accuracy per character of the value (`value_acc_by_slot`)."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from t2mlr_jax.data import s5_examples
from t2mlr_jax.eval.sequence import SequenceMetrics


class S5Metrics(SequenceMetrics):

  def __init__(self):
    super().__init__()
    self.by_length_right = defaultdict(int)
    self.by_length_total = defaultdict(int)
    self.by_length_tokens = defaultdict(float)   # (name, n, "right" | "total") -> count
    self.by_slot = defaultdict(float)            # (k, "right" | "total") -> count

  def update_rows(self, right, supervised, rows, batch) -> None:
    masks = s5_examples.position_masks(batch)
    n_actions = masks["state"].sum(-1)
    for b in rows:
      self.by_length_total[int(n_actions[b])] += 1
      self.by_length_right[int(n_actions[b])] += int(right[b].all())
    for name in ("state", "value"):
      m = masks[name] & supervised
      self.counts[f"{name}_right"] += float((right & m).sum())
      self.counts[f"{name}_total"] += float(m.sum())
      for b in rows:
        n = int(n_actions[b])
        self.by_length_tokens[name, n, "right"] += float((right[b] & m[b]).sum())
        self.by_length_tokens[name, n, "total"] += float(m[b].sum())
    slots = s5_examples.value_slots(batch)[rows]
    for k in np.unique(slots[slots > 0]):
      m = (slots == k) & supervised[rows]
      self.by_slot[int(k), "right"] += float((right[rows] & m).sum())
      self.by_slot[int(k), "total"] += float(m.sum())

  def result(self) -> dict:
    out = super().result()
    for name in ("state", "value"):
      if self.counts[f"{name}_total"]:
        out[f"{name}_acc"] = self.counts[f"{name}_right"] / self.counts[f"{name}_total"]
    out["seq_acc_by_length"] = {str(n): self.by_length_right[n] / self.by_length_total[n]
                                for n in sorted(self.by_length_total)}
    for name in ("state", "value"):
      per_n = {str(n): self.by_length_tokens[name, n, "right"] / self.by_length_tokens[name, n, "total"]
               for n in sorted(self.by_length_total) if self.by_length_tokens[name, n, "total"]}
      if per_n:
        out[f"{name}_acc_by_length"] = per_n
    per_slot = {str(k): self.by_slot[k, "right"] / self.by_slot[k, "total"]
                for k in sorted({k for k, _ in self.by_slot}) if self.by_slot[k, "total"]}
    if per_slot:
      out["value_acc_by_slot"] = per_slot
    return out
