"""Exact parallel prefill: Jacobi sweeps until max|ΔR| < tol (capped at T sweeps) vs
token-by-token exact prefill (docs/performance.md#cost-model).

On a trained S5 model (a workdir of the length sweep or the default job), on random
weights at the same shape with the recurrence switched on (γ = 0.5), and on the same
random weights with the raw cache (`residual=False`: R_{t+1} = o_t), whose recurrence
contracts. The residual cache R <- norm(o + R) is a near-integrator and barely
contracts, so those two need all (or nearly all) T sweeps; above --max_len_full they
are timed once (--repeats otherwise): ~2000 sweeps at T = 2048 take minutes per run.
Reports the sweeps needed, the speed-up and the max logit difference to exact.

    python experiments/bench_prefill.py --workdir=workdirs/s5_length_sweep/word/t2mlr_middle
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as bc  # noqa: E402


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--workdir", default=os.path.join(bc.ROOT, "workdirs", "s5_length_sweep",
                                                   "word", "t2mlr_middle"))
  p.add_argument("--lengths", default="128,512,2048")
  p.add_argument("--max_len_full", type=int, default=512,
                 help="longer prompts are timed once for the models that need all T sweeps")
  p.add_argument("--tol", type=float, default=1e-4)
  p.add_argument("--repeats", type=int, default=5)
  p.add_argument("--out", default="bench_prefill.json")
  args = p.parse_args()

  import jax
  import jax.numpy as jnp
  import numpy as np

  import t2mlr_jax
  from t2mlr_jax import checkpoint
  from t2mlr_jax.data import s5_examples, s5_group
  from t2mlr_jax.model import modes
  from t2mlr_jax.model.schedules import jacobi as jacobi_schedule

  cfg, trained = checkpoint.load(args.workdir)
  max_len = max(int(x) for x in args.lengths.split(","))
  cfg = cfg.replace(max_seq_len=max(cfg.max_seq_len, max_len))   # NoPE: any length
  rand = t2mlr_jax.init_params(cfg, jax.random.PRNGKey(1))
  rand["recurrence"]["gamma_rec"] = np.float32(0.5)
  rand["recurrence"]["gamma_cur"] = np.float32(0.5)

  raw_cfg = cfg.replace(recurrence=cfg.recurrence.replace(residual=False))
  lengths = [int(x) for x in args.lengths.split(",")]
  results = {"config": {k: v for k, v in cfg.to_dict().items() if k != "recurrence"},
             "recurrence": cfg.recurrence.to_dict(), "tol": args.tol, "models": {}}
  for name, mcfg, params, needs_all_sweeps in (
      ("trained_s5", cfg, trained, True), ("random_gamma0.5", cfg, rand, True),
      ("random_gamma0.5_raw_cache", raw_cfg, rand, False)):
    exact_fn = jax.jit(lambda p, t, i, c=mcfg: modes.exact(p, c, t, i)[0])
    jac_fn = jax.jit(lambda p, t, i, c=mcfg: jacobi_schedule.jacobi_prefill(p, c, t, i, args.tol)[:2])
    rows = {}
    for T in lengths:
      if cfg.vocab_size == s5_group.VOCAB_SIZE:     # an S3 word problem of T actions
        tokens = s5_examples.generate_word_problem(7, T, group="S3")["input_ids"][None]
      else:
        tokens = np.random.RandomState(0).randint(0, cfg.vocab_size, (1, T)).astype(np.int32)
      tokens = jnp.asarray(tokens)
      inp = modes.seq_inputs(tokens)
      ref = jax.block_until_ready(exact_fn(params, tokens, inp))
      logits, aux = jax.block_until_ready(jac_fn(params, tokens, inp))
      repeats = 1 if needs_all_sweeps and T > args.max_len_full else args.repeats
      times = bc.alternate({"exact": lambda: exact_fn(params, tokens, inp),
                            "jacobi": lambda: jac_fn(params, tokens, inp)}, repeats)
      rows[str(T)] = {
          "exact_ms": round(bc.median(times["exact"]) * 1e3, 2),
          "jacobi_ms": round(bc.median(times["jacobi"]) * 1e3, 2),
          "speedup": round(bc.median(times["exact"]) / bc.median(times["jacobi"]), 2),
          "sweeps": int(aux["jacobi_sweeps"]), "repeats": repeats,
          "residual": float(aux["jacobi_residual"]),
          "max_logit_diff": float(jnp.max(jnp.abs(logits - ref)))}
      print(name, T, rows[str(T)], flush=True)
    results["models"][name] = rows
  print("wrote", bc.write_json(args.out, results))


if __name__ == "__main__":
  main()
