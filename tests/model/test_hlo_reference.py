"""Refactor guard: the optimized programs of the train steps (plain, Jacobi 16/4, LRT
interleaved S = 2) and decode steps (T2MLR, LRT) equal those of the code before the
schedules shared one interface (tests/fixtures/hlo/, `_hlo_reference.py`). The canonical
text drops names and source locations, and is the same on this host's code for AVX2, AVX
and SSE4.2 (checked when the fixture was made)."""

import difflib
import os

import pytest

import _hlo_reference as ref
from _util import TESTS_DIR

FIXTURE = os.path.join(TESTS_DIR, "fixtures", "hlo")


@pytest.mark.slow       # five compiles: runs in .ci/run's slow step
def test_every_program_is_unchanged():
  got = ref.programs()
  assert sorted(got) == sorted(f[:-len(".hlo.gz")] for f in os.listdir(FIXTURE))
  changed = {}
  for name, text in got.items():
    expected = ref.read(FIXTURE, name)
    if text != expected:
      diff = difflib.unified_diff(expected.splitlines(), text.splitlines(), lineterm="", n=1)
      changed[name] = "\n".join(list(diff)[:12])
  assert not changed, "programs changed:\n" + "\n\n".join(f"{k}:\n{v}" for k, v in
                                                         changed.items())


def test_canonical_text_ignores_names_and_locations():
  a = ('HloModule jit_step, entry_computation_layout={(f32[2]{0})->f32[2]{0}}\n\n'
       'FileNames\n1 "a.py"\n\nStackFrames\n1 {file_location_id=1}\n\n'
       'ENTRY %main.3 (x.1: f32[2]) -> f32[2] {\n'
       '  %x.1 = f32[2]{0} parameter(0), metadata={op_name="x" source_file="a.py"}\n'
       '  ROOT %add.2 = f32[2]{0} add(%x.1, %x.1), metadata={op_name="jit(f)/add"}\n}')
  b = (a.replace("jit_step", "jit_other").replace("x.1", "state.7").replace("a.py", "b.py")
       .replace("add.2", "add.9"))
  assert ref.canonical(a) == ref.canonical(b)
  assert "metadata" not in ref.canonical(a) and "FileNames" not in ref.canonical(a)
  assert ref.canonical(a.replace("add(", "multiply(")) != ref.canonical(a)
