"""The generated-examples source: example i a pure function of (base_seed, i), redrawn while
longer than `limit`, and one error naming `limit` when no draw fits."""

import numpy as np
import pytest

from t2mlr_jax.data.generated import MAX_DRAWS, GeneratedSource


def _make(seed):
  n = int(np.random.default_rng(seed).integers(10, 40))
  return {"input_ids": np.arange(n), "target_ids": np.arange(n), "control_flow": np.ones(n)}


def test_examples_longer_than_the_limit_are_drawn_again_deterministically():
  free, capped = GeneratedSource(50, _make, base_seed=3), GeneratedSource(50, _make, base_seed=3,
                                                                           limit=20)
  lengths = [len(capped[i]["input_ids"]) for i in range(50)]
  assert max(lengths) <= 20 and lengths == [len(capped[i]["input_ids"]) for i in range(50)]
  same = [i for i in range(50) if len(free[i]["input_ids"]) <= 20]
  assert same and all(len(free[i]["input_ids"]) == lengths[i] for i in same)   # first draws kept
  assert repr(capped) == "GeneratedSource(num_examples=50, base_seed=3, limit=20)"


def test_bad_arguments_and_a_limit_no_draw_meets_are_named():
  with pytest.raises(ValueError, match=r"limit=8 is invalid: allowed integers >= 16"):
    GeneratedSource(4, _make, limit=8)
  with pytest.raises(ValueError, match=r"num_examples=0 is invalid"):
    GeneratedSource(0, _make)
  with pytest.raises(IndexError, match=r"index=4 is out of range: allowed 0..3"):
    GeneratedSource(4, _make)[4]
  with pytest.raises(ValueError, match=rf"limit=16 is invalid for these knobs: {MAX_DRAWS} "
                                       "draws of example 0 were all longer"):
    GeneratedSource(4, lambda seed: _make(seed) | {"input_ids": np.arange(30)}, limit=16)[0]
