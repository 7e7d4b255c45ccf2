"""S5 metrics on hand-made predictions: sequence, state and value accuracy, per length."""

import numpy as np

from t2mlr_jax.data import pipeline, s5_examples, s5_group
from t2mlr_jax.eval.s5 import S5Metrics


def _batch():
  examples = [s5_examples.generate_example(1, 2, value_len=1, group="S3"),
              s5_examples.generate_example(2, 3, value_len=1, group="S3")]
  return pipeline.stack_batches(examples, seq_len=16, batch_size=3)[0]   # + one filler row


def test_state_right_values_wrong_per_length():
  batch = _batch()
  pred = batch["target_ids"].copy()
  value = s5_examples.position_masks(batch)["value"]
  pred[1][value[1]] = s5_group.SPACE_ID            # row 1 (3 actions): every value wrong
  metrics = S5Metrics()
  metrics.update(pred, batch)
  r = metrics.result()
  assert r["num_examples"] == 2               # the filler row is not counted
  assert r["seq_acc"] == 0.5 and r["seq_acc_by_length"] == {"2": 1.0, "3": 0.0}
  assert r["state_acc"] == 1.0 and r["state_acc_by_length"] == {"2": 1.0, "3": 1.0}
  assert r["value_acc"] == 2 / 5 and r["value_acc_by_length"] == {"2": 1.0, "3": 0.0}
  np.testing.assert_allclose(r["token_acc"], 1 - 3 / (batch["target_ids"][:2] >= 0).sum())


def test_value_accuracy_per_character_of_the_value():
  """v = 2: every second character wrong gives slot 1 accuracy 1, slot 2 accuracy 0, and
  value accuracy 1/2; value_slots numbers each action's slots 1, 2 and nothing else."""
  examples = [s5_examples.generate_example(i, n, value_len=2, group="S3")
              for i, n in ((1, 2), (2, 4))]
  batch = pipeline.stack_batches(examples, seq_len=32, batch_size=2)[0]
  slots = s5_examples.value_slots(batch)
  masks = s5_examples.position_masks(batch)
  assert ((slots > 0) == masks["value"]).all()
  assert [(slots == k).sum(-1).tolist() for k in (1, 2)] == [[2, 4], [2, 4]]
  pred = batch["target_ids"].copy()
  pred[slots == 2] = s5_group.SPACE_ID
  m = S5Metrics()
  m.update(pred, batch)
  r = m.result()
  assert r["value_acc_by_slot"] == {"1": 1.0, "2": 0.0} and r["value_acc"] == 0.5
  assert r["state_acc"] == 1.0


def test_perfect_all_wrong_and_accumulated_predictions():
  """Perfect predictions score 1 on every metric and length, predictions wrong at every
  supervised position 0, and the two accumulated over batches exactly 1/2."""
  batch = _batch()
  tgt = batch["target_ids"]
  wrong = np.where(tgt >= 0, (tgt + 1) % s5_group.VOCAB_SIZE, tgt)
  keys = ("seq_acc", "token_acc", "state_acc", "value_acc")
  for pred, want in ((tgt, 1.0), (wrong, 0.0)):
    m = S5Metrics()
    m.update(pred, batch)
    r = m.result()
    assert r["num_examples"] == 2 and [r[k] for k in keys] == [want] * 4
    for k in ("seq_acc_by_length", "state_acc_by_length", "value_acc_by_length"):
      assert r[k] == {"2": want, "3": want}, k
  m = S5Metrics()
  m.update(tgt, batch)
  m.update(wrong, batch)
  r = m.result()
  assert r["num_examples"] == 4 and [r[k] for k in keys] == [0.5] * 4
  assert r["seq_acc_by_length"] == {"2": 0.5, "3": 0.5}


def test_runner_evaluate_known_values():
  """eval.runner.evaluate end to end on test_eval_bpb's copy model (every position
  predicts token + 1 with a closed-form NLL): targets it always predicts give sequence and
  token accuracy 1 and loss NLL_right; targets it never predicts 0 and NLL_wrong; two rows
  right and two rows with one wrong position out of four supervised give 1/2 and 14/16.
  A row without supervised positions (batch filler) counts nowhere."""
  import pytest

  from eval.test_bpb import copy_model, copy_model_nll
  from t2mlr_jax.eval.runner import evaluate
  from t2mlr_jax.eval.sequence import SequenceMetrics
  V = 16
  cfg, params, a = copy_model(V)
  inputs = (np.arange(5 * 6).reshape(5, 6) * 7 % V).astype(np.int32)
  good = (inputs + 1) % V
  good[:, :2] = -1                                    # an unsupervised prompt
  good[4] = -1                                        # filler row
  bad = np.where(good >= 0, (good + 3) % V, -1)
  batch = lambda t: {"input_ids": inputs, "target_ids": t.astype(np.int32)}
  r = evaluate(params, cfg, [batch(good)], SequenceMetrics)
  assert (r["seq_acc"], r["token_acc"], r["num_examples"]) == (1.0, 1.0, 4)
  assert r["loss"] == pytest.approx(copy_model_nll(a, V, True), rel=1e-5)
  r = evaluate(params, cfg, [batch(bad)], SequenceMetrics)
  assert (r["seq_acc"], r["token_acc"], r["num_examples"]) == (0.0, 0.0, 4)
  assert r["loss"] == pytest.approx(copy_model_nll(a, V, False), rel=1e-5)
  half = good.copy()
  half[2:4, 3] = bad[2:4, 3]
  r = evaluate(params, cfg, [batch(half), batch(good)], SequenceMetrics)
  assert (r["seq_acc"], r["token_acc"], r["num_examples"]) == (6 / 8, 30 / 32, 8)
  want = (30 * copy_model_nll(a, V, True) + 2 * copy_model_nll(a, V, False)) / 32
  assert r["loss"] == pytest.approx(want, rel=1e-5)
  r = evaluate(params, cfg, [batch(half)], SequenceMetrics)
  assert (r["seq_acc"], r["token_acc"]) == (0.5, 14 / 16)
