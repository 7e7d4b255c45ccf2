"""S5-Retrieval and word-problem examples: layout, lengths, masks, control flow
(t2mlr_jax/data/s5_examples.py)."""

import re

import numpy as np
import pytest

from t2mlr_jax.data import s5, s5_examples, s5_group

TOK = s5_group.TOKENIZER
PAIR_RE = re.compile(r"(<A_[1-5]{5}>)([A-Za-z0-9]+)")


def _perm(token: str) -> tuple:
  return tuple(int(c) for c in token[3:8])


def _apply(state: np.ndarray, action: tuple) -> np.ndarray:
  """Independent of s5_group: new[i] = old[act[i]-1] via fancy indexing."""
  return state[np.asarray(action) - 1]


def _check_example(ex, num_actions, value_len=4, retrieval=True):
  """Parses the example back from text and checks every target independently."""
  ids, tgt, cf = ex["input_ids"], ex["target_ids"], ex["control_flow"]
  assert ids.dtype == tgt.dtype == cf.dtype == np.int32
  assert ids.shape == tgt.shape == cf.shape
  text = TOK.decode(ids)
  head, sep, tail = text.partition("|")
  assert sep == "|"
  pairs = PAIR_RE.findall(head)
  assert "".join(k + v for k, v in pairs) == head  # no separators, nothing else
  assert all(len(v) == value_len for _, v in pairs)
  dictionary = dict(pairs)
  assert len(dictionary) == len(pairs)  # keys are distinct
  n_dict = len(pairs)
  steps = re.findall(r"(<A_[1-5]{5}>)( *)", tail)
  assert "".join(a + s for a, s in steps) == tail
  assert len(steps) == num_actions
  assert all(len(s) == value_len for _, s in steps)
  assert {a for a, _ in steps} <= set(dictionary)

  n_head = n_dict * (1 + value_len) + 1
  assert len(ids) == n_head + num_actions * (1 + value_len)
  np.testing.assert_array_equal(tgt[:n_head], ids[:n_head])
  assert (cf[:n_head] == 1).all() and (cf[n_head:] == 2).all()

  state = np.arange(1, 6)
  for t, (a, _) in enumerate(steps):
    pos = n_head + t * (1 + value_len)
    state = _apply(state, _perm(a))
    assert TOK.id_to_token[tgt[pos]] == "<A_" + "".join(map(str, state)) + ">"
    slots = TOK.decode(tgt[pos + 1:pos + 1 + value_len])
    assert slots == (dictionary[a] if retrieval else " " * value_len)
  return dictionary, steps


@pytest.mark.parametrize("n", [1, 2, 5, 16, 32, 48])
def test_length_10n_plus_1_and_targets(n):
  for seed in range(3):
    ex = s5_examples.generate_example(seed, n)
    assert len(ex["input_ids"]) == 10 * n + 1
    assert s5_examples.sequence_length(n) == 10 * n + 1
    dictionary, _ = _check_example(ex, n)
    assert len(dictionary) == n


def test_length_formula_other_shapes():
  ex = s5_examples.generate_example(3, 5, value_len=2, dict_size=9)
  assert len(ex["input_ids"]) == 9 * 3 + 1 + 5 * 3
  assert s5_examples.sequence_length(5, value_len=2, dict_size=9) == len(ex["input_ids"])
  dictionary, _ = _check_example(ex, 5, value_len=2)
  assert len(dictionary) == 9
  # Default N_dict is capped by the group's order.
  ex = s5_examples.generate_example(0, 10, group="Z2")
  assert len(ex["input_ids"]) == 2 * 5 + 1 + 10 * 5 == s5_examples.sequence_length(10, group="Z2")
  _check_example(ex, 10)


def test_value_slots_keyed_by_action_with_repeated_actions():
  # Z2 with 12 actions repeats keys many times: each repeat must retrieve the same value.
  ex = s5_examples.generate_example(7, 12, group="Z2", value_len=3)
  dictionary, steps = _check_example(ex, 12, value_len=3)
  assert len({a for a, _ in steps}) == 2
  assert len(set(dictionary.values())) == 2  # distinct values for this seed


def test_dictionary_shuffled_and_topped_up():
  firsts = set()
  for seed in range(20):
    ex = s5_examples.generate_example(seed, 3, dict_size=8)
    dictionary, steps = _check_example(ex, 3)
    assert len(dictionary) == 8
    used = [a for a, _ in steps]
    firsts.add(next(iter(dictionary)) in used)
  assert firsts == {True, False}  # the used keys are not always first


def test_no_retrieval_variant_targets_blanks():
  ex = s5_examples.generate_example(11, 9, retrieval=False)
  _check_example(ex, 9, retrieval=False)
  ref = s5_examples.generate_example(11, 9)
  np.testing.assert_array_equal(ex["input_ids"], ref["input_ids"])
  vmask = s5_examples.value_positions(ex)
  assert (ex["target_ids"][vmask] == s5_group.SPACE_ID).all()
  assert (ref["target_ids"][vmask] != s5_group.SPACE_ID).all()
  smask = s5_examples.state_positions(ex)
  np.testing.assert_array_equal(ex["target_ids"][smask], ref["target_ids"][smask])


@pytest.mark.parametrize("group", s5_group.GROUPS)
def test_full_dictionary(group):
  order = len(s5_group.group_elements(group))
  ex = s5_examples.generate_example(2, 4, group=group, full_dictionary=True)
  dictionary, _ = _check_example(ex, 4)
  assert {_perm(k) for k in dictionary} == set(s5_group.group_elements(group))
  assert len(ex["input_ids"]) == order * 5 + 1 + 4 * 5
  assert s5_examples.sequence_length(4, group=group, full_dictionary=True) == len(ex["input_ids"])


def test_masks():
  ex = s5_examples.generate_example(5, 6)
  masks = s5_examples.position_masks(ex)
  n_head = 6 * 5 + 1
  expected_state = np.zeros(61, bool)
  expected_state[n_head::5] = True
  np.testing.assert_array_equal(masks["state"], expected_state)
  np.testing.assert_array_equal(s5_examples.state_positions(ex), expected_state)
  expected_value = np.zeros(61, bool)
  expected_value[n_head:] = True
  expected_value[n_head::5] = False
  np.testing.assert_array_equal(masks["value"], expected_value)
  np.testing.assert_array_equal(masks["answer"], np.arange(61) >= n_head)
  np.testing.assert_array_equal(masks["dictionary"], np.arange(61) < n_head)


def test_determinism_per_seed():
  a = s5_examples.generate_example(123, 10)
  b = s5_examples.generate_example(123, 10)
  c = s5_examples.generate_example(124, 10)
  for k in a:
    np.testing.assert_array_equal(a[k], b[k])
  assert not np.array_equal(a["input_ids"], c["input_ids"])
  w1, w2 = s5_examples.generate_word_problem(9, 30), s5_examples.generate_word_problem(9, 30)
  np.testing.assert_array_equal(w1["input_ids"], w2["input_ids"])
  assert not np.array_equal(w1["input_ids"], s5_examples.generate_word_problem(10, 30)["input_ids"])


def test_word_problem():
  wp = s5_examples.generate_word_problem(4, 25)
  assert wp["input_ids"].shape == wp["target_ids"].shape == wp["control_flow"].shape == (25,)
  assert (wp["control_flow"] == 2).all()
  state = np.arange(1, 6)
  for a, s in zip(wp["input_ids"], wp["target_ids"]):
    state = _apply(state, s5_group.perm_of_id(int(a)))
    assert s5_group.perm_of_id(int(s)) == tuple(state)
  assert s5_examples.state_positions(wp).all() and not s5_examples.value_positions(wp).any()


@pytest.mark.parametrize("kwargs,match", [
    (dict(num_actions=0), "num_actions"),
    (dict(num_actions=-3), "num_actions"),
    (dict(num_actions=4, value_len=0), "value_len"),
    (dict(num_actions=30, dict_size=2), "dict_size"),
    (dict(num_actions=3, dict_size=121), "dict_size"),
    (dict(num_actions=3, dict_size=7, group="S3"), "dict_size"),
    (dict(num_actions=3, dict_size=0), "dict_size"),
    (dict(num_actions=3, dict_size=5, full_dictionary=True), "dict_size"),
    (dict(num_actions=3, group="S6"), "group"),
])
def test_bad_arguments_raise(kwargs, match):
  with pytest.raises(ValueError, match=match):
    s5_examples.generate_example(0, **kwargs)


def test_bad_arguments_word_problem():
  with pytest.raises(ValueError, match="num_actions"):
    s5_examples.generate_word_problem(0, 0)
  with pytest.raises(ValueError, match="group"):
    s5_examples.generate_word_problem(0, 3, group="A5")


def test_control_flow_from_tokens_is_the_generated_one():
  examples = [s5_examples.generate_example(seed=i, num_actions=n, value_len=3)
              for i, n in enumerate((1, 4, 9))]
  for ex in examples:
    np.testing.assert_array_equal(s5_examples.control_flow(ex["input_ids"]), ex["control_flow"])
  batch = s5.pad_batch(examples, 100)
  np.testing.assert_array_equal(s5_examples.control_flow(batch["input_ids"]), batch["control_flow"])
  wp = s5_examples.generate_word_problem(seed=3, num_actions=5)
  np.testing.assert_array_equal(s5_examples.control_flow(wp["input_ids"]), wp["control_flow"])
  with pytest.raises(ValueError, match="input_ids"):
    s5_examples.control_flow(np.zeros((1, 2, 3), np.int32))
