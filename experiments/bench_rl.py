"""Rollout throughput of GRPO's sampler (docs/rl.md): samples a second drawn as the trainer
draws them, every prompt's G samples in one batched decode (train/grpo.sample: each row its
own KV cache and recurrent state, one compiled program), against the same samples drawn one
at a time with `generate`, side by side in one run.

Random weights at a named shape (default SmolLM2-135M, T2MLR on layers 13-18, γ 0.5 so the
recurrence computes), fp32 on the CPU, temperature 1, prompts of --prompt tokens, --new
tokens each, no EOS (every sample runs to its full length). Runs alternate; medians of
`--repeats`.

    python experiments/bench_rl.py                          # -> experiments/results/bench_rl.json
    python experiments/bench_rl.py --shape tiny --prompts 4 --group 8
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as bc  # noqa: E402


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--shape", default="smollm2-135m", help="a ModelConfig preset, or 'tiny'")
  p.add_argument("--l_start", type=int, default=13)
  p.add_argument("--l_end", type=int, default=18)
  p.add_argument("--prompts", type=int, default=2)
  p.add_argument("--group", type=int, default=8)
  p.add_argument("--prompt", type=int, default=64)
  p.add_argument("--new", type=int, default=32)
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--out", default="bench_rl.json")
  args = p.parse_args(argv)

  import jax
  import numpy as np

  import t2mlr_jax
  from t2mlr_jax import ModelConfig, T2MLRConfig
  from t2mlr_jax.train import grpo

  rec = T2MLRConfig(l_start=args.l_start, l_end=args.l_end)
  if args.shape == "tiny":
    cfg = ModelConfig(vocab_size=256, d_model=64, n_layers=4, n_heads=4, d_ff=256,
                      max_seq_len=512, recurrence=T2MLRConfig(l_start=1, l_end=2))
  else:
    cfg = ModelConfig.preset(args.shape, recurrence=rec)
  params = t2mlr_jax.init_params(cfg, jax.random.PRNGKey(0))
  params["recurrence"]["gamma_rec"] = np.float32(0.5)
  params["recurrence"]["gamma_cur"] = np.float32(0.5)
  rs = np.random.RandomState(0)
  prompts = [rs.randint(0, cfg.vocab_size, args.prompt).tolist() for _ in range(args.prompts)]
  flows = [[1] * args.prompt for _ in prompts]
  rl = grpo.GRPOConfig(group_size=args.group, max_new_tokens=args.new, temperature=1.0)
  key = jax.random.PRNGKey(1)
  rows = np.asarray([q for q in prompts for _ in range(args.group)], np.int32)

  def batched():
    return grpo.sample(params, cfg, prompts, flows, rl, key, eos_id=None).tokens

  def one_at_a_time():
    return [t2mlr_jax.generate(params, cfg, rows[r:r + 1], max_new_tokens=args.new,
                               temperature=1.0, rng=jax.random.fold_in(key, r),
                               prompt_control_flow=1) for r in range(len(rows))]

  runs = {"batched": batched, "one_at_a_time": one_at_a_time}
  for fn in runs.values():        # compile
    jax.block_until_ready(fn())
  times = bc.alternate(runs, args.repeats)
  samples = len(rows)
  med = {k: bc.median(v) for k, v in times.items()}
  results = {
      "shape": args.shape, "recurrent_block": [rec.l_start, rec.l_end] if args.shape != "tiny"
      else [1, 2], "dtype": "float32", "prompts": args.prompts, "group_size": args.group,
      "prompt_tokens": args.prompt, "new_tokens": args.new, "samples": samples,
      "batched_samples_per_s": round(samples / med["batched"], 3),
      "one_at_a_time_samples_per_s": round(samples / med["one_at_a_time"], 3),
      "speedup": round(med["one_at_a_time"] / med["batched"], 3),
      "raw_seconds": {k: [round(x, 4) for x in v] for k, v in times.items()},
      "machine": bc.machine_info(), "commit": bc.git_commit()}
  print({k: v for k, v in results.items() if k not in ("raw_seconds", "machine")}, flush=True)
  print("wrote", bc.write_json(args.out, results))


if __name__ == "__main__":
  main()
