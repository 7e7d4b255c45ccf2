"""The training schedules: parallel approximations of the sequential recurrence, each one
file, each for every recurrence type (they call only the interface of
`recurrence/__init__.py`, through `span.py`). Adding a schedule = a file here with its
function and OPTIONS + one row of SCHEDULES; the options' defaults are fields of every
recurrence config (`config.ScheduleOptions`).

    jacobi        parallel fixed-point sweeps, gradient through the last D_b (jacobi.py)
    interleaved   pass 0, then S passes over t ≡ p−1 (mod S)             (interleaved.py)
    chunked       pass 0, then S passes over contiguous chunks            (interleaved.py)
    multi_refine  pass 0, then K full passes, each reading the last       (multi_refine.py)
"""

from __future__ import annotations

from typing import Callable, NamedTuple

from t2mlr_jax.model.schedules import interleaved, jacobi, multi_refine


class Schedule(NamedTuple):
  run: Callable          # (params, cfg, tokens, inp, options, hidden) -> ModeOut
  options: tuple         # the recurrence-config fields it reads (per-call overridable)
  hidden: bool           # can return hidden states instead of logits (a chunked loss)


SCHEDULES = {
    "jacobi": Schedule(jacobi.run, jacobi.OPTIONS, True),
    "interleaved": Schedule(interleaved.run_interleaved, interleaved.OPTIONS, False),
    "chunked": Schedule(interleaved.run_chunked, interleaved.OPTIONS, False),
    "multi_refine": Schedule(multi_refine.run, multi_refine.OPTIONS, False),
}
