"""HotpotQA answer metrics (official hotpot_evaluate_v1 rules) and answer extraction:
hand-computed cases, and parity with an independent Counter-based rewrite."""

from __future__ import annotations

import collections
import random
import re
import string

import pytest

from t2mlr_jax.eval import hotpotqa as H

# --- normalize_answer / exact_match ------------------------------------------------

@pytest.mark.parametrize("text, want", [
  ("The Eiffel Tower", "eiffel tower"),
  ("U.S.A.", "usa"),
  ("  a   cat\tand\nAN apple ", "cat and apple"),
  ("theatre another anthem", "theatre another anthem"),     # articles only as whole words
  ("the, a; an!", ""),
  ("Rock-'n'-roll", "rocknroll"),                           # punctuation goes before articles
  ("A-the b", "athe b"),                                    # ...so "a-the" becomes one word
  ("", ""),
])
def test_normalize_answer(text, want):
  assert H.normalize_answer(text) == want


@pytest.mark.parametrize("pred, gold, want", [
  ("The Eiffel Tower", "eiffel tower", True),
  ("U.S.A.", "USA", True),
  ("yes", "yes.", True),
  ("  red   dog ", "Red dog", True),
  ("", "Paris", False),
  ("Paris, France", "Paris", False),
  ("", "", True),                   # official: both normalize to ""
])
def test_exact_match(pred, gold, want):
  assert H.exact_match(pred, gold) is want


# --- f1 -----------------------------------------------------------------------------

def test_f1_partial_overlap_by_hand():
  # [big, red, dog] vs [red, dog, barked]: 2 common, P = R = F1 = 2/3
  f, p, r = H.f1("the big red dog", "red dog barked")
  assert (f, p, r) == pytest.approx((2 / 3, 2 / 3, 2 / 3))


def test_f1_uneven_precision_recall():
  # [new, york, city] vs [york]: P = 1/3, R = 1, F1 = 2 * (1/3) / (4/3) = 1/2
  assert H.f1("New York City", "York") == pytest.approx((0.5, 1 / 3, 1.0))


def test_f1_counts_repeated_tokens_as_a_multiset():
  # [dog, dog, dog] vs [dog, cat]: one dog matches, P = 1/3, R = 1/2, F1 = 0.4
  assert H.f1("dog dog dog", "dog cat") == pytest.approx((0.4, 1 / 3, 0.5))
  # [dog, dog] vs [dog, dog, cat]: two match, P = 1, R = 2/3, F1 = 0.8
  assert H.f1("dog dog", "dog dog cat") == pytest.approx((0.8, 1.0, 2 / 3))


@pytest.mark.parametrize("pred, gold", [
  ("yes", "no"),
  ("no", "yes"),
  ("yes it is", "yes"),             # gold in {yes, no, noanswer} and differs
  ("yes", "yes it is"),             # prediction in the set and differs
  ("noanswer", "no answer"),
  ("No.", "no way"),
])
def test_f1_yes_no_special_case_is_zero(pred, gold):
  assert H.f1(pred, gold) == (0.0, 0.0, 0.0)


def test_f1_yes_matches_itself():
  assert H.f1("Yes.", "yes") == (1.0, 1.0, 1.0)
  assert H.exact_match("Yes.", "yes")


@pytest.mark.parametrize("pred, gold", [("", "Paris"), ("Paris", ""), ("", ""),
                                        ("the", "a"), ("London", "Paris")])
def test_f1_without_common_tokens_is_zero(pred, gold):
  assert H.f1(pred, gold) == (0.0, 0.0, 0.0)


def test_whitespace_collapse_does_not_change_scores():
  assert H.f1("red \t\n dog", "red dog") == (1.0, 1.0, 1.0)


# --- parity with an independent rewrite ----------------------------------------------

def _ref_normalize(s):
  s = s.lower()
  s = "".join(ch for ch in s if ch not in set(string.punctuation))
  s = re.sub(r"\b(a|an|the)\b", " ", s)
  return " ".join(s.split())


def _ref_f1(pred, gold):
  np_, ng = _ref_normalize(pred), _ref_normalize(gold)
  zero = (0, 0, 0)
  if np_ in ["yes", "no", "noanswer"] and np_ != ng:
    return zero
  if ng in ["yes", "no", "noanswer"] and np_ != ng:
    return zero
  pt, gt = np_.split(), ng.split()
  common = collections.Counter(pt) & collections.Counter(gt)
  same = sum(common.values())
  if same == 0:
    return zero
  p, r = same / len(pt), same / len(gt)
  return (2 * p * r) / (p + r), p, r


_WORDS = ["the", "The", "a", "An", "an", "yes", "Yes.", "no", "No!", "noanswer", "red", "dog",
          "dog,", "U.S.", "Paris", "paris", "theatre", "anthem", "(1999)", "e-mail", "ünïcode",
          "a.", "'the'", "--", "  ", "\t", ""]


def _random_text(rng):
  return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(0, 5)))


def test_parity_with_counter_reference_on_random_strings():
  rng = random.Random(0)
  pairs = [(_random_text(rng), _random_text(rng)) for _ in range(200)]
  pairs += [(w, v) for w in ("yes", "no", "noanswer", "") for v in ("yes", "No.", "", "dog")]
  for pred, gold in pairs:
    assert H.normalize_answer(pred) == _ref_normalize(pred), pred
    assert H.exact_match(pred, gold) == (_ref_normalize(pred) == _ref_normalize(gold))
    assert H.f1(pred, gold) == pytest.approx(_ref_f1(pred, gold)), (pred, gold)


# --- extract_answer -------------------------------------------------------------------

@pytest.mark.parametrize("text, want", [
  (" Paris", "Paris"),
  (" Paris\nQuestion: what next?", "Paris"),      # the first line only
  ("\n\n  42 \n", "42"),                           # blank lines before the answer skipped
  ("Both lighthouses are in Norland.\nAnswer: yes", "yes"),
  ("Answer: no\nAnswer: yes\nmore", "yes"),        # after the last marker
  ("Answer:\n Grey Harbour\n", "Grey Harbour"),    # the marker's line is empty
  ("answer: lower-case marker", "answer: lower-case marker"),   # the marker is case-sensitive
  ("", ""),
  ("  \n \n", ""),
  ("Answer:", ""),
])
def test_extract_answer(text, want):
  assert H.extract_answer(text) == want


def test_extract_answer_cuts_at_eos():
  assert H.extract_answer(" Paris<|endoftext|>Answer: Rome", eos="<|endoftext|>") == "Paris"
  assert H.extract_answer(" Paris<|endoftext|>junk") == "Paris<|endoftext|>junk"


def test_extract_answer_is_idempotent_on_answers():
  for a in ["Paris", "the Velmar River", "yes", "Élodie Brandt"]:
    assert H.extract_answer(H.extract_answer(" " + a)) == a


# --- HotpotQAMetrics ------------------------------------------------------------------

def test_metrics_means():
  m = H.HotpotQAMetrics()
  assert m.result() == {"em": 0.0, "f1": 0.0, "precision": 0.0, "recall": 0.0,
                        "num_examples": 0}
  assert m.update("The Eiffel Tower", "eiffel tower") == {"em": 1.0, "f1": 1.0,
                                                          "precision": 1.0, "recall": 1.0}
  m.update("the big red dog", "red dog barked")     # em 0, 2/3 each
  m.update("yes", "no")                              # all 0
  m.update("dog dog dog", "dog cat")                 # em 0, f1 0.4, p 1/3, r 1/2
  got = m.result()
  assert got["num_examples"] == 4
  assert got["em"] == pytest.approx(1 / 4)
  assert got["f1"] == pytest.approx((1 + 2 / 3 + 0 + 0.4) / 4)
  assert got["precision"] == pytest.approx((1 + 2 / 3 + 0 + 1 / 3) / 4)
  assert got["recall"] == pytest.approx((1 + 2 / 3 + 0 + 0.5) / 4)
