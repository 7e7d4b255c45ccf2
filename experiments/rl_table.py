"""GRPO at CPU scale: a small model trained on Variable Assignment by next-token loss, then
post-trained by GRPO; held-out greedy accuracy before and after, with standard errors, for
the transformer and T2MLR (docs/rl.md).

    python experiments/rl_table.py --arms=transformer,t2mlr --seeds=0
    python experiments/rl_table.py --arms=transformer,t2mlr --rl_lr=1e-3   # a second RL stage
    python experiments/rl_table.py --table

Each arm is configs/variable_assignment.py then configs/rl_variable_assignment.py
(`model.init_from` the first run's workdir) with the overrides below (a one-hop chain,
512 held-out examples, the CPU budget, T2MLR at Jacobi 4/2) and nothing else. Results
accumulate in experiments/results/rl_table.json: an arm's record is written after its
next-token stage and again after its RL stage; a recorded stage is skipped and one stopped
half-way resumes from its workdir (under --workroot).
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "configs"))
sys.path.insert(0, os.path.join(ROOT, "experiments"))

from bench_common import apply_overrides, git_commit, machine_info, read_json, write_json  # noqa: E402,E501

RESULTS = os.path.join(ROOT, "experiments", "results", "rl_table.json")
EMPTY = {"runs": {}}
# both stages: the task and its held-out set (same seed, so the same 512 examples)
TASK = {"data.va_depth": 1, "data.eval_examples_per_length": 512}
STAGES = {
    "sft": ("variable_assignment", {
        "train.num_steps": 1200, "train.eval_every": 400, "train.checkpoint_every": 400,
        "train.log_every": 100}),
    "rl": ("rl_variable_assignment", {"train.num_steps": 100, "train.checkpoint_every": 25}),
}
RL_LR = 1e-4            # the RL stage's learning rate (--rl_lr: another is its own stage)
ARMS = {"transformer": {"model.recurrence.type": "none"},
        "t2mlr": {"model.schedule_options.d_forward": 4,
                  "model.schedule_options.d_backward": 2}}


def rl_stage(lr: float) -> str:
  """The record's name of an RL stage: "rl" at RL_LR, "rl_lr<lr>" at another rate."""
  return "rl" if lr == RL_LR else f"rl_lr{lr:g}"


def overrides(stage: str, arm: str, seed: int, init_from: str = "") -> dict:
  """Every field the stage ("sft", or an RL stage named by rl_stage) changes from its
  config's default variant."""
  kind = "sft" if stage == "sft" else "rl"
  out = {**TASK, **STAGES[kind][1], **ARMS[arm], "train.seed": seed}
  if kind == "rl":
    out["optimizer.lr"] = _rl_lr(stage)
    out["model.init_from"] = init_from
  return out


def config_name(stage: str) -> str:
  return STAGES["sft" if stage == "sft" else "rl"][0]


def build_config(stage: str, arm: str, seed: int, init_from: str = ""):
  config = importlib.import_module(config_name(stage)).get_config("")
  return apply_overrides(config, overrides(stage, arm, seed, init_from), f"{stage}/{arm}")


def command(stage: str, arm: str, seed: int, workdir: str, init_from: str = "") -> str:
  flags = " ".join(f"--config.{k}={v}" for k, v in overrides(stage, arm, seed, init_from).items())
  return (f"python -m t2mlr_jax.main --config=configs/{config_name(stage)}.py {flags} "
          f"--workdir={workdir}")


def accuracy(workdir: str, num_steps: int, n: int) -> dict:
  """The run's last evaluation: greedy exact-match accuracy and its binomial standard error."""
  from t2mlr_jax.train.metrics import read_metrics
  evals = read_metrics(workdir, "eval")
  if not evals or evals[-1]["step"] != num_steps:
    raise SystemExit(f"{workdir} stopped early: rerun to resume")
  p = evals[-1]["seq_acc"]
  return {"acc": p, "se": math.sqrt(p * (1 - p) / n), "n": n,
          "curve": [{"step": r["step"], "acc": r["seq_acc"]} for r in evals]}


def run_stage(stage: str, arm: str, seed: int, workroot: str, init_from: str = "") -> dict:
  """Train (or resume) one stage and read its held-out accuracy and its training metrics."""
  import jax

  from t2mlr_jax.train.loop import train
  from t2mlr_jax.train.metrics import read_metrics
  config = build_config(stage, arm, seed, init_from)
  workdir = os.path.join(workroot, f"{arm}_seed{seed}_{stage}")
  started = time.time()
  train(config, workdir, progress=False)
  record = {**accuracy(workdir, config.train.num_steps, config.data.eval_examples_per_length),
            "steps": config.train.num_steps, "wall_s": round(time.time() - started, 1),
            "workdir": workdir, "command": command(stage, arm, seed, workdir, init_from)}
  if stage != "sft":
    logs = read_metrics(workdir, "train")
    record["reward_curve"] = [{k: r[k] for k in ("step", "reward_mean", "kl",
                                                 "groups_all_equal") if k in r} for r in logs]
  jax.clear_caches()
  return record


def run_arm(arm: str, seed: int, workroot: str, rl_lr: float = RL_LR) -> dict:
  name = f"{arm}/seed{seed}"
  for stage in ("sft", rl_stage(rl_lr)):
    results = read_json(RESULTS, default=EMPTY)
    record = results["runs"].get(name, {"arm": arm, "seed": seed})
    if stage in record:
      print(f"{name} {stage}: recorded, skipped")
      continue
    init_from = record["sft"]["workdir"] if stage != "sft" else ""
    print(f"{name} {stage}: {command(stage, arm, seed, '...', init_from)}", flush=True)
    record[stage] = run_stage(stage, arm, seed, workroot, init_from)
    record.update(commit=git_commit(), machine=machine_info().get("cpu_model", ""),
                  date=time.strftime("%Y-%m-%d"))
    results = read_json(RESULTS, default=EMPTY)     # another process may have written
    results["runs"][name] = record
    write_json(RESULTS, results)
    print(f"{name} {stage}: acc {record[stage]['acc']:.3f} ± {record[stage]['se']:.3f} "
          f"in {record[stage]['wall_s'] / 60:.0f} min", flush=True)
  return record


def table() -> str:
  """One row per arm, seed and RL stage: accuracy ± SE after next-token training and after
  GRPO at that learning rate."""
  runs = read_json(RESULTS, default=EMPTY)["runs"]
  if not runs:
    return "(no runs recorded yet)"
  out = ["| arm | seed | next-token acc (steps) | GRPO lr | after GRPO (steps) | change | "
         "reward, first → last log window | wall |", "|---|---|---|---|---|---|---|---|"]
  for r in sorted(runs.values(), key=lambda r: (list(ARMS).index(r["arm"]), r["seed"])):
    sft = r.get("sft")
    if sft is None:
      continue
    row = f"| {r['arm']} | {r['seed']} | {sft['acc']:.3f} ± {sft['se']:.3f} ({sft['steps']}) | "
    stages = sorted((k for k in r if k.startswith("rl")), key=_rl_lr)
    if not stages:
      out.append(row + "— | — | — | — | " + f"{sft['wall_s'] / 60:.0f} min |")
    for stage in stages:
      rl = r[stage]
      rewards = [x["reward_mean"] for x in rl["reward_curve"]]   # each a log window's mean
      out.append(row + f"{_rl_lr(stage):g} | {rl['acc']:.3f} ± {rl['se']:.3f} ({rl['steps']}) | "
                 f"{rl['acc'] - sft['acc']:+.3f} | {rewards[0]:.2f} → {rewards[-1]:.2f} | "
                 f"{(sft['wall_s'] + rl['wall_s']) / 60:.0f} min |")
  return "\n".join(out)


def _rl_lr(stage: str) -> float:
  return RL_LR if stage == "rl" else float(stage[len("rl_lr"):])


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--arms", default=",".join(ARMS))
  p.add_argument("--seeds", default="0")
  p.add_argument("--rl_lr", type=float, default=RL_LR, help="the RL stage's learning rate")
  p.add_argument("--workroot", default=os.path.join(ROOT, "workdirs", "rl_table"))
  p.add_argument("--table", action="store_true", help="print the recorded table and exit")
  args = p.parse_args(argv)
  if args.table:
    print(table())
    return
  arms = args.arms.split(",")
  bad = [a for a in arms if a not in ARMS]
  if bad:
    raise SystemExit(f"--arms: {bad[0]!r} is invalid: allowed {list(ARMS)}")
  for arm in arms:
    for seed in (int(s) for s in args.seeds.split(",")):
      run_arm(arm, seed, args.workroot, args.rl_lr)
  print(table())


if __name__ == "__main__":
  main()
