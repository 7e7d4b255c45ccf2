"""The default job (configs/s5_retrieval.py, any of its variants) with the `echo`
recurrence of docs/examples/echo.py instead of T2MLR, over the same span and Jacobi
depths (`model.schedule_options`, whatever the type). Needs
--user_module=docs/examples/echo.py (it registers the type this config names)."""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "configs"))
from t2mlr_jax.train.config import recurrence_config  # noqa: E402

import s5_retrieval  # noqa: E402


def get_config(variant: str = ""):
  c = s5_retrieval.get_config(variant)
  c.name = "s5_echo"
  r = c.model.recurrence      # the schedule's options (model.schedule_options) stay
  c.model.recurrence = recurrence_config("echo", l_start=r.l_start, l_end=r.l_end)
  return c
