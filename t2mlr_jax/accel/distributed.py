"""Multi-process runs: JAX's own distributed runtime, one process per host (or several
processes on one machine), started from flags or the environment.

    # two processes on one machine (4 CPU devices each; any free port)
    JAX_NUM_CPU_DEVICES=4 python -m t2mlr_jax.main --config=... --workdir=run \\
        --coordinator_address=127.0.0.1:12345 --num_processes=2 --process_id=0 &
    JAX_NUM_CPU_DEVICES=4 python -m t2mlr_jax.main --config=... --workdir=run \\
        --coordinator_address=127.0.0.1:12345 --num_processes=2 --process_id=1

The three values default to JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and
JAX_PROCESS_ID (JAX itself reads only the first). Without a coordinator address, TPU
pods, SLURM and Open MPI are detected by `jax.distributed.initialize()` itself.
"""

from __future__ import annotations

import os
from typing import Mapping, Optional

import jax
import numpy as np
from jax.experimental import multihost_utils

_AUTO_MARKERS = ("TPU_WORKER_HOSTNAMES", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE")


def _int(name: str, value) -> Optional[int]:
  if value is None or value == "":
    return None
  try:
    return int(value)
  except ValueError:
    raise ValueError(f"{name}={value!r} is invalid: allowed an integer") from None


def init_arguments(coordinator_address: Optional[str] = None,
                   num_processes: Optional[int] = None, process_id: Optional[int] = None,
                   environ: Optional[Mapping[str, str]] = None) -> Optional[dict]:
  """The keyword arguments for jax.distributed.initialize(), {} to let JAX detect a TPU
  pod / SLURM / Open MPI cluster, or None for a single-process run."""
  env = os.environ if environ is None else environ
  address = coordinator_address or env.get("JAX_COORDINATOR_ADDRESS") or None
  n = num_processes if num_processes is not None else _int(
      "JAX_NUM_PROCESSES", env.get("JAX_NUM_PROCESSES"))
  pid = process_id if process_id is not None else _int(
      "JAX_PROCESS_ID", env.get("JAX_PROCESS_ID"))
  if n is not None and n < 1:
    raise ValueError(f"num_processes={n} is invalid: allowed an integer >= 1")
  if pid is not None and not 0 <= pid < (n or pid + 1):
    raise ValueError(f"process_id={pid} is invalid: allowed 0..{(n or 1) - 1}")
  if address is None:
    if n not in (None, 1) or pid not in (None, 0):
      raise ValueError(f"num_processes={n}, process_id={pid} need a coordinator address: "
                       "--coordinator_address=HOST:PORT (or JAX_COORDINATOR_ADDRESS), the "
                       "address of process 0")
    auto = any(env.get(m) for m in _AUTO_MARKERS)
    if env.get("SLURM_NTASKS") == "1" or env.get("OMPI_COMM_WORLD_SIZE") == "1":
      auto = False
    if "," not in env.get("TPU_WORKER_HOSTNAMES", ","):
      auto = False              # a single-host TPU VM
    return {} if auto else None
  if ":" not in address:
    raise ValueError(f"coordinator_address={address!r} is invalid: allowed HOST:PORT")
  if n == 1:
    return None
  if n is None or pid is None:
    if any(env.get(m) for m in _AUTO_MARKERS):
      return {"coordinator_address": address}       # JAX reads the rest from the cluster
    missing = [f for f, v in (("--num_processes (JAX_NUM_PROCESSES)", n),
                              ("--process_id (JAX_PROCESS_ID)", pid)) if v is None]
    raise ValueError(f"coordinator_address={address} is set but {' and '.join(missing)} "
                     "is not: give every process the process count and its own id")
  return {"coordinator_address": address, "num_processes": n, "process_id": pid}


def initialize(coordinator_address: Optional[str] = None, num_processes: Optional[int] = None,
               process_id: Optional[int] = None) -> bool:
  """Start JAX's distributed runtime when this is one of several processes; True if so."""
  kwargs = init_arguments(coordinator_address, num_processes, process_id)
  if kwargs is None:
    return False
  jax.distributed.initialize(**kwargs)
  return True


def any_process(flag: bool, gather=None) -> bool:
  """True on every process when `flag` is true on any (all processes must call it at the
  same point: it is a collective). The training loop calls it every step with "a stop
  signal arrived here", so processes that see SIGTERM at different steps still stop, and
  save, at the same one. gather: flag -> the flags of all processes (default JAX's
  multihost all-gather; tests pass a fake)."""
  if gather is None:
    if jax.process_count() == 1:
      return bool(flag)
    gather = multihost_utils.process_allgather
  return bool(np.any(np.asarray(gather(np.int32(bool(flag))))))
