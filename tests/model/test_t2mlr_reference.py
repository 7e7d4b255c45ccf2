"""Refactor guard: T2MLR's and LRT's outputs (every mode's logits and aux, schedule losses
and gradients, left-padded generate) equal what the code computed before the refactors
they guard (tests/fixtures/t2mlr_reference.*, `_t2mlr_reference.py`), within the fixture's
measured cross-CPU margin. For a refactor meant to keep every bit, regenerate the fixture
on the machine you refactor on first, then run with T2MLR_REFERENCE_BITWISE=1."""

import json
import os

import numpy as np
import pytest

import _t2mlr_reference as ref
from _util import TESTS_DIR

FIXTURE = os.path.join(TESTS_DIR, "fixtures", "t2mlr_reference")


def _fixture():
  with open(FIXTURE + ".json") as f:
    return json.load(f)


def test_fixture_margins_justify_the_tolerance():
  """The tolerance sits above what another CPU's code generation did to the outputs and
  below what a 1e-3 change of one weight matrix did."""
  fx = _fixture()
  assert fx["rtol"] == ref.RTOL
  isa = {k: v for k, v in fx["margins"].items() if k.startswith("xla_cpu_max_isa")}
  assert isa and max(isa.values()) < ref.RTOL / 10
  bump = [v for k, v in fx["margins"].items() if k.startswith("mlp/down")]
  assert bump and bump[0] > len(fx["outputs"]) // 3


def test_relative_change_of_fingerprints():
  a = np.linspace(-1, 1, 50, dtype=np.float32)
  fa = ref.fingerprint("k", a)
  assert ref.relative_change(fa, ref.fingerprint("k", a)) == 0.0
  ulp = ref.relative_change(fa, ref.fingerprint("k", np.nextafter(a, np.float32(2))))
  assert 0 < ulp < 1e-6
  assert ref.relative_change(fa, ref.fingerprint("k", a * np.float32(1.001))) > ref.RTOL
  assert ref.relative_change(fa, ref.fingerprint("k", a[::-1].copy())) > ref.RTOL
  toks = np.arange(6, dtype=np.int32)
  assert ref.relative_change(ref.fingerprint("t", toks),
                             ref.fingerprint("t", toks[::-1].copy())) == float("inf")


@pytest.mark.slow       # about 5 minutes here: runs in .ci/run's slow step
def test_every_output_matches_the_reference():
  fx = _fixture()
  expected = fx["outputs"]
  stored = dict(np.load(FIXTURE + ".npz"))
  got = ref.outputs(ref.compute_all(ref.stored_params(stored)))
  assert set(got) == set(expected)
  change = {k: ref.relative_change(expected[k], got[k]) for k in expected}
  if os.environ.get("T2MLR_REFERENCE_BITWISE") == "1":
    moved = {k: c for k, c in change.items() if c > 0}
    assert not moved, (f"{len(moved)} outputs moved bit-wise (relative change): "
                       f"{dict(list(moved.items())[:5])}")
  beyond = {k: c for k, c in change.items() if c > ref.RTOL}
  assert not beyond, (f"{len(beyond)} outputs moved beyond rtol {ref.RTOL} "
                      f"(relative change): {dict(list(beyond.items())[:5])}")
