"""Why S5-Retrieval's lookup is hard at CPU scale: a two-key recall probe.

A sequence is a dictionary of `n_dict` (key, value) pairs, `|`, then a query key.
Two placements of the answer:
  query_at_key  the query key's own position predicts its value (plain associative
                recall: one induction-style match);
  blank_slot    the query key is followed by a blank slot that predicts the value,
                as in S5-Retrieval's format (docs/experiments.md#tasks): the slot must
                first fetch the key from the previous position, then match it.
Keys are 6 tokens (|S3|), values 62, as in the default S5 job. Each model trains on
fresh batches and is scored on 512 held-out sequences.

    python experiments/retrieval_probe.py     # writes experiments/results/retrieval_probe.json
    python experiments/retrieval_probe.py --seed=1 --out=retrieval_probe_seed1.json
    # 4 pairs, trained on 2 pairs first (a staged dictionary curriculum):
    python experiments/retrieval_probe.py --steps=5000 --n_dict=4 --dict_schedule=2:2000,3:3500 \
        --runs=transformer_3L_blank_slot,t2mlr_3L_layers0-1_blank_slot --seed=0 \
        --out=retrieval_probe_5000_ndict4_staged_seed0.json
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as bc  # noqa: E402

SEP, BLANK, KEYS, VALUES = 1, 8, range(2, 8), range(10, 72)
RUNS = {  # name: (placement, n_layers, T2MLR block (l_start, l_end) or None)
    "transformer_2L_query_at_key": ("query_at_key", 2, None),
    "transformer_2L_blank_slot": ("blank_slot", 2, None),
    "transformer_3L_blank_slot": ("blank_slot", 3, None),
    "t2mlr_3L_layers0-1_blank_slot": ("blank_slot", 3, (0, 1)),
}


def make_batch(rng, batch: int, n_dict: int, placement: str):
  """input_ids, target_ids (-100 except the answer) and control flow (the dictionary and
  `|` are cf 1, the query segment cf 2, as in S5-Retrieval)."""
  import numpy as np
  xs, ys = [], []
  for _ in range(batch):
    keys = rng.permutation(np.array(KEYS))[:n_dict]
    values = rng.choice(np.array(VALUES), n_dict)
    q = rng.integers(0, n_dict)
    tail = [keys[q]] if placement == "query_at_key" else [keys[q], BLANK]
    x = np.concatenate([np.stack([keys, values], 1).reshape(-1), [SEP], tail])
    y = np.full(len(x), -100)
    y[-1] = values[q]
    xs.append(x)
    ys.append(y)
  x = np.array(xs, np.int32)
  cf = np.ones_like(x)
  cf[:, 2 * n_dict + 1:] = 2
  return dict(input_ids=x, target_ids=np.array(ys, np.int32), control_flow=cf)


def parse_dict_schedule(schedule: str) -> list[tuple[int, int]]:
  """Stages "2:2500,3:4000" -> [(2, 2500), (3, 4000)]: 2 pairs up to step 2500, then 3 up
  to 4000, then --n_dict; "" = no stages."""
  stages = []
  for stage in filter(None, schedule.split(",")):
    size, sep, until = stage.partition(":")
    if not (sep and size.isdigit() and until.isdigit() and 1 <= int(size) <= len(KEYS)):
      raise ValueError(f"--dict_schedule stage {stage!r} is invalid: allowed SIZE:STEP with "
                       f"SIZE in 1..{len(KEYS)} and STEP an integer")
    stages.append((int(size), int(until)))
  return stages


def dict_size_at(step: int, stages: list[tuple[int, int]], n_dict: int) -> int:
  """Training dictionary size at (1-based) `step` under parsed stages."""
  for size, until in stages:
    if step <= until:
      return size
  return n_dict


def run(name, placement, n_layers, block, args):
  import jax
  import jax.numpy as jnp
  import numpy as np
  import optax

  import t2mlr_jax
  from t2mlr_jax import ModelConfig, T2MLRConfig, forward
  from t2mlr_jax.losses import cross_entropy

  rec = None if block is None else T2MLRConfig(l_start=block[0], l_end=block[1])
  cfg = ModelConfig(vocab_size=80, d_model=64, n_layers=n_layers, n_heads=4, d_ff=256,
                    max_seq_len=64, rope_theta=10000.0, tie_embeddings=False, recurrence=rec,
                    schedule_options=dict(d_forward=4, d_backward=2))
  train_mode, eval_mode = ("jacobi", "exact") if rec else ("parallel", "parallel")
  params = t2mlr_jax.init_params(cfg, jax.random.PRNGKey(args.seed))
  tx = optax.adamw(optax.warmup_cosine_decay_schedule(0.0, args.lr, 100, args.steps,
                                                      args.lr * 0.01), b2=0.98,
                   weight_decay=0.01)
  opt = tx.init(params)

  def logits(p, b, mode):
    return forward(p, cfg, b["input_ids"], mode=mode, control_flow=b["control_flow"])

  @jax.jit
  def step(p, o, b):
    loss, g = jax.value_and_grad(lambda p: cross_entropy(logits(p, b, train_mode),
                                                         b["target_ids"])[0])(p)
    u, o = tx.update(g, o, p)
    return optax.apply_updates(p, u), o, loss

  predict = jax.jit(lambda p, b: jnp.argmax(logits(p, b, eval_mode), -1))
  rng = np.random.default_rng(args.seed)
  held_out = make_batch(np.random.default_rng(10**6), 512, args.n_dict, placement)
  answer = held_out["target_ids"] >= 0
  curve, start = {}, time.perf_counter()
  for i in range(1, args.steps + 1):
    n = dict_size_at(i, args.stages, args.n_dict)
    params, opt, loss = step(params, opt, make_batch(rng, args.batch, n, placement))
    if i % args.eval_every == 0:
      pred = np.asarray(predict(params, held_out))
      curve[i] = round(float((pred[answer] == held_out["target_ids"][answer]).mean()), 3)
      print(name, i, f"loss {float(loss):.3f}", "accuracy", curve[i], flush=True)
  return {"placement": placement, "n_layers": n_layers, "t2mlr_block": block,
          "accuracy_by_step": curve, "seconds": round(time.perf_counter() - start, 1)}


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--steps", type=int, default=2000)
  p.add_argument("--batch", type=int, default=64)
  p.add_argument("--n_dict", type=int, default=2)
  p.add_argument("--dict_schedule", default="",
                 help="staged training dictionary sizes, e.g. '2:2500' = 2 pairs up to step "
                      "2500, then --n_dict (evaluation always uses --n_dict)")
  p.add_argument("--lr", type=float, default=3e-3)
  p.add_argument("--eval_every", type=int, default=500)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--runs", default=",".join(RUNS), help=f"comma-separated subset of {list(RUNS)}")
  p.add_argument("--out", default="retrieval_probe.json")
  args = p.parse_args()
  unknown = set(args.runs.split(",")) - set(RUNS)
  if unknown:
    p.error(f"--runs has {sorted(unknown)}: allowed {list(RUNS)}")
  try:
    args.stages = parse_dict_schedule(args.dict_schedule)
  except ValueError as e:
    p.error(str(e))
  results = {"settings": {k: getattr(args, k) for k in ("steps", "batch", "n_dict",
                                                       "dict_schedule", "lr", "seed")},
             "chance": round(1 / args.n_dict, 3), "runs": {}}
  for name in args.runs.split(","):
    results["runs"][name] = run(name, *RUNS[name], args)
  print("wrote", bc.write_json(args.out, results))


if __name__ == "__main__":
  main()
