"""TensorStore's failed reads after a failed restore: the noise they leave is quieted (and
nothing else), and the error names the array that could not be read."""

import os
import subprocess
import sys

from t2mlr_jax.train.tensorstore_reads import read_failure

from _util import REPO_ROOT

ROOT = REPO_ROOT


_CLOSED_LOOP_READS = """
import asyncio, sys
import numpy as np
import tensorstore as ts
from t2mlr_jax.train import tensorstore_reads
if sys.argv[1] == "quiet":
  tensorstore_reads.quiet_failed_reads()
arr = ts.open({"driver": "zarr", "kvstore": {"driver": "memory"}}, dtype=ts.float32,
              shape=[2000, 2000], create=True).result()
arr.write(np.ones((2000, 2000), np.float32)).result()
loop = asyncio.new_event_loop()
async def start_reads():   # reads bound to the loop, left pending as a failed restore leaves them
  [asyncio.ensure_future(arr.read()) for _ in range(16)]
  await asyncio.sleep(0)
loop.run_until_complete(start_reads())
loop.close()
import time; time.sleep(2)   # their callbacks arrive on TensorStore's threads, loop closed
class Dropped:
  def __del__(self):
    raise ValueError("kept")
Dropped()
"""


def test_reads_left_pending_by_a_failed_restore_print_nothing_after_the_error(tmp_path):
  """TensorStore reports callbacks into Orbax's closed event loop through
  sys.unraisablehook; how many arrive before exit depends on timing (CI saw a page of them
  where this machine saw none), so they are made here on purpose."""
  script = tmp_path / "reads.py"
  script.write_text(_CLOSED_LOOP_READS)
  def run(how):
    # the script runs from tmp_path: this checkout's package first on its path
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)}
    return subprocess.run([sys.executable, str(script), how], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env=env).stderr
  assert "Event loop is closed" in run("loud")        # the noise exists without the hook
  quiet = run("quiet")
  assert "Event loop is closed" not in quiet, quiet[-2000:]
  assert "ValueError: kept" in quiet                   # other unraisable errors still print


def test_read_failure_names_the_array_and_tensorstores_reason():
  inner = ValueError('Error reading "layers.mlp.w/0.0" in OCDBT database at local file '
                     '"/wd/checkpoints/60/params/": DATA_LOSS: Error decoding; frame header')
  try:
    try:
      raise inner
    except ValueError as e:
      raise RuntimeError("restore failed") from e
  except RuntimeError as error:
    assert read_failure(error) == "array params/layers.mlp.w (DATA_LOSS: Error decoding)"


def test_read_failure_without_a_named_array_is_the_innermost_message_on_one_line():
  error = RuntimeError("restore failed")
  error.__context__ = OSError("disk\n   gone")
  assert read_failure(error) == "disk gone"
  assert read_failure(ValueError("x" * 400)) == "x" * 300
