"""Record a run of the S5 default job (or one of its baselines) in
experiments/results/s5_default_job.json: its command, parameter count, final exact eval
by length (and the zero-memory `parallel` eval of recurrent models) and eval curve.

    python -m t2mlr_jax.main --config=configs/s5_retrieval_lrt.py --workdir=workdirs/s5_lrt
    python experiments/s5_default_job.py --name=lrt --config=configs/s5_retrieval_lrt.py \\
        --workdir=workdirs/s5_lrt

Runs already in the JSON under other names are kept.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
OUT = os.path.join(ROOT, "experiments", "results", "s5_default_job.json")
CURVE = ("seq_acc", "state_acc", "value_acc")


def record(name: str, config_path: str, workdir: str, note: str = "") -> dict:
  import jax

  from t2mlr_jax import checkpoint
  from t2mlr_jax.train.config import model_config
  from t2mlr_jax.train.metrics import read_metrics
  config = checkpoint.load_config(workdir)
  evals = read_metrics(workdir, "eval")
  final = evals[-1]
  by_length = lambda r: {k: r[k] for k in ("seq_acc_by_length", "state_acc_by_length",
                                           "value_acc_by_length") if k in r}
  run = {"command": f"python -m t2mlr_jax.main --config={config_path} "
                    f"--workdir={os.path.relpath(workdir, ROOT)}",
         "params": model_config(config).num_params(), "group": config.data.group,
         "group_curriculum": config.data.group_curriculum,
         "steps_run": final["step"], "num_steps": config.train.num_steps,
         "train_mode": config.train.mode, "final_eval": by_length(final),
         "eval_curve": [{"step": r["step"], **{k: round(r[k], 4) for k in CURVE if k in r}}
                        for r in evals]}
  if "parallel" in final:
    run["final_eval_zero_memory"] = by_length(final["parallel"])
  if note:
    run["note"] = note
  run["recorded"] = {"date": time.strftime("%Y-%m-%d %H:%M"),
                     "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
                     "versions": {"jax": jax.__version__, "python": platform.python_version()}}
  report = json.load(open(OUT)) if os.path.exists(OUT) else {"runs": {}}
  report["runs"][name] = run
  with open(OUT, "w") as f:
    json.dump(report, f, indent=1)
  return run


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--name", required=True, help="the run's key in the JSON, e.g. lrt")
  p.add_argument("--config", required=True, help="the config file the run used")
  p.add_argument("--workdir", required=True)
  p.add_argument("--note", default="")
  args = p.parse_args()
  run = record(args.name, args.config, args.workdir, args.note)
  print(json.dumps({args.name: {k: run[k] for k in ("params", "steps_run", "final_eval")}},
                   indent=1))


if __name__ == "__main__":
  main()
