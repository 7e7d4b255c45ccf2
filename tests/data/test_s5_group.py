"""The S5 vocabulary, tokenizer and group algebra (t2mlr_jax/data/s5_group.py)."""

import itertools

import numpy as np
import pytest

from t2mlr_jax.data import s5_examples, s5_group

TOK = s5_group.TOKENIZER
OFFICIAL_TEXT = "<A_53124>hFWC<A_41235>xk2a|<A_41235>    <A_53124>    "


def test_vocabulary_size_and_order():
  assert TOK.vocab_size == s5_group.VOCAB_SIZE == 188
  expected = {0: "<pad>", 1: "<unk>", 2: "<bos>", 3: "<eos>", 4: "a", 29: "z", 30: "A",
              55: "Z", 56: "0", 65: "9", 66: " ", 67: "|", 68: "<A_12345>",
              69: "<A_12354>", 187: "<A_54321>"}
  for i, tok in expected.items():
    assert TOK.id_to_token[i] == tok
    assert TOK.token_to_id[tok] == i
  perms = list(itertools.permutations((1, 2, 3, 4, 5)))
  for k, p in enumerate(perms):
    assert TOK.id_to_token[68 + k] == "<A_" + "".join(map(str, p)) + ">"
  assert (s5_group.PAD_ID, s5_group.UNK_ID, s5_group.BOS_ID, s5_group.EOS_ID) == (0, 1, 2, 3)
  assert (s5_group.SPACE_ID, s5_group.SEP_ID, s5_group.ACTION_OFFSET) == (66, 67, 68)
  assert len(set(TOK.id_to_token)) == 188


def test_tokenizer_encodes_official_text():
  ids = TOK.encode(OFFICIAL_TEXT)
  t = TOK.token_to_id
  expected = ([t["<A_53124>"], t["h"], t["F"], t["W"], t["C"], t["<A_41235>"], t["x"],
               t["k"], t["2"], t["a"], 67, t["<A_41235>"]] + [66] * 4
              + [t["<A_53124>"]] + [66] * 4)
  assert ids == expected
  assert len(ids) == 10 * 2 + 1
  assert TOK.decode(ids) == OFFICIAL_TEXT
  assert TOK.decode(np.asarray(ids, np.int32)) == OFFICIAL_TEXT


def test_tokenizer_round_trip_generated_and_specials():
  for seed in range(5):
    ex = s5_examples.generate_example(seed, 7)
    for key in ("input_ids", "target_ids"):
      text = TOK.decode(ex[key])
      assert TOK.encode(text) == ex[key].tolist()
      assert TOK.decode(TOK.encode(text)) == text
  s = "<bos>ab|<A_54321>  <eos><pad><unk>Z9"
  assert TOK.decode(TOK.encode(s)) == s
  assert TOK.encode("<bos>")[0] == 2


@pytest.mark.parametrize("bad", ["ab!", "<A_12346>", "<A_1234", "x\ny", "é"])
def test_tokenizer_rejects_unknown_characters(bad):
  with pytest.raises(ValueError, match="not in the S5 vocabulary"):
    TOK.encode(bad)


def test_decode_rejects_out_of_range_ids():
  with pytest.raises(ValueError, match="out of range"):
    TOK.decode([5, 188])
  with pytest.raises(ValueError, match="out of range"):
    TOK.decode([-1])


def test_worked_composition_examples():
  assert s5_group.compose((1, 2, 3, 4, 5), (4, 1, 2, 3, 5)) == (4, 1, 2, 3, 5)
  assert s5_group.compose((4, 1, 2, 3, 5), (5, 3, 1, 2, 4)) == (5, 2, 4, 1, 3)
  idx = [s5_group.action_id(p) - 68 for p in [(4, 1, 2, 3, 5), (5, 3, 1, 2, 4)]]
  states = [s5_group.PERMUTATIONS[i] for i in s5_group.running_states(np.asarray(idx))]
  assert states == [(4, 1, 2, 3, 5), (5, 2, 4, 1, 3)]


def test_action_id_and_perm_of_id():
  assert s5_group.action_id((1, 2, 3, 4, 5)) == 68
  assert s5_group.action_id((5, 4, 3, 2, 1)) == 187
  for i in (68, 100, 187):
    assert s5_group.action_id(s5_group.perm_of_id(i)) == i
  with pytest.raises(ValueError, match="perm"):
    s5_group.action_id((1, 1, 2, 3, 4))
  with pytest.raises(ValueError, match="token_id"):
    s5_group.perm_of_id(67)


@pytest.mark.parametrize("group,order", [("S5", 120), ("S4", 24), ("A4", 12), ("S3", 6),
                                         ("Z2", 2)])
def test_group_order_and_closure(group, order):
  elems = s5_group.group_elements(group)
  assert len(elems) == len(set(elems)) == order
  assert elems[0] == (1, 2, 3, 4, 5)
  elem_set = set(elems)
  for a in elems:
    for b in elems:
      assert s5_group.compose(a, b) in elem_set


def test_group_members():
  assert set(s5_group.group_elements("Z2")) == {(1, 2, 3, 4, 5), (2, 1, 3, 4, 5)}
  assert all(p[3:] == (4, 5) for p in s5_group.group_elements("S3"))
  assert all(p[4] == 5 for p in s5_group.group_elements("S4"))

  def parity(p):
    return sum(p[i] > p[j] for i in range(5) for j in range(i + 1, 5)) % 2

  assert all(parity(p) == 0 for p in s5_group.group_elements("A4"))
  assert set(s5_group.group_elements("A4")) < set(s5_group.group_elements("S4"))
  assert (1, 3, 2, 4, 5) not in s5_group.group_elements("A4")


@pytest.mark.parametrize("group", s5_group.GROUPS)
def test_group_actions_and_states_stay_in_group(group):
  members = {s5_group.action_id(p) for p in s5_group.group_elements(group)}
  for seed in range(4):
    ex = s5_examples.generate_example(seed, 20, group=group)
    mask = s5_examples.state_positions(ex)
    assert set(ex["input_ids"][mask].tolist()) <= members
    assert set(ex["target_ids"][mask].tolist()) <= members
    wp = s5_examples.generate_word_problem(seed, 20, group=group)
    assert set(wp["input_ids"].tolist()) <= members
    assert set(wp["target_ids"].tolist()) <= members


def test_actions_are_uniform_and_include_identity():
  wp = s5_examples.generate_word_problem(0, 6000, group="S3")
  counts = np.bincount(wp["input_ids"] - 68, minlength=120)
  used = counts[counts > 0]
  assert len(used) == 6 and counts[0] > 0  # identity 12345 is drawn too
  assert used.min() > 850 and used.max() < 1150  # expected 1000 each
