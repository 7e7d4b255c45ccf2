"""Full-sequence attention: the library's `layers.attend` (batch-major heads, written-out
backward) against two alternatives, in one process, runs alternated, medians.

  einsum  einsum scores + masked softmax + einsum, autodiff backward (the library's
          implementation until 2026-11-29)
  dpa     `jax.nn.dot_product_attention` (XLA), autodiff backward
  attend  `t2mlr_jax.model.layers.attend`

Each alternative is patched in while its functions are traced, so the rest of the
model is the same code. Parts:
  train    the baseline (recurrence off) and Jacobi(16, 4) train steps (loss + grads),
           γ = 0.5, at a `bench_train` shape; and the largest gradient difference.
  prefill  Jacobi prefill (tol 1e-4) and exact prefill of a random S5-shape model with
           the raw, contracting cache at long T, where attention dominates.

    python experiments/bench_attention.py                    # both parts, both shapes
    python experiments/bench_attention.py --parts train --shapes s5
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as bc  # noqa: E402
import bench_train as bt  # noqa: E402


def _einsum_attend(q, k, v, mask_BTS):
  import jax.numpy as jnp

  from t2mlr_jax.model import layers
  B, T, N, K = q.shape
  M = k.shape[2]
  s = jnp.einsum("btmgk,bsmk->bmgts", q.reshape(B, T, M, N // M, K), k
                 ).astype(jnp.float32) / math.sqrt(K)
  p = layers._masked_softmax(s, mask_BTS).astype(q.dtype)
  return jnp.einsum("bmgts,bsmk->btmgk", p, v).reshape(B, T, N, K)


def _dpa_attend(q, k, v, mask_BTS):
  import jax
  import jax.numpy as jnp
  out = jax.nn.dot_product_attention(q, k, v, mask=mask_BTS[:, None],
                                     scale=1.0 / math.sqrt(q.shape[-1]))
  return jnp.where(jnp.any(mask_BTS, axis=-1)[:, :, None, None], out, 0.0).astype(q.dtype)


IMPLS = {"einsum": _einsum_attend, "dpa": _dpa_attend, "attend": None}


@contextlib.contextmanager
def implementation(name):
  from t2mlr_jax.model import layers
  real = layers.attend
  if IMPLS[name] is not None:
    layers.attend = IMPLS[name]
  try:
    yield
  finally:
    layers.attend = real


def _loss_and_grad(cfg, mode):
  """Loss and grads, traced here (not through `forward`, whose inner jit would reuse
  the first implementation's trace)."""
  import jax

  from t2mlr_jax.losses import cross_entropy, next_token_labels
  from t2mlr_jax.model import modes

  def loss(p, t):
    inp = modes.seq_inputs(t)
    if mode == "parallel":
      logits = modes.parallel(p, cfg, t, inp)[0]
    else:
      logits = modes.jacobi(p, cfg, t, inp, 16, 4, None)[0]
    return cross_entropy(logits, next_token_labels(t))[0]

  return jax.jit(jax.value_and_grad(loss))


def part_train(shape, repeats):
  import jax
  import jax.numpy as jnp
  import numpy as np

  import t2mlr_jax
  cfg, B, T = bt.build(shape, d_forward=16, d_backward=4)
  params = t2mlr_jax.init_params(cfg, jax.random.PRNGKey(0))
  params["recurrence"]["gamma_rec"] = np.float32(0.5)
  params["recurrence"]["gamma_cur"] = np.float32(0.5)
  base = {k: v for k, v in params.items() if k != "recurrence"}
  tokens = np.random.RandomState(0).randint(0, cfg.vocab_size, (B, T)).astype(np.int32)
  fns, outs = {}, {}
  for impl in IMPLS:
    for step, c, mode, p in (("baseline", cfg.replace(recurrence=None), "parallel", base),
                             ("jacobi", cfg, "jacobi", params)):
      f = _loss_and_grad(c, mode)
      with implementation(impl):
        outs[f"{step}/{impl}"] = jax.block_until_ready(f(p, tokens))
      fns[f"{step}/{impl}"] = lambda f=f, p=p: f(p, tokens)
  times = bc.alternate(fns, repeats)
  med = {k: bc.median(v) for k, v in times.items()}

  def grad_diff(a, b):
    return max(float(jnp.max(jnp.abs(x - y)))
               for x, y in zip(jax.tree.leaves(outs[a][1]), jax.tree.leaves(outs[b][1])))

  steps = ("baseline", "jacobi")
  return {"shape": shape, "batch": B, "seq_len": T,
          "ms": {k: round(v * 1e3, 1) for k, v in med.items()},
          "speedup_of_attend": {f"{s}/{i}": round(med[f"{s}/{i}"] / med[f"{s}/attend"], 3)
                                for s in steps for i in ("einsum", "dpa")},
          "loss": {k: float(v[0]) for k, v in outs.items()},
          "max_grad_diff_to_attend": {f"{s}/{i}": grad_diff(f"{s}/{i}", f"{s}/attend")
                                      for s in steps for i in ("einsum", "dpa")}}


def part_prefill(lengths, repeats):
  import jax
  import jax.numpy as jnp
  import numpy as np

  import t2mlr_jax
  from t2mlr_jax.model import modes
  from t2mlr_jax.model.schedules import jacobi as jacobi_schedule
  cfg, _, _ = bt.build("s5", residual=False)
  cfg = cfg.replace(max_seq_len=max(lengths))
  params = t2mlr_jax.init_params(cfg, jax.random.PRNGKey(1))
  params["recurrence"]["gamma_rec"] = np.float32(0.5)
  params["recurrence"]["gamma_cur"] = np.float32(0.5)
  out = {}
  for T in lengths:
    tokens = jnp.asarray(np.random.RandomState(0).randint(0, cfg.vocab_size, (1, T)), jnp.int32)
    inp = modes.seq_inputs(tokens)
    fns = {}
    for impl in IMPLS:
      for kind in ("exact", "jacobi"):
        if kind == "exact":
          f = jax.jit(lambda p, t, i: modes.exact(p, cfg, t, i, last_only=True)[0])
        else:
          f = jax.jit(lambda p, t, i: jacobi_schedule.jacobi_prefill(p, cfg, t, i, 1e-4, True)[0])
        with implementation(impl):
          jax.block_until_ready(f(params, tokens, inp))
        fns[f"{kind}/{impl}"] = lambda f=f: f(params, tokens, inp)
    times = bc.alternate(fns, repeats)
    out[str(T)] = {k: round(bc.median(v) * 1e3, 1) for k, v in times.items()}
    print("prefill", T, out[str(T)], flush=True)
  return {"model": "s5 shape, random, γ = 0.5, residual=False", "ms": out}


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--parts", default="train,prefill")
  p.add_argument("--shapes", default="s5,smollm2-135m")
  p.add_argument("--lengths", default="512,2048")
  p.add_argument("--repeats", type=int, default=5)
  p.add_argument("--out", default="bench_attention.json")
  args = p.parse_args()
  for shape in args.shapes.split(","):
    if shape not in bt.SHAPES:
      p.error(f"--shapes: {shape!r} is not one of {sorted(bt.SHAPES)}")
  for part in args.parts.split(","):
    if part not in ("train", "prefill"):
      p.error(f"--parts: unknown part {part!r}; allowed train, prefill")
  results = {}
  for part in args.parts.split(","):
    if part == "train":
      for shape in args.shapes.split(","):
        results[f"train_{shape}"] = part_train(shape, args.repeats)
        print("train", results[f"train_{shape}"], flush=True)
    else:
      results["prefill"] = part_prefill([int(x) for x in args.lengths.split(",")],
                                        args.repeats)
  print("wrote", bc.write_json(args.out, results))


if __name__ == "__main__":
  main()
