"""Where the LSTM fails retrieval: the S5-Retrieval default job's four arms (T2MLR, the
parameter-matched LSTM, the transformer, LRT) on value-length variants of it, under one
budget (the default job's 6000 steps, its curricula and optimizer).

    python experiments/s5_lstm_gap.py --variants=v2,v4 --arms=lstm          # the screen
    python experiments/s5_lstm_gap.py --variants=v2_staged --arms=t2mlr,lstm --seeds=0,1
    python experiments/s5_lstm_gap.py --variants=v2_staged --arms=transformer,lrt
    python experiments/s5_lstm_gap.py --table

A variant is configs/s5_retrieval.py's (`v2`, `v4`: 2- or 4-character dictionary values;
`v2_staged`: v2 after 3000 steps of one-character values;
`s4`, `s4_d16`: the group S4 with 24- or 16-pair dictionaries; `` is the default job, S3
and v = 1); each arm is its config module's variant
(s5_retrieval{,_lstm,_transformer,_lrt}.py), nothing else changed. Results accumulate in
experiments/results/s5_lstm_gap.json, one record per (variant, arm, seed), written after
every run (a recorded run is skipped; one stopped half-way resumes from its workdir;
`--record_stopped` records a stopped run's last evaluation, marked as stopped).
Evaluated with the exact recurrence on 128 held-out S3 sequences per length.
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

RESULTS = os.path.join(ROOT, "experiments", "results", "s5_lstm_gap.json")
EMPTY = {"runs": {}}        # the results before the first run (read_json copies it)
ARMS = {"t2mlr": "s5_retrieval", "lstm": "s5_retrieval_lstm",
        "transformer": "s5_retrieval_transformer", "lrt": "s5_retrieval_lrt"}
VARIANTS = ("", "v2", "v4", "v2_staged", "s4", "s4_d16")


def build_config(variant: str, arm: str, seed: int):
  config = importlib.import_module(ARMS[arm]).get_config(variant)
  config.train.seed = seed
  return config


def key(variant: str, arm: str, seed: int) -> str:
  return f"{variant or 'v1'}/{arm}/seed{seed}"


def workdir_of(variant: str, arm: str, seed: int, workroot: str) -> str:
  return os.path.join(workroot, key(variant, arm, seed).replace("/", "_"))


def run_one(variant: str, arm: str, seed: int, workroot: str) -> dict:
  from t2mlr_jax.train.loop import train
  config = build_config(variant, arm, seed)
  workdir = workdir_of(variant, arm, seed, workroot)
  started = time.time()
  train(config, workdir, progress=False)
  return record(variant, arm, seed, workdir, time.time() - started)


def record(variant: str, arm: str, seed: int, workdir: str, wall: float,
           partial: bool = False) -> dict:
  """The run's record from its workdir's evaluations: the last one is its result. A run
  stopped before its last step is refused unless `partial` (then marked as stopped)."""
  import jax

  from t2mlr_jax.train import config as config_lib
  from t2mlr_jax.train.metrics import read_metrics
  config = build_config(variant, arm, seed)
  evals = read_metrics(workdir, "eval")
  done = bool(evals) and evals[-1]["step"] == config.train.num_steps
  if not evals or (not done and not partial):
    raise SystemExit(f"{key(variant, arm, seed)} stopped before step "
                     f"{config.train.num_steps} (interrupted?): rerun to resume")
  cfg = config_lib.model_config(config)
  final = evals[-1]
  jax.clear_caches()
  result = {
      "variant": variant, "arm": arm, "seed": seed, "params": cfg.num_params(),
      "arch": config.model.arch, "value_len": config.data.value_len,
      "group": config.data.group, "dict_size": config.data.dict_size,
      "train_mode": config_lib.train_mode(config, cfg),
      "steps": config.train.num_steps,
      **{k: final[k] for k in ("seq_acc", "state_acc", "value_acc", "seq_acc_by_length",
                               "state_acc_by_length", "value_acc_by_length",
                               "value_acc_by_slot") if k in final},
      "curve": [{k: r[k] for k in ("step", "seq_acc", "state_acc", "value_acc")}
                for r in evals],
      "wall_s": round(wall, 1), "commit": git_commit(),
      "machine": machine_info().get("cpu_model", ""), "date": time.strftime("%Y-%m-%d"),
      "command": f"python -m t2mlr_jax.main --config=configs/{ARMS[arm]}.py"
                 + (f":{variant}" if variant else "") + f" --config.train.seed={seed}",
  }
  if not done:
    result["stopped_at_eval"] = final["step"]
    result["wall_note"] = "stopped before its last step; wall time not recorded"
  return result


def add_slots(name: str, run: dict, workroot: str) -> bool:
  """Adds `value_acc_by_slot` (value accuracy per character, the trainer's evaluation
  rerun on the run's last checkpoint) to a record made before the metric existed; False
  when the record has it or its workdir does not hold that checkpoint."""
  from t2mlr_jax.train.tasks import evaluate_checkpoint
  step = run.get("stopped_at_eval", run["steps"])
  workdir = workdir_of(run["variant"], run["arm"], run["seed"], workroot)
  if "value_acc_by_slot" in run or not os.path.isdir(
      os.path.join(workdir, "checkpoints", str(step))):
    return False
  again = evaluate_checkpoint(workdir, step=step)
  if abs(again["value_acc"] - run["value_acc"]) > 1e-6:
    raise SystemExit(f"{name}: the rerun evaluation differs from the record (value acc "
                     f"{again['value_acc']} vs {run['value_acc']}); not added")
  run["value_acc_by_slot"] = again["value_acc_by_slot"]
  return True


def table() -> str:
  """One row per (variant, arm): accuracies at each evaluated length, per seed."""
  runs = read_json(RESULTS, default=EMPTY)["runs"]
  if not runs:
    return "(no runs recorded yet)"
  lengths = sorted({k for r in runs.values() for k in r["seq_acc_by_length"]}, key=int)
  lines = ["| variant | group | dictionary | v | arm | params | seed | "
           + " | ".join(f"seq {n}" for n in lengths) + " | state acc | value acc | "
           "value acc by character | wall |",
           "|---|---|---|---|---|---|---|" + "---|" * len(lengths) + "---|---|---|---|"]
  arm_order, variant_order = {a: i for i, a in enumerate(ARMS)}, {
      v or "v1": i for i, v in enumerate(VARIANTS)}
  for _, r in sorted(runs.items(), key=lambda kv: (
      variant_order[kv[1]["variant"] or "v1"], arm_order[kv[1]["arm"]], kv[1]["seed"])):
    accs = " | ".join(f"{r['seq_acc_by_length'].get(n, float('nan')):.2f}" for n in lengths)
    group = r.get("group", "S3")                  # records before the S4 variants: S3
    dictionary = r.get("dict_size") or "N (≤ 6)"
    wall = "—" if r.get("wall_note") else f"{r['wall_s'] / 60:.0f} min"   # not timed
    if "stopped_at_eval" in r:
      wall = f"stopped: eval at step {r['stopped_at_eval']} of {r['steps']}"
    slots = r.get("value_acc_by_slot", {})     # --slots adds it to earlier records
    by_slot = " / ".join(f"{slots[k]:.2f}" for k in sorted(slots, key=int)) or "—"
    arm = r["arm"] + (" (γ decayed)" if r.get("decayed_gate") else "")   # before 18519ee
    lines.append(f"| {r['variant'] or 'v1'} | {group} | {dictionary} | {r['value_len']} | "
                 f"{arm} | {r['params']:,} | {r['seed']} | {accs} | "
                 f"{r['state_acc']:.2f} | {r['value_acc']:.2f} | {by_slot} | {wall} |")
  return "\n".join(lines)


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--variants", default="v2,v4", help=f"comma-separated, of {VARIANTS} "
                 "('v1' names the default job)")
  p.add_argument("--arms", default="lstm", help=f"comma-separated, of {list(ARMS)}")
  p.add_argument("--seeds", default="0")
  p.add_argument("--workdir", default=os.path.join(ROOT, "workdirs", "s5_lstm_gap"))
  p.add_argument("--table", action="store_true")
  p.add_argument("--record_stopped", action="store_true",
                 help="record runs stopped before their last step from their workdirs' "
                      "last evaluation (marked as stopped) instead of training them")
  p.add_argument("--slots", action="store_true",
                 help="add value accuracy per character to recorded runs that lack it, "
                      "from their workdirs' last checkpoints")
  args = p.parse_args()
  if args.table:
    print(table())
    return
  if args.slots:
    for name in list(read_json(RESULTS, default=EMPTY)["runs"]):
      result = read_json(RESULTS, default=EMPTY)
      if add_slots(name, result["runs"][name], args.workdir):
        write_json(RESULTS, result, indent=1, stamp=False)
        print(f"{name}: value acc by character {result['runs'][name]['value_acc_by_slot']}")
    return
  variants = ["" if v == "v1" else v for v in args.variants.split(",") if v]
  arms = [a for a in args.arms.split(",") if a]
  bad = [v for v in variants if v not in VARIANTS] + [a for a in arms if a not in ARMS]
  if bad:
    p.error(f"unknown {bad}: allowed variants {['v1', *VARIANTS[1:]]}, arms {list(ARMS)}")
  seeds = [int(s) for s in args.seeds.split(",")]
  for variant in variants:
    for arm in arms:
      for seed in seeds:
        name = key(variant, arm, seed)
        if args.record_stopped:
          result = read_json(RESULTS, default=EMPTY)
          result["runs"][name] = record(variant, arm, seed,
                                        workdir_of(variant, arm, seed, args.workdir), 0.0,
                                        partial=True)
          write_json(RESULTS, result, indent=1, stamp=False)
          print(f"{name}: recorded from {workdir_of(variant, arm, seed, args.workdir)}")
          continue
        done = read_json(RESULTS, default=EMPTY)["runs"].get(name)
        if done and "stopped_at_eval" not in done:         # a stopped run is resumed
          print(f"{name}: recorded, skipped")
          continue
        print(f"[{time.strftime('%H:%M:%S')}] {name}", flush=True)
        run = run_one(variant, arm, seed, args.workdir)
        result = read_json(RESULTS, default=EMPTY)   # another process may have added runs
        result["runs"][name] = run
        write_json(RESULTS, result, indent=1, stamp=False)
        print(f"  seq acc by length {run['seq_acc_by_length']}, state "
              f"{run['state_acc']:.3f}, value {run['value_acc']:.3f}", flush=True)


if __name__ == "__main__":
  main()
