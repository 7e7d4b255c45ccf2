"""Refactor guard: T2MLR's outputs equal, bit for bit, what the code computed before the
recurrence interface existed, and LRT's (every mode, schedule loss and gradient, left-
padded generate) what it computed before the schedules shared that interface
(tests/fixtures/t2mlr_reference.*, `_t2mlr_reference.py`)."""

import json
import os

import numpy as np
import pytest

import _t2mlr_reference as ref

FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "t2mlr_reference")


@pytest.mark.slow       # about a minute: runs in .ci/run's slow step
def test_every_output_is_bitwise_equal():
  stored = dict(np.load(FIXTURE + ".npz"))
  with open(FIXTURE + ".json") as f:
    expected = json.load(f)
  got = ref.outputs(ref.compute_all(ref.stored_params(stored)))
  assert set(got) == set(expected)
  moved = {k: (expected[k]["max_abs"], got[k]["max_abs"]) for k in expected
           if got[k] != expected[k]}
  assert not moved, f"{len(moved)} outputs moved (max|x| before, after): {dict(list(moved.items())[:5])}"
