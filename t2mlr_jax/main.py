"""Train a model: `python -m t2mlr_jax.main --config=configs/s5_retrieval.py --workdir=DIR`.

Config overrides go on the command line (`--config.train.num_steps=200`); a
`:variant` after the config path selects a preset (`configs/s5_retrieval.py:tiny`).
Resumes automatically when the workdir holds a checkpoint. On several hosts,
run one process per host: JAX's multi-host runtime is initialised here.
"""

import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "experiment config file",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "run directory (checkpoints, metrics)")
_PROGRESS = flags.DEFINE_bool("progress", True, "show a console progress bar")
flags.mark_flags_as_required(["config"])


def _maybe_init_distributed():
  """jax.distributed.initialize() when launched as one of several processes."""
  markers = ("JAX_COORDINATOR_ADDRESS", "COORDINATOR_ADDRESS", "TPU_WORKER_HOSTNAMES",
             "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE")
  multi = any(os.environ.get(m) for m in markers)
  if os.environ.get("SLURM_NTASKS") == "1" or os.environ.get("OMPI_COMM_WORLD_SIZE") == "1":
    multi = False
  if "TPU_WORKER_HOSTNAMES" in os.environ and "," not in os.environ["TPU_WORKER_HOSTNAMES"]:
    multi = False
  if multi:
    import jax
    jax.distributed.initialize()


def main(argv):
  del argv
  _maybe_init_distributed()
  from t2mlr_jax.train.loop import NonFiniteLossError, train
  from t2mlr_jax.train.metrics import quiet_absl_logs
  quiet_absl_logs()
  config = _CONFIG.value
  workdir = _WORKDIR.value or os.path.join("workdirs", config.get("name", "run"))
  try:
    metrics = train(config, workdir, progress=_PROGRESS.value)
  except NonFiniteLossError as e:
    logging.error("%s", e)
    print(f"error: {e}", file=sys.stderr)
    sys.exit(3)
  logging.info("done: %s", metrics)
  print(f"workdir: {workdir}")


if __name__ == "__main__":
  app.run(main)
