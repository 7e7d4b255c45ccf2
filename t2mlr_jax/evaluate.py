"""Evaluate a training run's checkpoint: `python -m t2mlr_jax.evaluate --workdir=DIR`.

Loads the latest (or --step) checkpoint and its saved config, evaluates the
task's held-out set with the exact recurrence, prints the metrics as JSON and
writes them to DIR/eval_step{N}.json (or --output).
"""

import json
import os

from absl import app, flags

_WORKDIR = flags.DEFINE_string("workdir", None, "run directory holding checkpoints/")
_STEP = flags.DEFINE_integer("step", None, "checkpoint step (default: latest)")
_OUTPUT = flags.DEFINE_string("output", None, "where to write the JSON (default: workdir)")
_MODE = flags.DEFINE_enum("mode", "exact", ["exact", "parallel", "jacobi"],
                          "forward mode for evaluation (exact is the true recurrence)")
flags.mark_flags_as_required(["workdir"])


def evaluate_checkpoint(workdir, step=None, mode="exact") -> dict:
  from t2mlr_jax import checkpoint
  from t2mlr_jax.eval.runner import evaluate
  from t2mlr_jax.train.tasks import get_task
  ckpt = checkpoint.Checkpointer(workdir, read_only=True)
  step = ckpt.latest_step() if step is None else step
  ckpt.manager.close()
  if step is None:
    raise ValueError(f"no checkpoint found under {workdir}/checkpoints")
  config = checkpoint.load_config(workdir, step)
  cfg, params = checkpoint.load(workdir, step)
  task = get_task(config)
  results = evaluate(params, cfg, task.eval_batches(config), task.metrics, mode=mode)
  return {"step": step, "task": config.data.task, "mode": mode, **results}


def main(argv):
  del argv
  from t2mlr_jax.train.metrics import quiet_absl_logs
  quiet_absl_logs()
  results = evaluate_checkpoint(_WORKDIR.value, _STEP.value, _MODE.value)
  out = _OUTPUT.value or os.path.join(_WORKDIR.value, f"eval_step{results['step']}.json")
  with open(out, "w") as f:
    json.dump(results, f, indent=2)
  print(json.dumps(results, indent=2))


if __name__ == "__main__":
  app.run(main)
