"""What the checkpoint checksums cost: save and restore of a SmolLM2-135M-shaped train state
(configs/fineweb_135m.py's model, its AdamW state, the moments random as a trained run's)
with and without them, medians.

    python experiments/bench_checkpoint_integrity.py [--repeats=5]
        # writes experiments/results/bench_checkpoint_integrity.json

"with" is the Checkpointer as shipped (a crc32 of every array at save; each restored array
checked); "without" the same with the checksums left out (nothing recorded, nothing
checked). Also the two parts alone on the state in memory: computing the checksums
(save) and checking them (restore). One process, one CPU device, saves synchronous.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import bench_common as bc

sys.path.insert(0, os.path.join(bc.ROOT, "configs"))


def _state():
  """The fresh train state of configs/fineweb_135m.py on one device, and its model config."""
  import fineweb_135m
  import jax

  from t2mlr_jax import sharding
  from t2mlr_jax.train import config as config_lib
  from t2mlr_jax.train.optimizer import make_optimizer
  from t2mlr_jax.train.step import create_state
  config = fineweb_135m.get_config()
  cfg = config_lib.model_config(config)
  tx, _ = make_optimizer(config_lib.optimizer_config(config), config.train.num_steps, cfg)
  mesh = sharding.make_mesh({"data": 1, "fsdp": 1, "tensor": 1},
                            model_width=cfg.d_model)
  state = create_state(cfg, tx, jax.random.PRNGKey(0), mesh)
  # a trained run's moments are not the fresh zeros (which compress to nothing): random
  leaves, treedef = jax.tree.flatten(state.opt_state)
  keys = jax.random.split(jax.random.PRNGKey(1), len(leaves))
  leaves = [1e-3 * jax.random.normal(k, x.shape, x.dtype) if x.ndim else x
            for k, x in zip(keys, leaves)]
  state = state.replace(opt_state=jax.tree.unflatten(treedef, leaves))
  return jax.block_until_ready(state), cfg, config.to_dict()


def _iterator():
  import grain
  return iter(grain.MapDataset.range(10).to_iter_dataset())


def _save_restore(wd, state, abstract, cfg, config, check):
  """Seconds of a synchronous save of `state` and of its restore (checked bit-identical
  when `check`); the step removed after."""
  import shutil

  import jax
  import numpy as np

  from t2mlr_jax import checkpoint
  ckpt = checkpoint.Checkpointer(wd, async_save=False)
  start = time.perf_counter()
  ckpt.save(1, state, _iterator(), config, cfg)
  save_s = time.perf_counter() - start
  start = time.perf_counter()
  restored = jax.block_until_ready(ckpt.restore(1, abstract, _iterator()))
  restore_s = time.perf_counter() - start
  if check:
    assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in
               zip(jax.tree.leaves(restored), jax.tree.leaves(state)))
  ckpt.close()
  shutil.rmtree(wd)
  return save_s, restore_s


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--out", default="bench_checkpoint_integrity.json")
  args = parser.parse_args(argv)
  import jax

  from t2mlr_jax import checkpoint
  state, cfg, config = _state()
  n_params = sum(x.size for x in jax.tree.leaves(state.params))
  n_bytes = sum(x.nbytes for x in jax.tree.leaves(state))
  train = {"step": state.step, "opt_state": state.opt_state,
           "nonfinite_step": state.nonfinite_step}
  with_checksums, with_check = checkpoint.array_checksums, checkpoint.first_mismatch
  inside = {"compute": [], "check": []}      # the checksum parts' seconds inside save/restore

  def timed_part(name, fn):
    def part(*args):
      start = time.perf_counter()
      out = fn(*args)
      inside[name].append(time.perf_counter() - start)
      return out
    return part
  records = {**with_checksums(state.params, "params"), **with_checksums(train, "train")}
  parts = bc.alternate({
      "compute": lambda: (with_checksums(state.params, "params"),
                          with_checksums(train, "train")),
      "check": lambda: [checkpoint.first_mismatch(records, t, k)
                        for k, t in (("params", state.params), ("train", train))]},
      args.repeats)
  abstract = jax.eval_shape(lambda: state)
  abstract = jax.tree.map(lambda a, x: jax.ShapeDtypeStruct(a.shape, a.dtype,
                                                            sharding=x.sharding),
                          abstract, state)
  times = {f"{w}_{k}": [] for w in ("with", "without") for k in ("save", "restore")}
  with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
    for r in range(args.repeats):
      for which in (("with", "without") if r % 2 == 0 else ("without", "with")):
        # "without": nothing recorded, so nothing is checked on restore
        checkpoint.array_checksums = (timed_part("compute", with_checksums)
                                      if which == "with" else lambda tree, item: {})
        checkpoint.first_mismatch = (timed_part("check", with_check) if which == "with"
                                     else with_check)
        save_s, restore_s = _save_restore(os.path.join(tmp, f"{which}{r}"), state,
                                          abstract, cfg, config, check=r == 0)
        times[f"{which}_save"].append(save_s)
        times[f"{which}_restore"].append(restore_s)
    checkpoint.array_checksums, checkpoint.first_mismatch = with_checksums, with_check
  # per save / restore: the items' parts (params, train) summed; "without" checks nothing
  per_call = {k: [sum(v[i:i + 2]) for i in range(0, len(v), 2)] for k, v in inside.items()}
  med = {k: round(bc.median(v), 3) for k, v in times.items()}
  result = {
      "model": "configs/fineweb_135m.py (SmolLM2-135M shape, T2MLR 13-18), AdamW state",
      "params": int(n_params), "state_bytes": int(n_bytes), "repeats": args.repeats,
      "seconds_median": med,
      "checksums_alone_seconds_median": {k: round(bc.median(v), 3) for k, v in parts.items()},
      "checksums_inside_seconds_median": {k: round(bc.median(v), 3)
                                          for k, v in per_call.items()},
      "overhead": {
          "save_seconds": round(med["with_save"] - med["without_save"], 3),
          "restore_seconds": round(med["with_restore"] - med["without_restore"], 3),
          "save_fraction": round(med["with_save"] / med["without_save"] - 1, 3),
          "restore_fraction": round(med["with_restore"] / med["without_restore"] - 1, 3)},
      "crc32_gb_per_s": round(n_bytes / 1e9 / bc.median(parts["compute"]), 2),
      "seconds": {k: [round(t, 3) for t in v] for k, v in times.items()},
  }
  print(bc.write_json(args.out, result))
  print(result["seconds_median"], result["checksums_alone_seconds_median"], result["overhead"])


if __name__ == "__main__":
  main()
