"""The default job (configs/s5_retrieval.py, any of its variants) with the `two_step`
recurrence of docs/examples/two_step.py (a state of two vectors) instead of T2MLR, over the
same span and Jacobi depths. Needs --user_module=docs/examples/two_step.py."""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "configs"))
from t2mlr_jax.train.config import recurrence_config  # noqa: E402

import s5_retrieval  # noqa: E402


def get_config(variant: str = ""):
  c = s5_retrieval.get_config(variant)
  c.name = "s5_two_step"
  r = c.model.recurrence      # the schedule's options (model.schedule_options) stay
  c.model.recurrence = recurrence_config("two_step", l_start=r.l_start, l_end=r.l_end)
  return c
