"""S5-Retrieval data: vocabulary, tokenizer, group algebra, example layout, source, batching."""

import ast
import functools
import itertools
import pathlib
import re

import numpy as np
import pytest

from t2mlr_jax.data import s5

TOK = s5.TOKENIZER
OFFICIAL_TEXT = "<A_53124>hFWC<A_41235>xk2a|<A_41235>    <A_53124>    "
PAIR_RE = re.compile(r"(<A_[1-5]{5}>)([A-Za-z0-9]+)")


def _perm(token: str) -> tuple:
  return tuple(int(c) for c in token[3:8])


def _apply(state: np.ndarray, action: tuple) -> np.ndarray:
  """Independent of s5: new[i] = old[act[i]-1] via fancy indexing."""
  return state[np.asarray(action) - 1]


# --- vocabulary and tokenizer -------------------------------------------------------

def test_vocabulary_size_and_order():
  assert TOK.vocab_size == s5.VOCAB_SIZE == 188
  expected = {0: "<pad>", 1: "<unk>", 2: "<bos>", 3: "<eos>", 4: "a", 29: "z", 30: "A",
              55: "Z", 56: "0", 65: "9", 66: " ", 67: "|", 68: "<A_12345>",
              69: "<A_12354>", 187: "<A_54321>"}
  for i, tok in expected.items():
    assert TOK.id_to_token[i] == tok
    assert TOK.token_to_id[tok] == i
  perms = list(itertools.permutations((1, 2, 3, 4, 5)))
  for k, p in enumerate(perms):
    assert TOK.id_to_token[68 + k] == "<A_" + "".join(map(str, p)) + ">"
  assert (s5.PAD_ID, s5.UNK_ID, s5.BOS_ID, s5.EOS_ID) == (0, 1, 2, 3)
  assert (s5.SPACE_ID, s5.SEP_ID, s5.ACTION_OFFSET) == (66, 67, 68)
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
    ex = s5.generate_example(seed, 7)
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


# --- group algebra ------------------------------------------------------------------

def test_worked_composition_examples():
  assert s5.compose((1, 2, 3, 4, 5), (4, 1, 2, 3, 5)) == (4, 1, 2, 3, 5)
  assert s5.compose((4, 1, 2, 3, 5), (5, 3, 1, 2, 4)) == (5, 2, 4, 1, 3)
  idx = [s5.action_id(p) - 68 for p in [(4, 1, 2, 3, 5), (5, 3, 1, 2, 4)]]
  states = [s5.PERMUTATIONS[i] for i in s5.running_states(np.asarray(idx))]
  assert states == [(4, 1, 2, 3, 5), (5, 2, 4, 1, 3)]


def test_action_id_and_perm_of_id():
  assert s5.action_id((1, 2, 3, 4, 5)) == 68
  assert s5.action_id((5, 4, 3, 2, 1)) == 187
  for i in (68, 100, 187):
    assert s5.action_id(s5.perm_of_id(i)) == i
  with pytest.raises(ValueError, match="perm"):
    s5.action_id((1, 1, 2, 3, 4))
  with pytest.raises(ValueError, match="token_id"):
    s5.perm_of_id(67)


@pytest.mark.parametrize("group,order", [("S5", 120), ("S4", 24), ("A4", 12), ("S3", 6),
                                         ("Z2", 2)])
def test_group_order_and_closure(group, order):
  elems = s5.group_elements(group)
  assert len(elems) == len(set(elems)) == order
  assert elems[0] == (1, 2, 3, 4, 5)
  elem_set = set(elems)
  for a in elems:
    for b in elems:
      assert s5.compose(a, b) in elem_set


def test_group_members():
  assert set(s5.group_elements("Z2")) == {(1, 2, 3, 4, 5), (2, 1, 3, 4, 5)}
  assert all(p[3:] == (4, 5) for p in s5.group_elements("S3"))
  assert all(p[4] == 5 for p in s5.group_elements("S4"))

  def parity(p):
    return sum(p[i] > p[j] for i in range(5) for j in range(i + 1, 5)) % 2

  assert all(parity(p) == 0 for p in s5.group_elements("A4"))
  assert set(s5.group_elements("A4")) < set(s5.group_elements("S4"))
  assert (1, 3, 2, 4, 5) not in s5.group_elements("A4")


@pytest.mark.parametrize("group", s5.GROUPS)
def test_group_actions_and_states_stay_in_group(group):
  members = {s5.action_id(p) for p in s5.group_elements(group)}
  for seed in range(4):
    ex = s5.generate_example(seed, 20, group=group)
    mask = s5.state_positions(ex)
    assert set(ex["input_ids"][mask].tolist()) <= members
    assert set(ex["target_ids"][mask].tolist()) <= members
    wp = s5.generate_word_problem(seed, 20, group=group)
    assert set(wp["input_ids"].tolist()) <= members
    assert set(wp["target_ids"].tolist()) <= members


def test_actions_are_uniform_and_include_identity():
  wp = s5.generate_word_problem(0, 6000, group="S3")
  counts = np.bincount(wp["input_ids"] - 68, minlength=120)
  used = counts[counts > 0]
  assert len(used) == 6 and counts[0] > 0  # identity 12345 is drawn too
  assert used.min() > 850 and used.max() < 1150  # expected 1000 each


# --- example layout -----------------------------------------------------------------

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
    ex = s5.generate_example(seed, n)
    assert len(ex["input_ids"]) == 10 * n + 1
    assert s5.sequence_length(n) == 10 * n + 1
    dictionary, _ = _check_example(ex, n)
    assert len(dictionary) == n


def test_length_formula_other_shapes():
  ex = s5.generate_example(3, 5, value_len=2, dict_size=9)
  assert len(ex["input_ids"]) == 9 * 3 + 1 + 5 * 3
  assert s5.sequence_length(5, value_len=2, dict_size=9) == len(ex["input_ids"])
  dictionary, _ = _check_example(ex, 5, value_len=2)
  assert len(dictionary) == 9
  # Default N_dict is capped by the group's order.
  ex = s5.generate_example(0, 10, group="Z2")
  assert len(ex["input_ids"]) == 2 * 5 + 1 + 10 * 5 == s5.sequence_length(10, group="Z2")
  _check_example(ex, 10)


def test_value_slots_keyed_by_action_with_repeated_actions():
  # Z2 with 12 actions repeats keys many times: each repeat must retrieve the same value.
  ex = s5.generate_example(7, 12, group="Z2", value_len=3)
  dictionary, steps = _check_example(ex, 12, value_len=3)
  assert len({a for a, _ in steps}) == 2
  assert len(set(dictionary.values())) == 2  # distinct values for this seed


def test_dictionary_shuffled_and_topped_up():
  firsts = set()
  for seed in range(20):
    ex = s5.generate_example(seed, 3, dict_size=8)
    dictionary, steps = _check_example(ex, 3)
    assert len(dictionary) == 8
    used = [a for a, _ in steps]
    firsts.add(next(iter(dictionary)) in used)
  assert firsts == {True, False}  # the used keys are not always first


def test_no_retrieval_variant_targets_blanks():
  ex = s5.generate_example(11, 9, retrieval=False)
  _check_example(ex, 9, retrieval=False)
  ref = s5.generate_example(11, 9)
  np.testing.assert_array_equal(ex["input_ids"], ref["input_ids"])
  vmask = s5.value_positions(ex)
  assert (ex["target_ids"][vmask] == s5.SPACE_ID).all()
  assert (ref["target_ids"][vmask] != s5.SPACE_ID).all()
  smask = s5.state_positions(ex)
  np.testing.assert_array_equal(ex["target_ids"][smask], ref["target_ids"][smask])


@pytest.mark.parametrize("group", s5.GROUPS)
def test_full_dictionary(group):
  order = len(s5.group_elements(group))
  ex = s5.generate_example(2, 4, group=group, full_dictionary=True)
  dictionary, _ = _check_example(ex, 4)
  assert {_perm(k) for k in dictionary} == set(s5.group_elements(group))
  assert len(ex["input_ids"]) == order * 5 + 1 + 4 * 5
  assert s5.sequence_length(4, group=group, full_dictionary=True) == len(ex["input_ids"])


def test_masks():
  ex = s5.generate_example(5, 6)
  masks = s5.position_masks(ex)
  n_head = 6 * 5 + 1
  expected_state = np.zeros(61, bool)
  expected_state[n_head::5] = True
  np.testing.assert_array_equal(masks["state"], expected_state)
  np.testing.assert_array_equal(s5.state_positions(ex), expected_state)
  expected_value = np.zeros(61, bool)
  expected_value[n_head:] = True
  expected_value[n_head::5] = False
  np.testing.assert_array_equal(masks["value"], expected_value)
  np.testing.assert_array_equal(masks["answer"], np.arange(61) >= n_head)
  np.testing.assert_array_equal(masks["dictionary"], np.arange(61) < n_head)


def test_determinism_per_seed():
  a = s5.generate_example(123, 10)
  b = s5.generate_example(123, 10)
  c = s5.generate_example(124, 10)
  for k in a:
    np.testing.assert_array_equal(a[k], b[k])
  assert not np.array_equal(a["input_ids"], c["input_ids"])
  w1, w2 = s5.generate_word_problem(9, 30), s5.generate_word_problem(9, 30)
  np.testing.assert_array_equal(w1["input_ids"], w2["input_ids"])
  assert not np.array_equal(w1["input_ids"], s5.generate_word_problem(10, 30)["input_ids"])


def test_word_problem():
  wp = s5.generate_word_problem(4, 25)
  assert wp["input_ids"].shape == wp["target_ids"].shape == wp["control_flow"].shape == (25,)
  assert (wp["control_flow"] == 2).all()
  state = np.arange(1, 6)
  for a, s in zip(wp["input_ids"], wp["target_ids"]):
    state = _apply(state, s5.perm_of_id(int(a)))
    assert s5.perm_of_id(int(s)) == tuple(state)
  assert s5.state_positions(wp).all() and not s5.value_positions(wp).any()


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
    s5.generate_example(0, **kwargs)


def test_bad_arguments_word_problem():
  with pytest.raises(ValueError, match="num_actions"):
    s5.generate_word_problem(0, 0)
  with pytest.raises(ValueError, match="group"):
    s5.generate_word_problem(0, 3, group="A5")


# --- lengths, curriculum, source, batching ------------------------------------------

def test_length_curriculum():
  f = functools.partial(s5.length_curriculum, start=4, end=32, warmup_steps=100)
  assert f(0) == 4
  assert f(50) == 18
  assert f(99) == 31
  assert f(100) == 32 and f(10_000) == 32
  values = [f(i) for i in range(120)]
  assert values == sorted(values)
  assert s5.length_curriculum(5, 4, 32, 0) == 32
  with pytest.raises(ValueError, match="end"):
    s5.length_curriculum(0, 8, 4, 10)
  with pytest.raises(ValueError, match="warmup_steps"):
    s5.length_curriculum(0, 1, 4, -1)


def test_length_curriculum_hold():
  f = functools.partial(s5.length_curriculum, start=2, end=8, warmup_steps=60, hold_steps=100)
  assert [f(0), f(99)] == [2, 2]                  # held at start
  assert [f(100), f(130), f(159), f(160)] == [2, 5, 7, 8]   # then the same linear ramp
  assert s5.length_curriculum(100, 2, 8, 0, hold_steps=100) == 8
  with pytest.raises(ValueError, match="hold_steps"):
    s5.length_curriculum(0, 2, 8, 10, hold_steps=-1)


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
    n = int(s5.state_positions(ex).sum())
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
  assert (nr["target_ids"][s5.value_positions(nr)] == s5.SPACE_ID).all()
  fd = s5.S5Source(10, min_actions=3, max_actions=3, group="S3", full_dictionary=True)[0]
  assert len(fd["input_ids"]) == 6 * 5 + 1 + 3 * 5
  with pytest.raises(ValueError, match="dict_size"):
    s5.S5Source(10, min_actions=1, max_actions=8, dict_size=4)
  with pytest.raises(ValueError, match="max_actions"):
    s5.S5Source(10, min_actions=5, max_actions=4)
  with pytest.raises(ValueError, match="group"):
    s5.S5Source(10, group="S7")


def test_source_curriculum():
  curr = functools.partial(s5.length_curriculum, start=2, end=20, warmup_steps=10)
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
  exs = [s5.generate_example(s, n) for s, n in [(0, 1), (1, 3), (2, 2)]]
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
  assert s5.state_positions(batch).sum(axis=-1).tolist() == [1, 3, 2]
  assert s5.value_positions(batch).sum(axis=-1).tolist() == [4, 12, 8]
  assert (s5.pad_batch(exs, 31, pad_id=3)["input_ids"][0, 11:] == 3).all()


def test_pad_batch_refuses_too_long():
  exs = [s5.generate_example(0, 3), s5.generate_example(1, 4)]  # lengths 31, 41
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


def test_group_curriculum():
  stages = s5.parse_group_curriculum("Z2:100, S3:300", "S4")
  assert stages == (("Z2", 100), ("S3", 300))
  f = functools.partial(s5.group_curriculum, stages=stages, group="S4")
  assert [f(0), f(99), f(100), f(299), f(300), f(10**6)] == ["Z2", "Z2", "S3", "S3", "S4", "S4"]
  assert s5.parse_group_curriculum("", "S5") == ()
  for bad, match in [("Z2", "GROUP:STEP"), ("Q8:10", "GROUP:STEP"), ("Z2:x", "GROUP:STEP"),
                     ("Z2:10,S3:5", "increase"), ("Z2:10", "not a subgroup of A4"),
                     ("S4:10", "not a subgroup of S3"), ("Z2+Z2:10", "no repeats"),
                     ("Z2+Q8:10", "GROUP:STEP"), ("Z2+S4:10", "S4 is not a subgroup of S3")]:
    with pytest.raises(ValueError, match=match):
      s5.parse_group_curriculum(bad, "A4" if "A4" in match else "S3")


def test_source_group_schedule_draws_from_the_stage_group():
  sched = functools.partial(s5.group_curriculum, stages=(("Z2", 3),), group="S3")
  src = s5.S5Source(60, min_actions=4, max_actions=6, value_len=1, group="S3",
                    examples_per_step=10, group_schedule=sched)
  z2 = {s5.action_id(p) for p in s5.group_elements("Z2")}
  s3 = {s5.action_id(p) for p in s5.group_elements("S3")}
  assert [src.group_at(i) for i in (0, 29, 30, 59)] == ["Z2", "Z2", "S3", "S3"]
  for i in range(60):
    ex = src[i]
    keys = set(ex["input_ids"][ex["control_flow"] == 2].tolist()) & s3
    assert keys <= (z2 if i < 30 else s3)
    assert (ex["input_ids"] == src[i]["input_ids"]).all()          # still deterministic
  later = {a for i in range(30, 60) for a in src[i]["input_ids"].tolist()} & s3
  assert later - z2                                                  # S3 actions appear


def test_value_curriculum():
  stages = s5.parse_value_curriculum("1:100, 2:300", 4)
  assert stages == ((1, 100), (2, 300))
  f = functools.partial(s5.value_curriculum, stages=stages, value_len=4)
  assert [f(0), f(99), f(100), f(299), f(300), f(10**6)] == [1, 1, 2, 2, 4, 4]
  assert s5.parse_value_curriculum("", 2) == ()
  for bad, match in [("1", "V:STEP"), ("0:10", "1..2"), ("3:10", "1..2"), ("1:x", "V:STEP"),
                     ("1:10,2:5", "increase")]:
    with pytest.raises(ValueError, match=match):
      s5.parse_value_curriculum(bad, 2)


def test_source_value_schedule_stages_the_value_length():
  """Steps before the stage's end draw 1-character values, later ones `value_len`, each
  example still a pure function of its index and laid out as generate_example lays it."""
  sched = functools.partial(s5.value_curriculum, stages=((1, 3),), value_len=2)
  src = s5.S5Source(60, min_actions=2, max_actions=5, value_len=2, group="S3",
                    examples_per_step=10, value_schedule=sched)
  assert [src.value_len_at(i) for i in (0, 29, 30, 59)] == [1, 1, 2, 2]
  for i in range(60):
    ex, v = src[i], src.value_len_at(i)
    n = src.num_actions_of(i)
    assert len(ex["input_ids"]) == s5.sequence_length(n, value_len=v, group="S3")
    assert s5.value_positions(ex).sum() == n * v
    assert (ex["input_ids"] == src[i]["input_ids"]).all()


def test_a_mixed_stage_draws_each_example_from_one_of_its_groups():
  """"Z2+S3:N": each example of the stage draws its group, half and half, as a pure
  function of (seed, index); every example's actions and dictionary come from that group."""
  assert s5.parse_group_curriculum("Z2+S3:2000", "S3") == (("Z2+S3", 2000),)
  sched = functools.partial(s5.group_curriculum, stages=(("Z2+S3", 40),), group="S3")
  src = s5.S5Source(800, min_actions=1, max_actions=8, value_len=1, group="S3",
                    examples_per_step=10, group_schedule=sched)
  z2 = {s5.action_id(p) for p in s5.group_elements("Z2")}
  groups = [src.group_at(i) for i in range(400)]
  assert set(groups) == {"Z2", "S3"} and 160 < groups.count("Z2") < 240
  assert groups == [src.group_at(i) for i in range(400)]
  assert s5.S5Source(800, group="S3", examples_per_step=10, group_schedule=sched,
                     base_seed=1).group_at(0) in ("Z2", "S3")
  for i in range(0, 400, 7):
    ex = src[i]
    actions = set(ex["input_ids"][ex["input_ids"] >= s5.ACTION_OFFSET].tolist())
    if groups[i] == "Z2":
      assert actions <= z2                             # keys and actions from Z2 only
    n_dict = int(np.sum(ex["control_flow"] == 1) - 1) // 2
    assert n_dict <= (2 if groups[i] == "Z2" else 6)
  assert {src.group_at(i) for i in range(400, 800)} == {"S3"}          # after the stage


def test_control_flow_from_tokens_is_the_generated_one():
  examples = [s5.generate_example(seed=i, num_actions=n, value_len=3)
              for i, n in enumerate((1, 4, 9))]
  for ex in examples:
    np.testing.assert_array_equal(s5.control_flow(ex["input_ids"]), ex["control_flow"])
  batch = s5.pad_batch(examples, 100)
  np.testing.assert_array_equal(s5.control_flow(batch["input_ids"]), batch["control_flow"])
  wp = s5.generate_word_problem(seed=3, num_actions=5)
  np.testing.assert_array_equal(s5.control_flow(wp["input_ids"]), wp["control_flow"])
  with pytest.raises(ValueError, match="input_ids"):
    s5.control_flow(np.zeros((1, 2, 3), np.int32))
