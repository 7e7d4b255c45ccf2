"""Pretraining on real text: T2MLR (middle block, every layer), LRT and a parameter-matched
transformer on the Gutenberg corpus (configs/lm_gutenberg.py), at one budget in tokens,
then the transformer again at the costliest arm's training FLOPs.

    python experiments/pretrain_lm.py [--tokens=2457600] [--seed=0]

Prepares the data when data/gutenberg_bpe2048 is missing (fetches the sdist with pip).
Every arm reads the same shuffled block stream (same seed) and is evaluated on the same
64 held-out blocks in bits per byte: `exact` (the true recurrence, what decoding sees),
`parallel` (recurrence off) and the training view (Jacobi / interleaved). FLOPs are the
library's cost model (t2mlr_jax.flops.train_step_flops). Writes
experiments/results/pretrain_lm.json and pretrain_lm.png; finished runs in --workdir are
read back instead of retrained.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import platform
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
RESULTS = os.path.join(ROOT, "experiments", "results")
ARMS = ("transformer", "t2mlr", "t2mlr_all", "lrt")


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


def run_arm(name: str, variant: str, steps: int, evals: int, seed: int, data: str,
            workdir: str) -> dict:
  import jax

  from t2mlr_jax import flops
  from t2mlr_jax.train import config as config_lib
  from t2mlr_jax.train.loop import train
  from t2mlr_jax.train.metrics import read_metrics
  config = _config_module().get_config(variant)
  config.data.path = data
  config.train.update(num_steps=steps, eval_every=max(1, steps // evals), seed=seed,
                      checkpoint_every=max(1, steps // evals), log_every=25)
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
  jax.clear_caches()
  return {"variant": variant, "params": cfg.num_params(), "d_ff": cfg.d_ff,
          "train_mode": mode, "recurrence": config.model.recurrence.to_dict(),
          "steps": steps, "tokens": steps * tokens_per_step, "step_flops": step_flops,
          "flops": steps * step_flops, "final": curve[-1], "curve": curve,
          "train_loss_last": train_log[-1]["loss"] if train_log else None,
          "tokens_per_sec_last": train_log[-1]["tokens_per_sec"] if train_log else None,
          "wall_s": round(wall, 1),
          "command": f"python -m t2mlr_jax.main --config=configs/lm_gutenberg.py:{variant} "
                     f"--config.train.num_steps={steps} --config.train.seed={seed}"}


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


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--tokens", type=int, default=2_457_600, help="training tokens per arm")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--evals", type=int, default=4, help="evaluations per arm")
  p.add_argument("--arms", default=",".join(ARMS))
  p.add_argument("--data", default=os.path.join(ROOT, "data", "gutenberg_bpe2048"))
  p.add_argument("--workdir", default=os.path.join(ROOT, "workdirs", "pretrain_lm"))
  p.add_argument("--no_flops_match", action="store_true",
                 help="skip the transformer run at the costliest arm's FLOPs")
  p.add_argument("--out", default=os.path.join(RESULTS, "pretrain_lm.json"))
  args = p.parse_args()
  from t2mlr_jax.data import lm
  from t2mlr_jax.train.metrics import quiet_absl_logs
  quiet_absl_logs()
  ensure_data(args.data)
  manifest = lm.read_manifest(args.data)
  tokens_per_step = 16 * manifest["block_size"]
  steps = math.ceil(args.tokens / tokens_per_step)
  arms = {}
  for name in args.arms.split(","):
    print(f"[{time.strftime('%H:%M:%S')}] {name}: {steps} steps", flush=True)
    arms[name] = run_arm(name, name, steps, args.evals, args.seed, args.data,
                         os.path.join(args.workdir, f"{name}_seed{args.seed}"))
    print(f"  exact bpb {arms[name]['final']['exact']:.4f} in {arms[name]['wall_s']} s",
          flush=True)
  if not args.no_flops_match and "transformer" in arms:
    target = max((a for n, a in arms.items() if n != "transformer"), key=lambda a: a["flops"],
                 default=None)
    if target is not None:
      tf_steps = math.ceil(target["flops"] / arms["transformer"]["step_flops"])
      print(f"[{time.strftime('%H:%M:%S')}] transformer_flops: {tf_steps} steps "
            f"(= {target['variant']}'s FLOPs)", flush=True)
      arms["transformer_flops"] = run_arm("transformer_flops", "transformer", tf_steps,
                                          2 * args.evals, args.seed, args.data,
                                          os.path.join(args.workdir,
                                                       f"transformer_flops_seed{args.seed}"))
      arms["transformer_flops"]["matches_flops_of"] = target["variant"]
  result = {
      "command": "python experiments/pretrain_lm.py " + " ".join(sys.argv[1:]),
      "data": {"path": os.path.relpath(args.data, ROOT), "block_size": manifest["block_size"],
               "tokenizer": manifest["tokenizer"],
               "splits": {k: {f: v[f] for f in ("documents", "tokens", "bytes", "blocks")}
                          for k, v in manifest["splits"].items()}},
      "budget_tokens": steps * tokens_per_step, "seed": args.seed, "eval_blocks": 64,
      "arms": arms,
      "recorded": {"date": time.strftime("%Y-%m-%d %H:%M"), "machine":
                   f"{platform.machine()}, {os.cpu_count()} CPU cores"}}
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(result, f, indent=2)
  plot(result, os.path.splitext(args.out)[0] + ".png")
  for name, arm in arms.items():
    f = arm["final"]
    views = ", ".join(f"{k} {v:.4f}" for k, v in f.items() if k not in ("step", "tokens",
                                                                          "flops"))
    print(f"{name:18s} params {arm['params']:,}  tokens {arm['tokens']:,}  "
          f"TFLOP {arm['flops'] / 1e12:.1f}  bpb: {views}")
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
