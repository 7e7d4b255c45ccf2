"""The multi-hop reasoning table at CPU scale: Pathfinding and ProsQA from scratch, the arms
of configs/pathfinding.py and configs/prosqa.py (T2MLR on the middle block, the transformer,
T2MLR on all layers, LRT), seeds, exact-recurrence evaluation on held-out graphs of the
trained sizes and of larger ones.

    python experiments/reasoning_table.py --tasks=pathfinding --arms=t2mlr,transformer --seeds=0
    python experiments/reasoning_table.py --tasks=prosqa --steps=1500     # a shorter budget
    python experiments/reasoning_table.py --tasks=pathfinding --setting=short   # 3-4 edges
    python experiments/reasoning_table.py --table

Each run is the config's variant (its arm, in a --setting the config names) with train.seed
(and train.num_steps with --steps) changed, nothing else. Results accumulate in
experiments/results/reasoning_table.json, one record per (task, setting, arm, steps, seed),
written after every run; a recorded run is skipped and one stopped half-way resumes from
its workdir (under --workroot).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "configs"))
sys.path.insert(0, os.path.join(ROOT, "experiments"))

from bench_common import git_commit, machine_info, read_json, write_json  # noqa: E402

RESULTS = os.path.join(ROOT, "experiments", "results", "reasoning_table.json")
EMPTY = {"runs": {}}
TASKS = ("pathfinding", "prosqa")
ARMS = {"t2mlr": "", "transformer": "transformer", "all_layers": "all_layers", "lrt": "lrt"}
# the per-size accuracies each task's evaluation logs
BY_SIZE = {"pathfinding": ("seq_acc_by_length",),
           "prosqa": ("seq_acc_by_concepts", "answer_acc_by_concepts",
                      "path_valid_acc_by_concepts")}


def variant(setting: str, arm: str) -> str:
  """The config variant of an arm in a setting ('short' + 'transformer': 'short_transformer')."""
  return "_".join(v for v in (setting, ARMS[arm]) if v)


def settings(task: str) -> tuple:
  """The settings a task's config names ('' the default one)."""
  return tuple(getattr(importlib.import_module(task), "SETTINGS", ("",)))


def build_config(task: str, arm: str, seed: int, steps=None, setting: str = ""):
  config = importlib.import_module(task).get_config(variant(setting, arm))
  config.train.seed = seed
  if steps:
    config.train.num_steps = steps
    config.train.eval_every = min(config.train.eval_every, steps)
    config.train.checkpoint_every = min(config.train.checkpoint_every, steps)
  return config


def key(task: str, arm: str, seed: int, steps, setting: str = "") -> str:
  return f"{task}{'_' + setting if setting else ''}/{arm}/steps{steps or 'default'}/seed{seed}"


def command(task: str, arm: str, seed: int, steps, setting: str = "") -> str:
  name = variant(setting, arm)
  extra = f" --config.train.num_steps={steps}" if steps else ""
  return (f"python -m t2mlr_jax.main --config=configs/{task}.py{':' + name if name else ''} "
          f"--config.train.seed={seed}{extra}")


def run_one(task: str, arm: str, seed: int, steps, workroot: str, setting: str = "") -> dict:
  """Train (or resume) one run and read its record from the workdir's evaluations."""
  import jax

  from t2mlr_jax.train import config as config_lib
  from t2mlr_jax.train.loop import train
  from t2mlr_jax.train.metrics import read_metrics
  config = build_config(task, arm, seed, steps, setting)
  workdir = os.path.join(workroot, key(task, arm, seed, steps, setting).replace("/", "_"))
  started = time.time()
  train(config, workdir, progress=False)
  wall = time.time() - started
  evals = read_metrics(workdir, "eval")
  if not evals or evals[-1]["step"] != config.train.num_steps:
    raise SystemExit(f"{key(task, arm, seed, steps, setting)} stopped early: rerun to resume")
  final = evals[-1]
  # the steps' own time over every stretch of a resumed run (this process's wall time counts
  # only the last stretch); compiles and evaluations excluded
  train_s = sum(r["loss_window"] / r["steps_per_sec"] for r in read_metrics(workdir)
                if r.get("steps_per_sec"))
  cfg = config_lib.model_config(config)
  jax.clear_caches()
  metrics = ("seq_acc", "answer_acc", "path_valid_acc") + BY_SIZE[task]
  return {"task": task, "setting": setting, "arm": arm, "seed": seed,
          "steps": config.train.num_steps, "params": cfg.num_params(), "train_mode": config_lib.train_mode(config, cfg),
          **{k: final[k] for k in metrics if k in final},
          "curve": [{k: r[k] for k in ("step", "seq_acc", "answer_acc") if k in r}
                    for r in evals],
          "wall_s": round(wall, 1), "train_s": round(train_s, 1), "commit": git_commit(),
          "machine": machine_info().get("cpu_model", ""), "date": time.strftime("%Y-%m-%d"),
          "command": command(task, arm, seed, steps, setting)}


def table() -> str:
  """Per task and setting: one row per run, its accuracy per evaluated size."""
  runs = read_json(RESULTS, default=EMPTY)["runs"]
  if not runs:
    return "(no runs recorded yet)"
  out = []
  groups = sorted({(r["task"], r.get("setting", "")) for r in runs.values()},
                  key=lambda g: (TASKS.index(g[0]), g[1]))
  for task, setting in groups:
    rows = [r for r in runs.values() if (r["task"], r.get("setting", "")) == (task, setting)]
    for metric in BY_SIZE[task]:
      sizes = sorted({n for r in rows for n in r.get(metric, {})}, key=int)
      out += [f"{task}{', setting ' + setting if setting else ''}: {metric}", "",
              "| arm | params | steps | seed | " + " | ".join(sizes) + " | train time |",
              "|---|---|---|---|" + "---|" * len(sizes) + "---|"]
      for r in sorted(rows, key=lambda r: (list(ARMS).index(r["arm"]), r["steps"], r["seed"])):
        accs = " | ".join(f"{r.get(metric, {}).get(n, float('nan')):.2f}" for n in sizes)
        out.append(f"| {r['arm']} | {r['params'] / 1e6:.2f}M | {r['steps']} | {r['seed']} | "
                   f"{accs} | {r.get('train_s', r['wall_s']) / 60:.0f} min |")
      out.append("")
  return "\n".join(out)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--tasks", default=",".join(TASKS))
  p.add_argument("--arms", default=",".join(ARMS))
  p.add_argument("--seeds", default="0,1,2")
  p.add_argument("--steps", type=int, default=None, help="train.num_steps (config's: unset)")
  p.add_argument("--setting", default="", help="a setting the task's config names "
                 "(pathfinding: short); the config's default: unset")
  p.add_argument("--workroot", default=os.path.join(ROOT, "workdirs", "reasoning_table"))
  p.add_argument("--table", action="store_true", help="print the recorded table and exit")
  args = p.parse_args(argv)
  if args.table:
    print(table())
    return
  for task in args.tasks.split(","):
    for arm in args.arms.split(","):
      for seed in (int(s) for s in args.seeds.split(",")):
        if task not in TASKS or arm not in ARMS:
          raise SystemExit(f"--tasks/--arms: {task}/{arm} is invalid: allowed tasks "
                           f"{TASKS} and arms {list(ARMS)}")
        if args.setting not in settings(task):
          raise SystemExit(f"--setting={args.setting!r} is invalid for {task}: allowed "
                           f"{list(settings(task))}")
        name = key(task, arm, seed, args.steps, args.setting)
        results = read_json(RESULTS, default=EMPTY)
        if name in results["runs"]:
          print(f"{name}: recorded, skipped")
          continue
        print(f"{name}: {command(task, arm, seed, args.steps, args.setting)}", flush=True)
        record = run_one(task, arm, seed, args.steps, args.workroot, args.setting)
        results = read_json(RESULTS, default=EMPTY)     # another process may have written
        results["runs"][name] = record
        write_json(RESULTS, results)
        print(f"{name}: seq_acc {record['seq_acc']:.3f} in {record['wall_s'] / 60:.0f} min")
  print(table())


if __name__ == "__main__":
  main()
