"""The training schedules: parallel approximations of the sequential recurrence, each one
file, each for every recurrence type (they call only the interface of
`recurrence/__init__.py`, through `span.py`). A schedule is one `registry.Schedule`
(its run function, its options dataclass with their defaults and checks, FLOPs, pass
losses), registered at the end of its file; a model config sets the options in
`schedule_options` (`config.ScheduleOptions`), whatever its recurrence type.
A user's schedule registers the same way from its own file (`--user_module`).

    jacobi        parallel fixed-point sweeps, gradient through the last D_b (jacobi.py)
    interleaved   pass 0, then S passes over t ≡ p−1 (mod S)             (interleaved.py)
    chunked       pass 0, then S passes over contiguous chunks            (interleaved.py)
    multi_refine  pass 0, then K full passes, each reading the last       (multi_refine.py)
"""

from __future__ import annotations

# the built-in schedules register themselves on import, in the order modes are listed
from t2mlr_jax.model.schedules import jacobi  # noqa: F401  (first: T2MLR's, the default's)

# isort: split
from t2mlr_jax.model.schedules import interleaved, multi_refine  # noqa: F401
from t2mlr_jax.registry import SCHEDULES, Schedule

__all__ = ["SCHEDULES", "Schedule", "register"]


def register(entry: Schedule) -> Schedule:
  """Register a training schedule; `forward`, `loss`, `train.mode` and `evaluate --mode`
  then take it by name for every recurrence type."""
  return SCHEDULES.register(entry)
