"""Train a model: `python -m t2mlr_jax.main --config=configs/s5_retrieval.py --workdir=DIR`.

Config overrides go on the command line (`--config.train.num_steps=200`); a
`:variant` after the config path selects a preset (`configs/s5_retrieval.py:tiny`).
Without --workdir a run goes to workdirs/<config stem>[_<variant>]
(`workdirs/s5_retrieval_tiny`); the first line the run prints names its workdir.
Resumes automatically when the workdir holds a checkpoint. On several hosts, run one
process per host with --coordinator_address/--num_processes/--process_id (or their
JAX_* environment variables; TPU pods and SLURM are detected): see t2mlr_jax/accel/distributed.py.
"""

import os
import re
import sys

from absl import flags, logging
from ml_collections import config_flags

from t2mlr_jax import cli

_CONFIG = config_flags.DEFINE_config_file("config", None, "experiment config file",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "run directory (checkpoints, metrics)")
_PROGRESS = flags.DEFINE_bool("progress", True, "show a console progress bar")
_COORDINATOR = flags.DEFINE_string("coordinator_address", None, "HOST:PORT of process 0 in "
                                   "a multi-process run (default $JAX_COORDINATOR_ADDRESS)")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "processes in the run (default "
                                      "$JAX_NUM_PROCESSES)")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "this process's id, 0..num_processes-1 "
                                   "(default $JAX_PROCESS_ID)")
flags.mark_flags_as_required(["config"])


def default_workdir(config_arg: str) -> str:
  """workdirs/<config file stem>[_<variant>] for a --config value: each variant its own
  folder (`configs/s5_retrieval.py:tiny` -> workdirs/s5_retrieval_tiny)."""
  path, _, variant = config_arg.partition(":")
  stem = os.path.splitext(os.path.basename(path))[0]
  name = f"{stem}_{variant}" if variant else stem
  return os.path.join("workdirs", re.sub(r"[^\w.-]+", "_", name))


def main(argv):
  del argv
  config = cli.config_value(_CONFIG)     # a missing config file is an argument error
  if _WORKDIR.value:
    workdir = _WORKDIR.value
    print(f"workdir: {workdir}", flush=True)
  else:
    workdir = default_workdir(flags.FLAGS["config"].config_filename)
    print(f"workdir: {workdir} (the default for this config; --workdir=DIR to choose)",
          flush=True)
  # the library (and JAX) load once the flags parse: argument errors print at once
  from t2mlr_jax.accel import distributed
  from t2mlr_jax.data import tiny
  from t2mlr_jax.train.loop import NonFiniteLossError, train
  distributed.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
  needed = tiny.missing(config)       # a tiny variant's inputs: made here, in seconds
  if needed:
    print(f"{', '.join(needed)} not made yet: making {tiny.ROOT} ({tiny.COMMAND})",
          flush=True)
    tiny.make()
  try:
    metrics = train(config, workdir, progress=_PROGRESS.value)
  except NonFiniteLossError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(3)
  logging.info("done: %s", metrics)
  print(f"workdir: {workdir}")


if __name__ == "__main__":
  cli.run(main)
