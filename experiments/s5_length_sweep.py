"""Length generalisation on S5-style state tracking: T2MLR vs baselines
(docs/experiments.md#published-results).

Trains T2MLR (middle block), T2MLR (all layers), the RoPE transformer, the
LSTM and LRT (interleaved S = 2, and S = T: exact training) under one budget (same
steps, batch, data and schedule; parameter counts within 10%, LRT +20%: its
value-embedding tables), evaluates sequence accuracy per number of actions with the
exact recurrence — including lengths longer than any seen in training — and writes
experiments/results/s5_length_sweep[_<preset>].json and a PNG plot.

    python experiments/s5_length_sweep.py --preset=word        # S3 word problem (~30 min)
    python experiments/s5_length_sweep.py --preset=retrieval   # S3 S5-Retrieval format

Presets are the config variants of configs/s5_retrieval*.py.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "configs"))
sys.path.insert(0, os.path.join(ROOT, "experiments"))

from bench_common import git_commit, read_json, write_json  # noqa: E402

MODELS = {   # name -> config module
    "t2mlr_middle": "s5_retrieval",
    "t2mlr_all_layers": "s5_retrieval_all_layers",
    "transformer": "s5_retrieval_transformer",
    "lstm": "s5_retrieval_lstm",
    "lrt": "s5_retrieval_lrt",
    # LRT trained with S = T interleaved passes: exact training (the true recurrence)
    "lrt_exact": ("s5_retrieval_lrt",
                  lambda c: c.model.schedule_options.update(passes=c.train.seq_len)),
}
PRESETS = {"word": "word", "retrieval": ""}


def _stem(preset: str, out_dir: str) -> str:
  """The preset's results path without its extension (absolute: bench_common reads a
  relative path under experiments/results/)."""
  name = "s5_length_sweep" + ("" if preset == "word" else f"_{preset}")
  return os.path.abspath(os.path.join(out_dir, name))


def run(preset: str, models, steps, workroot: str, out_dir: str) -> dict:
  import importlib

  import jax

  from t2mlr_jax.train.config import model_config
  from t2mlr_jax.train.loop import train
  from t2mlr_jax.train.metrics import read_metrics

  variant = PRESETS[preset]
  results = {}
  for name in models:
    module, edit = MODELS[name] if isinstance(MODELS[name], tuple) else (MODELS[name], None)
    config = importlib.import_module(module).get_config(variant)
    if edit is not None:
      edit(config)
    if steps:
      config.train.num_steps = steps
    config.train.eval_every = config.train.num_steps      # evaluate once, at the end
    workdir = os.path.join(workroot, preset, name)
    if os.path.exists(workdir):           # a sweep is a fresh experiment, never a resume
      shutil.rmtree(workdir)
    start = time.time()
    train(config, workdir, progress=True)
    seconds = time.time() - start
    final = read_metrics(workdir, "eval")[-1]
    cfg = model_config(config)
    results[name] = {
        "config": module + (f".py:{variant}" if variant else ".py"),
        "params": cfg.num_params(), "steps": config.train.num_steps,
        "batch_size": config.train.batch_size, "lr": config.optimizer.lr,
        "train_seconds": round(seconds, 1),
        "train_actions": [config.data.min_actions, config.data.max_actions],
        "seq_acc_by_length": final["seq_acc_by_length"], "seq_acc": final["seq_acc"],
        "eval_loss": final["loss"], "final_train_loss": read_metrics(workdir)[-1]["loss"],
    }
    r, o = config.model.recurrence, config.model.schedule_options
    if r.type == "t2mlr":
      results[name]["recurrence"] = {"l_start": r.l_start, "l_end": r.l_end,
                                     "d_forward": o.d_forward, "d_backward": o.d_backward}
    elif r.type == "lrt":
      results[name]["recurrence"] = {"type": "lrt", "train_mode": config.train.mode,
                                     "passes": o.passes, "source_layer": r.source_layer}
    print(json.dumps({name: results[name]}), flush=True)

  stem = _stem(preset, out_dir)
  previous = read_json(stem + ".json", default={})
  if previous.get("preset") == preset:   # rerunning some models keeps the others' results
    results = {**{k: v for k, v in previous["models"].items() if k not in results}, **results}
    results = {k: results[k] for k in MODELS if k in results}
  ref = results.get("t2mlr_middle", next(iter(results.values())))["params"]
  report = {
      "preset": preset, "task": config.data.task, "group": config.data.group,
      "command": "python experiments/s5_length_sweep.py --preset=" + preset,
      "commit": git_commit(), "date": time.strftime("%Y-%m-%d %H:%M"),
      "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                  "devices": [str(d) for d in jax.devices()]},
      "versions": {"jax": jax.__version__, "python": platform.python_version()},
      "param_ratio_to_t2mlr": {k: round(v["params"] / ref, 3) for k, v in results.items()},
      "models": results,
  }
  write_json(stem + ".json", report, indent=2, stamp=False)
  plot(report, stem + ".png")
  return report


def plot(report: dict, path: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(6.5, 4))
  styles = {"t2mlr_middle": dict(marker="o", linestyle="-", linewidth=2.5, markersize=8),
            "t2mlr_all_layers": dict(marker="^", linestyle="-"),
            "transformer": dict(marker="s", linestyle="--"),
            "lstm": dict(marker="x", linestyle=":", markersize=9),
            "lrt": dict(marker="D", linestyle="-."),
            "lrt_exact": dict(marker="d", linestyle="-.")}
  for name, r in report["models"].items():
    lengths = sorted(int(n) for n in r["seq_acc_by_length"])
    ax.plot(lengths, [r["seq_acc_by_length"][str(n)] for n in lengths],
            label=f"{name} ({r['params'] / 1e3:.0f}k params)", **styles.get(name, {}))
  max_train = max(r["train_actions"][1] for r in report["models"].values())
  ax.axvline(max_train, color="gray", linestyle="--", linewidth=1)
  ax.text(max_train, 1.02, " longest training length", color="gray", fontsize=8)
  ax.set_xlabel("number of actions")
  ax.set_ylabel("sequence accuracy (exact recurrence)")
  ax.set_ylim(-0.02, 1.08)
  ax.set_title(f"{report['task']} on {report['group']}: length generalisation")
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def replot(preset: str, out_dir: str) -> None:
  stem = _stem(preset, out_dir)
  plot(read_json(stem + ".json"), stem + ".png")


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--preset", choices=sorted(PRESETS), default="word")
  p.add_argument("--models", default=",".join(MODELS),
                 help=f"comma-separated subset of {list(MODELS)}")
  p.add_argument("--steps", type=int, default=None, help="override train.num_steps")
  p.add_argument("--workroot", default=os.path.join(ROOT, "workdirs", "s5_length_sweep"))
  p.add_argument("--out", default=os.path.join(ROOT, "experiments", "results"))
  p.add_argument("--replot", action="store_true", help="redraw the PNG from the JSON only")
  args = p.parse_args()
  if args.replot:
    return replot(args.preset, args.out)
  models = [m for m in args.models.split(",") if m]
  unknown = sorted(set(models) - set(MODELS))
  if unknown:
    p.error(f"unknown models {unknown}: allowed {list(MODELS)}")
  run(args.preset, models, args.steps, args.workroot, args.out)


if __name__ == "__main__":
  main()
