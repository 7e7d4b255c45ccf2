"""The S5 training curricula: the maximum length, the group and the value length of a
training step, and the parsers of the config's stage strings ("Z2:1000,S3:3000").

S5Source (s5.py) reads them as functions of the step, e.g.
functools.partial(length_curriculum, start=..., end=..., warmup_steps=...).
"""

from __future__ import annotations

from typing import Any, Sequence

from t2mlr_jax.data.s5_group import GROUPS, _check_positive, group_elements


def length_curriculum(step: int, start: int, end: int, warmup_steps: int,
                      hold_steps: int = 0) -> int:
  """Maximum length at `step`: `start` for the first `hold_steps` steps, then linear from
  `start` to `end` over the next `warmup_steps` steps (rounded down), then `end`.

  warmup_steps = 0 means `end` right after the hold. The hold lets a short-sequence
  circuit form first: for S5-Retrieval short sequences also mean small dictionaries,
  where the lookup is learned (docs/experiments.md).
  Use with S5Source via functools.partial(length_curriculum, start=..., end=...,
  warmup_steps=..., hold_steps=...).
  """
  _check_positive("start", start)
  _check_positive("end", end)
  if end < start:
    raise ValueError(f"end={end} is invalid: allowed >= start={start}")
  if warmup_steps < 0:
    raise ValueError(f"warmup_steps={warmup_steps} is invalid: allowed >= 0")
  if hold_steps < 0:
    raise ValueError(f"hold_steps={hold_steps} is invalid: allowed >= 0")
  if step < 0:
    raise ValueError(f"step={step} is invalid: allowed >= 0")
  if step < hold_steps:
    return start
  step -= hold_steps
  if warmup_steps == 0 or step >= warmup_steps:
    return end
  return start + ((end - start) * step) // warmup_steps


def parse_group_curriculum(text: str, group: str) -> tuple[tuple[str, int], ...]:
  """Stages "Z2:2000" or "Z2:1000,S3:3000" (train on Z2 up to step 1000, then S3 up to
  3000, then `group`). A stage may mix groups, "Z2+S3:2000": each of its examples draws
  its group uniformly from those listed. Each stage's groups must be subgroups of `group`
  (so their action tokens and dictionaries are a subset) and the steps must increase."""
  stages, last = [], -1
  for part in filter(None, (x.strip() for x in text.split(","))):
    name, sep, until = part.partition(":")
    names = name.split("+")
    if (not all(n in GROUPS for n in names) or len(set(names)) != len(names) or not sep
        or not until.strip().isdigit()):
      raise ValueError(f"group curriculum stage {part!r} is invalid: allowed 'GROUP:STEP' "
                       f"or 'GROUP+GROUP:STEP' with each GROUP one of {', '.join(GROUPS)} "
                       f"(no repeats) and STEP an integer >= 0")
    for n in names:
      if not set(group_elements(n)) <= set(group_elements(group)):
        raise ValueError(f"group curriculum stage {part!r} is invalid: {n} is not a "
                         f"subgroup of {group}")
    if int(until) <= last:
      raise ValueError(f"group curriculum stage {part!r} is invalid: steps must increase")
    stages.append((name, int(until)))
    last = int(until)
  return tuple(stages)


def _stage_at(step: int, stages: Sequence[tuple[Any, int]], after: Any) -> Any:
  """The setting of the first stage (setting, until) with step < until, else `after`."""
  return next((setting for setting, until in stages if step < until), after)


def group_curriculum(step: int, stages: Sequence[tuple[str, int]], group: str) -> str:
  """The group of training step `step`: the first stage (name, until) with step < until,
  else `group` ("Z2+S3" names a mixed stage). Small groups first mean small
  S5-Retrieval dictionaries first, where the lookup circuit forms (docs/experiments.md)."""
  return _stage_at(step, stages, group)


def parse_value_curriculum(text: str, value_len: int) -> tuple[tuple[int, int], ...]:
  """Stages "1:3000" or "1:2000,2:4000" (values of 1 character up to step 2000, then 2 up
  to 4000, then `value_len`). Each stage's length must be 1..value_len and the steps must
  increase: short values first, as small groups first, let the state and the lookup form
  before the values grow (docs/experiments.md)."""
  stages, last = [], -1
  for part in filter(None, (x.strip() for x in text.split(","))):
    v, sep, until = part.partition(":")
    if not (sep and v.strip().isdigit() and until.strip().isdigit()
            and 1 <= int(v) <= value_len):
      raise ValueError(f"value curriculum stage {part!r} is invalid: allowed 'V:STEP' with "
                       f"V an integer 1..{value_len} (data.value_len) and STEP an integer "
                       f">= 0")
    if int(until) <= last:
      raise ValueError(f"value curriculum stage {part!r} is invalid: steps must increase")
    stages.append((int(v), int(until)))
    last = int(until)
  return tuple(stages)


def value_curriculum(step: int, stages: Sequence[tuple[int, int]], value_len: int) -> int:
  """The value length of training step `step`: the first stage (v, until) with
  step < until, else `value_len`."""
  return _stage_at(step, stages, value_len)
