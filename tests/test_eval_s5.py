"""S5 metrics on hand-made predictions: sequence, state and value accuracy, per length."""

import numpy as np

from t2mlr_jax.data import pipeline, s5
from t2mlr_jax.eval.s5 import S5Metrics


def _batch():
  examples = [s5.generate_example(1, 2, value_len=1, group="S3"),
              s5.generate_example(2, 3, value_len=1, group="S3")]
  return pipeline.stack_batches(examples, seq_len=16, batch_size=3)[0]   # + one filler row


def test_state_right_values_wrong_per_length():
  batch = _batch()
  pred = batch["target_ids"].copy()
  value = s5.position_masks(batch)["value"]
  pred[1][value[1]] = s5.SPACE_ID            # row 1 (3 actions): every value wrong
  metrics = S5Metrics()
  metrics.update(pred, batch)
  r = metrics.result()
  assert r["num_examples"] == 2               # the filler row is not counted
  assert r["seq_acc"] == 0.5 and r["seq_acc_by_length"] == {"2": 1.0, "3": 0.0}
  assert r["state_acc"] == 1.0 and r["state_acc_by_length"] == {"2": 1.0, "3": 1.0}
  assert r["value_acc"] == 2 / 5 and r["value_acc_by_length"] == {"2": 1.0, "3": 0.0}
  np.testing.assert_allclose(r["token_acc"], 1 - 3 / (batch["target_ids"][:2] >= 0).sum())
