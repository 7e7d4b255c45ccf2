"""experiments/future_token_probe.py: the targets at each offset, heads that learn what the
features hold (a linear head reads a token two ahead written into the hidden state), and
one probe of a trained run's checkpoint recorded per offset."""

import numpy as np
import pytest

from t2mlr_jax.train import loop

from _util import config_file, load_file


def test_offset_targets_read_the_token_that_many_positions_ahead():
  probe = load_file("experiments", "future_token_probe.py")
  target_ids = np.array([[5, 6, 7, 8, -100], [-100, 1, 2, 3, 4]])   # the token at t + 1
  np.testing.assert_array_equal(probe.offset_targets(target_ids, 2),
                                [[6, 7, 8, -100, -100], [1, 2, 3, 4, -100]])
  np.testing.assert_array_equal(probe.offset_targets(target_ids, 1), target_ids)
  assert (probe.offset_targets(target_ids, 9) == -100).all()


def test_a_linear_head_reads_what_the_features_hold():
  """Features one-hot in the token two ahead: the offset-2 head gets it right, the
  offset-3 head (nothing in the features) stays near chance."""
  probe = load_file("experiments", "future_token_probe.py")
  rng = np.random.default_rng(0)
  V, T = 8, 12
  feats = []
  for _ in range(4):
    tokens = rng.integers(0, V, (16, T + 1))
    target_ids = tokens[:, 1:].astype(np.int32)                        # the token at t + 1
    x = np.eye(V, dtype=np.float32)[probe.offset_targets(target_ids, 2).clip(0)]
    feats.append((x, target_ids))
  heads = probe.train_heads(feats, V, num_heads=2, head_layers=1, steps=150, lr=0.1, seed=0)
  scores = probe.score_heads(heads, feats)
  assert scores["2"]["acc"] > 0.95 and scores["3"]["acc"] < 0.4
  assert scores["2"]["tokens"] == 4 * 16 * (T - 1)


@pytest.mark.slow       # trains configs/s5_retrieval.py:tiny, then probes it
def test_a_run_is_probed_per_offset_and_tabled(tmp_path):
  probe = load_file("experiments", "future_token_probe.py")
  wd = str(tmp_path / "s5")
  loop.train(config_file("s5_retrieval", "tiny"), wd, progress=False)
  record = probe.probe(wd, num_heads=3, head_layers=2, steps=10, train_batches=2)
  assert sorted(record["offsets"]) == ["2", "3", "4"] and record["task"] == "s5_retrieval"
  assert record["step"] == config_file("s5_retrieval", "tiny").train.num_steps
  with pytest.raises(ValueError, match="step=1 is not saved"):
    probe.probe(wd, num_heads=1, steps=1, train_batches=1, step=1)
  assert all(0.0 <= r["acc"] <= 1.0 and r["tokens"] > 0 for r in record["offsets"].values())
  text = probe.table({"runs": {"t2mlr": record}})
  assert text.splitlines()[0].startswith("| run | task | params | t+2 acc (loss)")
