"""Shared helpers of the benchmarks: machine info, timing, medians, JSON output."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import time
from typing import Callable

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
  """Set dotted fields ("model.recurrence.d_forward": 8) of an ml_collections config, as
  --config.<field>= flags do (ml_collections' own flattened update, which would skip an
  unknown field silently: one the config lacks is an error naming `what`)."""
  flat = {".".join(k): v for k, v in _flat_keys(config.to_dict())}
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


def write_json(name: str, payload: dict) -> str:
  os.makedirs(RESULTS, exist_ok=True)
  path = os.path.join(RESULTS, name)
  payload = {"machine": machine_info(), "date": time.strftime("%Y-%m-%d %H:%M"), **payload}
  with open(path, "w") as f:
    json.dump(payload, f, indent=2)
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
