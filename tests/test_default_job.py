"""The default job's numerics and data stream: its first 50 steps against committed losses.

A change that moves the model's numerics (a kernel, a reduction order, an init) or the
data stream (generator, curriculum, seed handling) fails here in a minute instead of
showing up, if at all, as a different accuracy at the end of the full job. If the change
is meant, regenerate the values with `python tests/_default_job_losses.py`, rerun the
default job to the end (`.ci/run`'s last step does) and say so in the commit.
"""

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _default_job_losses as ref  # noqa: E402


def test_default_job_first_50_steps_match_the_committed_losses():
  fixture = json.load(open(ref.FIXTURE))
  losses = ref.first_losses()
  np.testing.assert_allclose(
      losses, fixture["losses"], rtol=ref.RTOL,
      err_msg="the default job's first 50 losses moved: a change to the model's numerics or "
              "to the data stream. If meant, run `python tests/_default_job_losses.py` and "
              "the full default job, and say so in the commit")
