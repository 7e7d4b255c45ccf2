"""The S5 training curricula and their stage parsers (t2mlr_jax/data/s5_curricula.py)."""

import functools

import pytest

from t2mlr_jax.data import s5_curricula


def test_length_curriculum():
  f = functools.partial(s5_curricula.length_curriculum, start=4, end=32, warmup_steps=100)
  assert f(0) == 4
  assert f(50) == 18
  assert f(99) == 31
  assert f(100) == 32 and f(10_000) == 32
  values = [f(i) for i in range(120)]
  assert values == sorted(values)
  assert s5_curricula.length_curriculum(5, 4, 32, 0) == 32
  with pytest.raises(ValueError, match="end"):
    s5_curricula.length_curriculum(0, 8, 4, 10)
  with pytest.raises(ValueError, match="warmup_steps"):
    s5_curricula.length_curriculum(0, 1, 4, -1)


def test_length_curriculum_hold():
  f = functools.partial(s5_curricula.length_curriculum, start=2, end=8, warmup_steps=60,
                        hold_steps=100)
  assert [f(0), f(99)] == [2, 2]                  # held at start
  assert [f(100), f(130), f(159), f(160)] == [2, 5, 7, 8]   # then the same linear ramp
  assert s5_curricula.length_curriculum(100, 2, 8, 0, hold_steps=100) == 8
  with pytest.raises(ValueError, match="hold_steps"):
    s5_curricula.length_curriculum(0, 2, 8, 10, hold_steps=-1)


def test_group_curriculum():
  stages = s5_curricula.parse_group_curriculum("Z2:100, S3:300", "S4")
  assert stages == (("Z2", 100), ("S3", 300))
  f = functools.partial(s5_curricula.group_curriculum, stages=stages, group="S4")
  assert [f(0), f(99), f(100), f(299), f(300), f(10**6)] == ["Z2", "Z2", "S3", "S3", "S4", "S4"]
  assert s5_curricula.parse_group_curriculum("", "S5") == ()
  for bad, match in [("Z2", "GROUP:STEP"), ("Q8:10", "GROUP:STEP"), ("Z2:x", "GROUP:STEP"),
                     ("Z2:10,S3:5", "increase"), ("Z2:10", "not a subgroup of A4"),
                     ("S4:10", "not a subgroup of S3"), ("Z2+Z2:10", "no repeats"),
                     ("Z2+Q8:10", "GROUP:STEP"), ("Z2+S4:10", "S4 is not a subgroup of S3")]:
    with pytest.raises(ValueError, match=match):
      s5_curricula.parse_group_curriculum(bad, "A4" if "A4" in match else "S3")


def test_value_curriculum():
  stages = s5_curricula.parse_value_curriculum("1:100, 2:300", 4)
  assert stages == ((1, 100), (2, 300))
  f = functools.partial(s5_curricula.value_curriculum, stages=stages, value_len=4)
  assert [f(0), f(99), f(100), f(299), f(300), f(10**6)] == [1, 1, 2, 2, 4, 4]
  assert s5_curricula.parse_value_curriculum("", 2) == ()
  for bad, match in [("1", "V:STEP"), ("0:10", "1..2"), ("3:10", "1..2"), ("1:x", "V:STEP"),
                     ("1:10,2:5", "increase")]:
    with pytest.raises(ValueError, match=match):
      s5_curricula.parse_value_curriculum(bad, 2)
