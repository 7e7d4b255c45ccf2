"""TensorStore's failed array reads after a failed Orbax restore: quieted, and named in
one line (the trainer's error for a damaged checkpoint step)."""

from __future__ import annotations

import re
import sys


def quiet_failed_reads() -> None:
  """After a failed restore, Orbax's other array reads of the same damaged file end as
  coroutines whose exceptions nobody retrieves (Python prints each, a page of TensorStore
  spec, when they are collected) or as TensorStore callbacks into the event loop Orbax has
  closed by then (each reported through sys.unraisablehook with no object, so Python
  prints a bare traceback; how many arrive depends on timing). Silence just those, keeping
  every other warning."""
  previous = sys.unraisablehook

  def is_read_noise(value, _runtime_error=RuntimeError, _str=str, _isinstance=isinstance):
    # builtins bound as defaults: the hooks may run during interpreter shutdown
    text = _str(value)
    return ("Encountered error while reading array" in text
            or (_isinstance(value, _runtime_error) and text == "Event loop is closed"))

  def hook(unraisable):
    if is_read_noise(unraisable.exc_value):
      return
    previous(unraisable)
  sys.unraisablehook = hook
  previous_excepthook = sys.excepthook

  def excepthook(exc_type, value, traceback):
    if is_read_noise(value):
      return
    previous_excepthook(exc_type, value, traceback)
  sys.excepthook = excepthook


def read_failure(error: BaseException) -> str:
  """What could not be read, in one line: the array and TensorStore's reason when the
  error chain names them (a damaged shard file), else the innermost message."""
  chain, e = [], error
  while e is not None and len(chain) < 20:
    chain.append(e)
    e = e.__cause__ or e.__context__
  for e in chain:
    found = re.search(r'Error reading "([^"]+)" in OCDBT database at local file "([^"]*)"'
                      r'(?:: (.*))?', str(e))
    if found:
      array, where, why = found.groups()
      item = where.rstrip("/").rsplit("/", 1)[-1]
      array = array.rsplit("/", 1)[0] if "/" in array else array
      why = (why or "").split(";")[0].strip()
      return f"array {item}/{array}" + (f" ({why})" if why else "")
  return " ".join(str(chain[-1]).split())[:300]
