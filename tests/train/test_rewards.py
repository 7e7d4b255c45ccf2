"""The built-in RL rewards on edge cases, and a user's reward registered by name."""

import pytest

from t2mlr_jax.registry import REWARDS, Reward
from t2mlr_jax.train import grpo


def score(name, completion, response, prompt=""):
  return REWARDS.get(name).fn(completion, {"prompt": prompt, "response": response})


def test_exact_ignores_whitespace_only():
  assert score("exact", " a -> b  -> c\n", "a -> b -> c") == 1.0
  assert score("exact", "a -> c -> b", "a -> b -> c") == 0.0
  assert score("exact", "", "a") == 0.0


@pytest.mark.parametrize("completion,expected", [
    ("z=l\nl=v\nv=1\n### 1", 1.0), ("### 1.0", 1.0), ("#### 1", 1.0), ("### 2", 0.0),
    ("1", 1.0), ("the answer\n2", 0.0), ("", 0.0)])
def test_gsm8k_reads_the_marked_number(completion, expected):
  """GSM8K-Aug's and Variable Assignment's responses end `### N`; without a marker the
  last line is read, as the GSM8K-Aug evaluation does."""
  assert score("gsm8k", completion, "z=l\nl=v\nv=1\n### 1") == expected


def test_math_compares_boxed_answers_after_normalisation():
  assert score("math", r"so \boxed{\frac12}", r"\boxed{\frac{1}{2}}") == 1.0
  assert score("math", r"\boxed{0.5}", r"\boxed{\frac{1}{2}}") in (0.0, 1.0)
  assert score("math", r"\boxed{3}", r"\boxed{2}") == 0.0
  assert score("math", "no box", r"\boxed{2}") == 0.0


def test_prosqa_scores_the_last_marked_line():
  gold = "Tom is a wumpus.\nEvery wumpus is a yimpus.\n### Tom is a yimpus."
  assert score("prosqa", "Tom is a zumpus.\n### Tom is a yimpus.", gold) == 1.0
  assert score("prosqa", "### Tom is a yimpus\n### Tom is a zumpus.", gold) == 0.0
  assert score("prosqa", "Tom is a yimpus.", gold) == 0.0       # no ### line


def test_hotpotqa_is_the_official_f1_of_the_answer():
  assert score("hotpotqa", " The Eiffel Tower", " Eiffel Tower") == 1.0
  assert score("hotpotqa", "reasoning...\\nAnswer: yes", " yes") == 1.0
  assert 0 < score("hotpotqa", " Eiffel", " Eiffel Tower") < 1
  assert score("hotpotqa", "", " no") == 0.0


def test_a_users_reward_is_chosen_by_name():
  REWARDS.register(Reward(name="test_length", fn=lambda c, r: float(len(c)), source=__name__))
  try:
    assert grpo.GRPOConfig(reward="test_length").reward == "test_length"
    assert score("test_length", "abc", "") == 3.0
  finally:
    REWARDS.unregister("test_length")
  with pytest.raises(ValueError, match=r"rl\.reward='test_length' is invalid: allowed one of"):
    grpo.GRPOConfig(reward="test_length")
