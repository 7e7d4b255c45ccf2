"""Pathfinding metrics: exact match of the path (every supervised token right under teacher
forcing, which is what greedy decoding reproduces: the shortest path is unique), overall
and per path length in edges, the `->` tokens the answer holds after the last `|`."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from t2mlr_jax.eval.sequence import SequenceMetrics


class PathfindingMetrics(SequenceMetrics):
  """SequenceMetrics plus `seq_acc_by_length` keyed by the gold path's edges."""

  def __init__(self, arrow_id: int, divider_id: int):
    super().__init__()
    self.arrow_id, self.divider_id = int(arrow_id), int(divider_id)
    self.right_by_length = defaultdict(int)
    self.total_by_length = defaultdict(int)

  def path_lengths(self, target_ids_BT: np.ndarray) -> np.ndarray:
    """Edges of each row's gold path: its supervised `->` tokens after the last divider."""
    tgt = np.asarray(target_ids_BT)
    divider = tgt == self.divider_id
    after = np.cumsum(divider[:, ::-1], axis=1)[:, ::-1] == 0   # past every divider
    return ((tgt == self.arrow_id) & after).sum(-1)

  def update_rows(self, right, supervised, rows, batch) -> None:
    """Count each row under its gold path's length."""
    lengths = self.path_lengths(batch["target_ids"])
    for b in rows:
      n = int(lengths[b])
      self.total_by_length[n] += 1
      self.right_by_length[n] += int(right[b].all())

  def result(self) -> dict:
    """SequenceMetrics' result and `seq_acc_by_length` ({edges: exact match})."""
    out = super().result()
    out["seq_acc_by_length"] = {str(n): self.right_by_length[n] / self.total_by_length[n]
                                for n in sorted(self.total_by_length)}
    return out
