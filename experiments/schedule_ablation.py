"""The cross-schedule ablation: T2MLR and LRT each trained under each training schedule
(model/schedules/) at one budget, evaluated in the exact view (what decoding computes).

    python experiments/schedule_ablation.py --task=word        # S3 word problem, 6 runs
    python experiments/schedule_ablation.py --task=retrieval   # the S5-Retrieval default job
    python experiments/schedule_ablation.py --task=lm          # Gutenberg pretraining
    python experiments/schedule_ablation.py --table            # docs/schedules.md's tables

Each run is a config of configs/ with `train.mode` and its schedule's options changed, and
nothing else: same data stream, steps, batch, seed and optimizer as the config's own run.
Results accumulate in experiments/results/schedule_ablation_<task>.json, written after
every run (with its seed, commit, machine and wall time; a recorded run is skipped); a run
interrupted half-way resumes from its workdir's checkpoint. FLOPs are the library's cost
model (`flops.train_step_flops`) for the schedule as run.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "configs"))
sys.path.insert(0, os.path.join(ROOT, "experiments"))

from bench_common import apply_overrides, git_commit, read_json, write_json  # noqa: E402

RESULTS = os.path.join(ROOT, "experiments", "results")

# task -> (config variant, {run: (config module, lm variant, overrides)})
_JACOBI_16_4 = {"train.mode": "jacobi", "model.schedule_options.d_forward": 16,
                "model.schedule_options.d_backward": 4}
_INTERLEAVED_2 = {"train.mode": "interleaved", "model.schedule_options.passes": 2}
_MULTI_REFINE_3 = {"train.mode": "multi_refine", "model.schedule_options.refine_passes": 3}
TASKS = {
    "word": ("word", {
        "t2mlr_jacobi": ("s5_retrieval", None, _JACOBI_16_4),
        "t2mlr_interleaved": ("s5_retrieval", None, _INTERLEAVED_2),
        "t2mlr_multi_refine": ("s5_retrieval", None, _MULTI_REFINE_3),
        "lrt_interleaved": ("s5_retrieval_lrt", None, _INTERLEAVED_2),
        "lrt_jacobi": ("s5_retrieval_lrt", None, _JACOBI_16_4),
        "lrt_multi_refine": ("s5_retrieval_lrt", None, _MULTI_REFINE_3),
    }),
    # the default job trains on up to 8 actions (T = 2·8 + 1 recurrent steps): Jacobi 17/4
    "retrieval": ("", {
        "t2mlr_jacobi": ("s5_retrieval", None, {**_JACOBI_16_4,
                                                "model.schedule_options.d_forward": 17}),
        "t2mlr_interleaved": ("s5_retrieval", None, _INTERLEAVED_2),
        "t2mlr_multi_refine": ("s5_retrieval", None, _MULTI_REFINE_3),
        "lrt_interleaved": ("s5_retrieval_lrt", None, _INTERLEAVED_2),
        "lrt_jacobi": ("s5_retrieval_lrt", None, {**_JACOBI_16_4,
                                                  "model.schedule_options.d_forward": 17}),
        "lrt_multi_refine": ("s5_retrieval_lrt", None, _MULTI_REFINE_3),
    }),
    "lm": ("", {
        "t2mlr_jacobi": ("lm_gutenberg", "t2mlr", _JACOBI_16_4),
        "t2mlr_interleaved": ("lm_gutenberg", "t2mlr", _INTERLEAVED_2),
        "lrt_interleaved": ("lm_gutenberg", "lrt_layerwise", _INTERLEAVED_2),
        "lrt_jacobi": ("lm_gutenberg", "lrt_layerwise", _JACOBI_16_4),
        # the LRT release's three arms (issue 55), all trained with the gate out of weight
        # decay: the plain backbone (adopted), interleaved S = 2 again, multi-refine K = 3
        "transformer": ("lm_gutenberg", "transformer", {}),
        "lrt_interleaved_fresh": ("lm_gutenberg", "lrt_layerwise", _INTERLEAVED_2),
        "lrt_multi_refine": ("lm_gutenberg", "lrt_layerwise", _MULTI_REFINE_3),
    }),
}
LM_TOKENS = 2_457_600        # experiments/pretrain_lm.py's budget

# Runs whose config (model, schedule, data, steps, batch, seed, optimizer) is a config's own
# default job, with the recorded run's overrides (pretrain_lm's t2mlr_16_4 pins the paper's
# 16/4 over the variant's 4/1), already trained and recorded by another experiment: adopted
# from its JSON (after checking the configs are equal), not trained again.
# The LRT rows were trained before LRT's gate left AdamW's weight decay (18519ee), as were
# the ablation's other LRT runs: they adopt the default jobs' records of that time.
#   task -> {run: (results file, key path to the run)}
ADOPTED = {
    "retrieval": {"t2mlr_jacobi": ("s5_default_job.json", ("runs", "t2mlr")),
                  "lrt_interleaved": ("s5_default_job.json", ("runs", "lrt_decayed_gate"))},
    "lm": {"t2mlr_jacobi": ("pretrain_lm.json", ("arms", "t2mlr_16_4")),
           "transformer": ("pretrain_lm.json", ("arms", "transformer")),
           "lrt_interleaved": ("pretrain_lm.json", ("arms", "lrt_layerwise_decayed_gate"))},
}


def build_config(task: str, run: str, steps=None, schedule: bool = True):
  """The run's experiment config: its config module's own, with the schedule's fields
  (without them, `schedule=False`: the config's own default job, as `adopt` compares)."""
  variant, runs = TASKS[task]
  module, lm_variant, overrides = runs[run]
  config = importlib.import_module(module).get_config(lm_variant or variant)
  if task == "lm":
    config.data.path = os.path.join(ROOT, "data", "gutenberg_bpe2048")
    t = config.train
    t.num_steps = LM_TOKENS // (t.batch_size * t.seq_len)
    t.update(eval_every=t.num_steps // 4, checkpoint_every=t.num_steps // 4, log_every=25)
  if schedule:
    apply_overrides(config, overrides, f"run {run}")
  if steps:
    config.train.num_steps = steps
    config.train.eval_every = config.train.checkpoint_every = steps
  return config


def _final_metrics(task: str, evals: list) -> dict:
  final = evals[-1]
  if task == "lm":
    views = {k: v["bpb"] for k, v in final.items() if isinstance(v, dict) and "bpb" in v}
    passes = {k: v["pass_bpb"] for k, v in final.items() if isinstance(v, dict)
              and "pass_bpb" in v}                   # multi_refine: every pass's BPB
    return {"bpb_exact": final["bpb"], "bpb_views": views, **(
        {"bpb_passes": passes} if passes else {})}
  return {k: final[k] for k in ("seq_acc", "state_acc", "value_acc", "seq_acc_by_length",
                                "state_acc_by_length", "value_acc_by_length") if k in final}


def run_one(task: str, run: str, workroot: str, steps=None) -> dict:
  import jax

  from t2mlr_jax import flops
  from t2mlr_jax.train import config as config_lib
  from t2mlr_jax.train.loop import train
  from t2mlr_jax.train.metrics import read_metrics
  config = build_config(task, run, steps)
  if task == "lm":
    sys.path.insert(0, os.path.join(ROOT, "experiments"))
    from pretrain_lm import ensure_data
    ensure_data(config.data.path)
  workdir = os.path.join(workroot, task, run)
  started = time.time()
  train(config, workdir, progress=False)
  wall = time.time() - started
  evals = read_metrics(workdir, "eval")
  t = config.train
  if not evals or evals[-1]["step"] != t.num_steps:
    raise SystemExit(f"{run} stopped before step {t.num_steps} (interrupted?): rerun to resume")
  cfg = config_lib.model_config(config)
  mode = config_lib.train_mode(config, cfg)
  logs = read_metrics(workdir, "train")
  sweeps = [r["jacobi_sweeps"] for r in logs if "jacobi_sweeps" in r]
  step_flops = flops.train_step_flops(cfg, t.batch_size, t.seq_len, mode)
  jax.clear_caches()
  module, lm_variant, overrides = TASKS[task][1][run]
  return {
      "config": f"configs/{module}.py:{lm_variant or TASKS[task][0]}".rstrip(":"),
      "overrides": overrides, "train_mode": mode, "params": cfg.num_params(),
      "recurrence": cfg.recurrence.to_dict() if cfg.recurrence else None,
      "steps": t.num_steps, "seed": t.seed,
      "tokens": t.num_steps * t.batch_size * t.seq_len, "step_flops": step_flops,
      "train_flops": t.num_steps * step_flops,
      "jacobi_sweeps_logged": sorted(set(sweeps)) or None,
      "train_loss_last": logs[-1]["loss"] if logs else None,
      **_final_metrics(task, evals),
      "wall_s": round(wall, 1), "commit": git_commit(), "machine": platform.processor() or
      platform.machine(), "date": time.strftime("%Y-%m-%d"),
      "command": (f"python experiments/schedule_ablation.py --task={task} --runs={run}"),
  }


def adopt(task: str, run: str) -> dict:
  """A run of ADOPTED as this ablation records it, from the experiment that trained it.

  Refuses (SystemExit) unless the ablation's config for the run trains what the recorded
  run trained: the same model, schedule, optimizer, data, steps, batch and seed."""
  from t2mlr_jax import flops
  from t2mlr_jax.train import config as config_lib
  file, keys = ADOPTED[task][run]
  source = read_json(file)
  for key in keys:
    source = source[key]
  # the recorded run: its config's default job with the overrides it was trained under
  ours = build_config(task, run)
  theirs = apply_overrides(build_config(task, run, schedule=False),
                           source.get("overrides", {}), f"{file}'s run")
  for group in ("model", "optimizer"):
    if ours[group].to_dict() != theirs[group].to_dict():
      raise SystemExit(f"{run}: the ablation's {group} config differs from {file}'s run")
  cfg = config_lib.model_config(ours)
  mode = config_lib.train_mode(ours, cfg)
  if mode != config_lib.train_mode(theirs, config_lib.model_config(theirs)):
    raise SystemExit(f"{run}: the ablation's schedule differs from {file}'s run")
  t, s = ours.train, theirs.train
  same = ("num_steps", "batch_size", "seq_len", "seed")   # mode: compared resolved above
  if any(t[k] != s[k] for k in same) or ours.data.to_dict() != theirs.data.to_dict():
    raise SystemExit(f"{run}: the ablation's train/data config differs from {file}'s run")
  step_flops = flops.train_step_flops(cfg, t.batch_size, t.seq_len, mode)
  record = {
      "config": f"configs/{TASKS[task][1][run][0]}.py:{TASKS[task][1][run][1] or TASKS[task][0]}"
                .rstrip(":"),
      "overrides": TASKS[task][1][run][2], "train_mode": mode, "params": cfg.num_params(),
      "recurrence": cfg.recurrence.to_dict() if cfg.recurrence else None,
      "steps": t.num_steps, "seed": t.seed,
      "tokens": t.num_steps * t.batch_size * t.seq_len, "step_flops": step_flops,
      "train_flops": t.num_steps * step_flops, "jacobi_sweeps_logged": None,
      "adopted_from": f"experiments/results/{file}:{'.'.join(keys)}",
      "command": source["command"],
  }
  if task == "lm":
    final = source["final"]
    record.update(bpb_exact=final["exact"],
                  bpb_views={k: v for k, v in final.items() if k not in ("step", "tokens",
                                                                         "flops")},
                  train_loss_last=source.get("train_loss_last"), wall_s=source["wall_s"])
  else:
    final, last = source["final_eval"], source["eval_curve"][-1]
    assert last["step"] == t.num_steps, (run, last)
    record.update({k: last[k] for k in ("seq_acc", "state_acc", "value_acc")},
                  **final, wall_s=round(source["wall_minutes"] * 60, 1),
                  commit=source["commit"], date=source["recorded"]["date"][:10])
  return record


def results_path(task: str) -> str:
  return os.path.join(RESULTS, f"schedule_ablation_{task}.json")


def table(task: str) -> str:
  """The docs' table of one task from its JSON (the runs recorded so far)."""
  runs = read_json(results_path(task), default={"task": task, "runs": {}})["runs"]
  if not runs:
    return f"(no {task} runs recorded yet)"
  if task == "lm":
    base = runs.get("t2mlr_jacobi", {}).get("train_flops")
    lines = ["| run | schedule | params | BPB exact | BPB training view | BPB memory off "
             "| train FLOPs (× T2MLR Jacobi) | wall |", "|---|---|---|---|---|---|---|---|"]
    shown = lambda x: "–" if x is None else f"{x:.4f}"    # (no recurrence: one view)
    for name, r in _ordered(task, runs):
      view = r["bpb_views"].get(r["train_mode"]) if r["recurrence"] else None
      ratio = f" ({r['train_flops'] / base:.2f}×)" if base else ""
      off = r["bpb_views"].get("parallel") if r["recurrence"] else None
      lines.append(f"| {_name(name, r)} | {r['train_mode']} | {r['params']:,} | "
                   f"{r['bpb_exact']:.4f} | {shown(view)} | {shown(off)} | "
                   f"{r['train_flops']:.3g}{ratio} | {r['wall_s'] / 60:.0f} min |")
    return "\n".join(lines + _footnote(runs))
  lengths = sorted({k for r in runs.values() for k in r["seq_acc_by_length"]}, key=int)
  values = any("value_acc" in r for r in runs.values())      # the word problem has none
  lines = ["| run | schedule | params | " + " | ".join(lengths) + " | state acc"
           + (" | value acc" if values else "") + " | train FLOPs | wall |",
           "|---|---|---|" + "---|" * (len(lengths) + values) + "---|---|---|"]
  for name, r in _ordered(task, runs):
    accs = " | ".join(f"{r['seq_acc_by_length'].get(k, float('nan')):.2f}" for k in lengths)
    lines.append(f"| {_name(name, r)} | {r['train_mode']} | {r['params']:,} | {accs} | "
                 f"{r.get('state_acc', float('nan')):.2f} | "
                 + (f"{r.get('value_acc', float('nan')):.2f} | " if values else "")
                 + f"{r['train_flops']:.3g} | "
                 f"{r['wall_s'] / 60:.0f} min |")
  return "\n".join(lines + _footnote(runs))


def _ordered(task: str, runs: dict) -> list:
  """The recorded runs in TASKS' order (the order they were run in does not matter)."""
  return [(name, runs[name]) for name in TASKS[task][1] if name in runs]


def _name(name: str, record: dict) -> str:
  return name + (" *" if "adopted_from" in record else "")


def _footnote(runs: dict) -> list:
  adopted = sorted({r["adopted_from"] for r in runs.values() if "adopted_from" in r})
  if not adopted:
    return []
  return ["", "\\* trained once by another experiment and recorded in "
          + ", ".join(f"`{a}`" for a in adopted) + " (same model, schedule, data, steps and "
          "seed, checked by `adopt`), not trained again; its wall time is that run's."]


def plot(task: str, path: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  runs = read_json(results_path(task), default={"task": task, "runs": {}})["runs"]
  if not runs:
    return
  fig, ax = plt.subplots(figsize=(7, 3.5))
  names = list(runs)
  if task == "lm":
    ax.bar(names, [runs[n]["bpb_exact"] for n in names])
    ax.set_ylabel("held-out bits per byte (exact)")
    lo = min(runs[n]["bpb_exact"] for n in names)
    ax.set_ylim(lo - 0.1, None)
  else:
    lengths = sorted({k for r in runs.values() for k in r["seq_acc_by_length"]}, key=int)
    for n in names:
      ax.plot([int(k) for k in lengths],
              [runs[n]["seq_acc_by_length"].get(k, float("nan")) for k in lengths], "o-",
              label=n)
    ax.set_xlabel("actions")
    ax.set_ylabel("sequence accuracy (exact)")
    ax.legend(fontsize=7)
  ax.set_title(f"schedules x recurrence types: {task}")
  plt.setp(ax.get_xticklabels(), rotation=20, fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--task", choices=sorted(TASKS))
  p.add_argument("--runs", default="", help="comma-separated run names (default: all)")
  p.add_argument("--steps", type=int, default=None, help="override the steps (smoke tests; "
                 "such runs are not recorded)")
  p.add_argument("--workdir", default=os.path.join(ROOT, "workdirs", "schedule_ablation"))
  p.add_argument("--table", action="store_true", help="print every task's table and exit")
  args = p.parse_args()
  if args.table:
    for task in TASKS:
      print(f"\n{task}:\n{table(task)}")
    return
  if args.task is None:
    p.error("--task is required (or --table)")
  names = [n for n in args.runs.split(",") if n] or list(TASKS[args.task][1])
  unknown = sorted(set(names) - set(TASKS[args.task][1]))
  if unknown:
    p.error(f"--runs: unknown {unknown}; allowed {list(TASKS[args.task][1])}")
  for name in names:
    result = read_json(results_path(args.task), default={"task": args.task, "runs": {}})
    if name in result["runs"] and not args.steps:
      print(f"{name}: recorded, skipped")
      continue
    if name in ADOPTED.get(args.task, {}) and not args.steps:
      result["runs"][name] = adopt(args.task, name)
      print(f"{name}: adopted from {result['runs'][name]['adopted_from']}")
      write_json(results_path(args.task), result, indent=1, stamp=False)
      plot(args.task, results_path(args.task)[:-5] + ".png")
      continue
    record = run_one(args.task, name, args.workdir if not args.steps else
                     os.path.join(args.workdir, "smoke"), args.steps)
    print(f"{name}: {json.dumps({k: record[k] for k in record if k.endswith('acc') or k.startswith('bpb') or k == 'wall_s'})}")
    if args.steps:
      continue
    # read again: another process may have added runs
    result = read_json(results_path(args.task), default={"task": args.task, "runs": {}})
    result["runs"][name] = record
    write_json(results_path(args.task), result, indent=1, stamp=False)
    plot(args.task, results_path(args.task)[:-5] + ".png")


if __name__ == "__main__":
  main()
