"""Refactor guard: T2MLR's outputs equal, bit for bit, what the code computed before the
recurrence interface existed (tests/fixtures/t2mlr_reference.npz, `_t2mlr_reference.py`)."""

import os

import numpy as np
import pytest

import _t2mlr_reference as ref

NPZ = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "t2mlr_reference.npz")


@pytest.fixture(scope="module")
def stored():
  return dict(np.load(NPZ))


@pytest.fixture(scope="module")
def recomputed(stored):
  return ref.compute_all(ref.stored_params(stored))


def test_every_output_is_bitwise_equal(stored, recomputed):
  assert set(recomputed) == set(stored)
  differ = [k for k in stored if not np.array_equal(stored[k], recomputed[k])]
  assert not differ, f"{len(differ)} outputs moved, e.g. {differ[:5]}"
