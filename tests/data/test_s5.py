"""The S5 Grain source and batching (t2mlr_jax/data/s5.py); the data package imports
neither jax nor the model."""

import ast
import functools
import pathlib

import numpy as np
import pytest

from t2mlr_jax.data import s5, s5_curricula, s5_examples, s5_group


def test_sample_num_actions():
  rng = np.random.default_rng(0)
  draws = {s5.sample_num_actions(rng, 3, 6) for _ in range(200)}
  assert draws == {3, 4, 5, 6}
  with pytest.raises(ValueError, match="max_actions"):
    s5.sample_num_actions(rng, 5, 4)


def test_source_lengths_and_determinism():
  src = s5.S5Source(300, min_actions=2, max_actions=9, base_seed=1)
  assert len(src) == 300
  lengths = []
  for i in range(300):
    ex = src[i]
    n = int(s5_examples.state_positions(ex).sum())
    assert n == src.num_actions_of(i)
    assert len(ex["input_ids"]) == 10 * n + 1
    lengths.append(n)
  assert set(lengths) == set(range(2, 10))
  again = s5.S5Source(300, min_actions=2, max_actions=9, base_seed=1)
  for i in (0, 17, 299):
    for k in ("input_ids", "target_ids", "control_flow"):
      np.testing.assert_array_equal(src[i][k], again[i][k])
  other = s5.S5Source(300, min_actions=2, max_actions=9, base_seed=2)
  assert any(not np.array_equal(src[i]["input_ids"], other[i]["input_ids"])
             for i in range(5))
  assert not np.array_equal(src[0]["input_ids"], src[1]["input_ids"])
  with pytest.raises(IndexError):
    src[300]
  with pytest.raises(IndexError):
    src[-1]


def test_source_variants_pass_options():
  wp = s5.S5Source(10, min_actions=5, max_actions=5, word_problem=True, group="A4")[3]
  assert len(wp["input_ids"]) == 5 and (wp["control_flow"] == 2).all()
  nr = s5.S5Source(10, min_actions=3, max_actions=3, retrieval=False)[0]
  assert (nr["target_ids"][s5_examples.value_positions(nr)] == s5_group.SPACE_ID).all()
  fd = s5.S5Source(10, min_actions=3, max_actions=3, group="S3", full_dictionary=True)[0]
  assert len(fd["input_ids"]) == 6 * 5 + 1 + 3 * 5
  with pytest.raises(ValueError, match="dict_size"):
    s5.S5Source(10, min_actions=1, max_actions=8, dict_size=4)
  with pytest.raises(ValueError, match="max_actions"):
    s5.S5Source(10, min_actions=5, max_actions=4)
  with pytest.raises(ValueError, match="group"):
    s5.S5Source(10, group="S7")


def test_source_curriculum():
  curr = functools.partial(s5_curricula.length_curriculum, start=2, end=20, warmup_steps=10)
  src = s5.S5Source(400, min_actions=1, max_actions=16, curriculum=curr, examples_per_step=8)
  for i in range(400):
    cap = min(16, curr(i // 8))
    assert src.max_actions_at(i) == cap
    assert 1 <= src.num_actions_of(i) <= cap
  assert max(src.num_actions_of(i) for i in range(16)) <= 3
  assert max(src.num_actions_of(i) for i in range(300, 400)) > 10


def test_source_is_a_grain_data_source():
  grain = pytest.importorskip("grain")
  src = s5.S5Source(50, min_actions=1, max_actions=4, base_seed=3)
  assert isinstance(src, grain.sources.RandomAccessDataSource)
  ds = grain.MapDataset.source(src)
  assert len(ds) == 50
  np.testing.assert_array_equal(ds[7]["input_ids"], src[7]["input_ids"])
  batch = ds.map(lambda ex: s5.pad_batch([ex], 41))[2]
  np.testing.assert_array_equal(batch["input_ids"][0, :len(src[2]["input_ids"])],
                                src[2]["input_ids"])
  assert "S5Source(num_examples=50" in repr(src)


def test_pad_batch():
  exs = [s5_examples.generate_example(s, n) for s, n in [(0, 1), (1, 3), (2, 2)]]
  batch = s5.pad_batch(exs, 40)
  assert set(batch) == {"input_ids", "target_ids", "control_flow"}
  for k in batch:
    assert batch[k].shape == (3, 40) and batch[k].dtype == np.int32
  for b, ex in enumerate(exs):
    n = len(ex["input_ids"])
    for k in batch:
      np.testing.assert_array_equal(batch[k][b, :n], ex[k])
    assert (batch["input_ids"][b, n:] == 0).all()
    assert (batch["target_ids"][b, n:] == -100).all()
    assert (batch["control_flow"][b, n:] == 0).all()
  assert s5_examples.state_positions(batch).sum(axis=-1).tolist() == [1, 3, 2]
  assert s5_examples.value_positions(batch).sum(axis=-1).tolist() == [4, 12, 8]
  assert (s5.pad_batch(exs, 31, pad_id=3)["input_ids"][0, 11:] == 3).all()


def test_pad_batch_refuses_too_long():
  exs = [s5_examples.generate_example(0, 3), s5_examples.generate_example(1, 4)]  # lengths 31, 41
  assert s5.pad_batch(exs, 41)["input_ids"].shape == (2, 41)
  with pytest.raises(ValueError, match="seq_len"):
    s5.pad_batch(exs, 40)
  with pytest.raises(ValueError, match="examples"):
    s5.pad_batch([], 10)


def test_data_modules_import_neither_jax_nor_the_model():
  root = pathlib.Path(s5.__file__).parent
  for path in root.glob("*.py"):
    tree = ast.parse(path.read_text())
    names = []
    for node in ast.walk(tree):
      if isinstance(node, ast.Import):
        names += [a.name for a in node.names]
      elif isinstance(node, ast.ImportFrom):
        names.append(node.module or "")
    for name in names:
      assert not name.startswith(("jax", "flax", "t2mlr_jax.model")), (path.name, name)


def test_source_group_schedule_draws_from_the_stage_group():
  sched = functools.partial(s5_curricula.group_curriculum, stages=(("Z2", 3),), group="S3")
  src = s5.S5Source(60, min_actions=4, max_actions=6, value_len=1, group="S3",
                    examples_per_step=10, group_schedule=sched)
  z2 = {s5_group.action_id(p) for p in s5_group.group_elements("Z2")}
  s3 = {s5_group.action_id(p) for p in s5_group.group_elements("S3")}
  assert [src.group_at(i) for i in (0, 29, 30, 59)] == ["Z2", "Z2", "S3", "S3"]
  for i in range(60):
    ex = src[i]
    keys = set(ex["input_ids"][ex["control_flow"] == 2].tolist()) & s3
    assert keys <= (z2 if i < 30 else s3)
    assert (ex["input_ids"] == src[i]["input_ids"]).all()          # still deterministic
  later = {a for i in range(30, 60) for a in src[i]["input_ids"].tolist()} & s3
  assert later - z2                                                  # S3 actions appear


def test_source_value_schedule_stages_the_value_length():
  """Steps before the stage's end draw 1-character values, later ones `value_len`, each
  example still a pure function of its index and laid out as generate_example lays it."""
  sched = functools.partial(s5_curricula.value_curriculum, stages=((1, 3),), value_len=2)
  src = s5.S5Source(60, min_actions=2, max_actions=5, value_len=2, group="S3",
                    examples_per_step=10, value_schedule=sched)
  assert [src.value_len_at(i) for i in (0, 29, 30, 59)] == [1, 1, 2, 2]
  for i in range(60):
    ex, v = src[i], src.value_len_at(i)
    n = src.num_actions_of(i)
    assert len(ex["input_ids"]) == s5_examples.sequence_length(n, value_len=v, group="S3")
    assert s5_examples.value_positions(ex).sum() == n * v
    assert (ex["input_ids"] == src[i]["input_ids"]).all()


def test_a_mixed_stage_draws_each_example_from_one_of_its_groups():
  """"Z2+S3:N": each example of the stage draws its group, half and half, as a pure
  function of (seed, index); every example's actions and dictionary come from that group."""
  assert s5_curricula.parse_group_curriculum("Z2+S3:2000", "S3") == (("Z2+S3", 2000),)
  sched = functools.partial(s5_curricula.group_curriculum, stages=(("Z2+S3", 40),), group="S3")
  src = s5.S5Source(800, min_actions=1, max_actions=8, value_len=1, group="S3",
                    examples_per_step=10, group_schedule=sched)
  z2 = {s5_group.action_id(p) for p in s5_group.group_elements("Z2")}
  groups = [src.group_at(i) for i in range(400)]
  assert set(groups) == {"Z2", "S3"} and 160 < groups.count("Z2") < 240
  assert groups == [src.group_at(i) for i in range(400)]
  assert s5.S5Source(800, group="S3", examples_per_step=10, group_schedule=sched,
                     base_seed=1).group_at(0) in ("Z2", "S3")
  for i in range(0, 400, 7):
    ex = src[i]
    actions = set(ex["input_ids"][ex["input_ids"] >= s5_group.ACTION_OFFSET].tolist())
    if groups[i] == "Z2":
      assert actions <= z2                             # keys and actions from Z2 only
    n_dict = int(np.sum(ex["control_flow"] == 1) - 1) // 2
    assert n_dict <= (2 if groups[i] == "Z2" else 6)
  assert {src.group_at(i) for i in range(400, 800)} == {"S3"}          # after the stage
