"""Accelerator numbers in a few minutes on one GPU or TPU chip: MFU of the baseline and
T2MLR (Jacobi 16/4) train steps, greedy decode tokens/s, time to first token (prompts of
128 and 1024 tokens), the fused attention kernel against xla, bf16 compute with fp32
master weights, at the SmolLM2-135M and -360M shapes; and LRT (interleaved S = 2) against
its nanochat-d12 backbone.

    python experiments/bench_accel.py                       # writes results/bench_accel.json
    python experiments/bench_accel.py --shapes smollm2-135m --steps 5   # quicker
    python experiments/bench_accel.py --compile_only=h200-1 # no GPU: compile it for one

`--compile_only=NAME` (a GPU node or TPU slice of `python -m t2mlr_jax.compile`) compiles
the script's own functions for those devices on any host, running nothing: the baseline
and T2MLR Jacobi 16/4 train steps, generate's decode loop and its time-to-first-token
call, each shape in bf16, with each program's memory against the device's and its fused
attention calls (exit 1 when one does not fit). A lent accelerator then runs a script
already known to build (GPUs: JAX's CUDA plugin, docs/gpu.md; TPUs: libtpu).

The CPU is never the default device elsewhere; this script refuses to run on one
unless --allow-cpu (then at a toy size, to check the script itself).

Run from the source tree (no install), so it works with the jax an accelerator image
already has (tested here against jax 0.10.2 and 0.11.2); the only package it needs
beyond jax, flax, optax and chex is ml_collections. On a machine that cannot reach
PyPI, fetch that wheel elsewhere and carry it along:

    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
        -d .whl ml_collections==1.1.0                       # where pip works
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
    PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 python3 experiments/bench_accel.py

When $OUT is set (a lent device machine) the JSON is copied there too.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as bc  # noqa: E402

BLOCKS = {"smollm2-135m": (13, 18), "smollm2-360m": (13, 19)}


def train_step_for(cfg, mode, mesh, num_steps_schedule=1000):
  """The trainer's jitted train step over `mesh` for `mode`, and its optimizer."""
  from t2mlr_jax.train.config import base_config
  from t2mlr_jax.train.optimizer import make_optimizer
  from t2mlr_jax.train.step import make_train_step
  tx, schedule = make_optimizer(base_config().optimizer, num_steps_schedule)
  return make_train_step(cfg, tx, schedule, mode, mesh), tx


def generate_call(cfg, new, prompt_cf=2):
  """The script's generate call, (params, tokens) -> new tokens (decode_tps, ttft_ms)."""
  import t2mlr_jax
  return lambda params, tokens: t2mlr_jax.generate(params, cfg, tokens, max_new_tokens=new,
                                                   prompt_control_flow=prompt_cf)


def train_mfu(cfg, batch, seq_len, mode, steps, num_steps_schedule=1000):
  import jax
  import numpy as np

  from t2mlr_jax import flops, sharding
  from t2mlr_jax.train.step import create_state
  mesh = sharding.make_mesh({"data": -1})
  step, tx = train_step_for(cfg, mode, mesh, num_steps_schedule)
  state = create_state(cfg, tx, jax.random.PRNGKey(0), mesh)
  rng = np.random.RandomState(0)
  tokens = rng.randint(0, cfg.vocab_size, (batch, seq_len)).astype(np.int32)
  data = {"input_ids": tokens, "target_ids": np.roll(tokens, -1, 1),
          "control_flow": np.full_like(tokens, 2)}
  data = {k: jax.device_put(v, sharding.batch_sharding(mesh)) for k, v in data.items()}
  start = time.perf_counter()
  state, m = step(state, data)
  jax.block_until_ready(m)
  compile_s = time.perf_counter() - start
  times = []
  for _ in range(steps):
    t0 = time.perf_counter()
    state, m = step(state, data)
    jax.block_until_ready(m)
    times.append(time.perf_counter() - t0)
  sec = bc.median(times)
  model_flops = flops.train_step_flops(cfg, batch, seq_len, mode)
  return {"batch": batch, "seq_len": seq_len, "mode": mode, "ms_per_step": round(sec * 1e3, 2),
          "tokens_per_s": round(batch * seq_len / sec), "compile_s": round(compile_s, 1),
          "model_tflops_per_s": round(model_flops / sec / 1e12, 2),
          "mfu": flops.mfu(model_flops, sec, jax.device_count()),
          "loss": float(m["loss"])}


def decode_tps(cfg, batch, prompt, new, repeats):
  import jax
  import numpy as np

  import t2mlr_jax
  params = t2mlr_jax.init_params(cfg, jax.random.PRNGKey(0))
  tokens = np.random.RandomState(0).randint(0, cfg.vocab_size, (batch, prompt)).astype(np.int32)
  calls = {n: generate_call(cfg, n) for n in (new, 1)}
  run = lambda n: (lambda: calls[n](params, tokens))
  run(new)(), run(1)()
  times = bc.alternate({"n": run(new), "one": run(1)}, repeats)
  per_step = (bc.median(times["n"]) - bc.median(times["one"])) / (new - 1)
  return {"batch": batch, "prompt": prompt, "new": new, "ms_per_step": round(per_step * 1e3, 3),
          "tokens_per_s": round(batch / per_step, 1)}


def paired_steps(cfg, name, mode, batch, seq_len, steps) -> dict:
  """The recurrent model's train step (`mode`) and its backbone's, and their ratio."""
  row = {"baseline_train": train_mfu(cfg.replace(recurrence=None), batch, seq_len,
                                     "parallel", steps),
         f"{name}_train": train_mfu(cfg, batch, seq_len, mode, steps)}
  row[f"{name}_step_ratio"] = round(row[f"{name}_train"]["ms_per_step"] /
                                    row["baseline_train"]["ms_per_step"], 3)
  return row


def ttft_ms(cfg, prompt, repeats, prompt_cf=1):
  """Median ms of generate(max_new_tokens=1) at batch 1 (the prompt non-recurrent)."""
  import jax
  import numpy as np

  import t2mlr_jax
  params = t2mlr_jax.init_params(cfg, jax.random.PRNGKey(0))
  tokens = np.random.RandomState(0).randint(0, cfg.vocab_size, (1, prompt)).astype(np.int32)
  call = generate_call(cfg, 1, prompt_cf)
  run = lambda: call(params, tokens)
  jax.block_until_ready(run())
  return round(bc.median(bc.alternate({"g": run}, repeats)["g"]) * 1e3, 2)


def attention_batch(cfg, batch, seq_len):
  """attention_check's batch: random tokens, two packed documents a row."""
  import numpy as np
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, cfg.vocab_size, (batch, seq_len)).astype(np.int32)
  seg = np.zeros((batch, seq_len), np.int32)
  seg[:, seq_len // 3:] = 1                                # two packed documents per row
  return tokens, seg


def attention_loss(cfg, seg):
  """attention_check's jitted loss and gradient of the plain model, (params, tokens)."""
  import jax

  from t2mlr_jax.model.api import loss
  return jax.jit(jax.value_and_grad(lambda p, tokens: loss(p, cfg, tokens, mode="parallel",
                                                           segment_ids=seg)))


def attention_check(cfg, batch, seq_len, repeats=5):
  """The backend's fused attention kernel (`attention="auto"`: cudnn on GPU, splash on
  TPU; splash in interpret mode on a CPU) against `xla` on one packed batch: max logit
  and gradient differences (bf16 here, so ~1e-2 is expected) and ms per loss+gradient."""
  import jax
  import numpy as np

  import t2mlr_jax
  from t2mlr_jax.model import kernels
  impl = kernels.resolve("auto", cfg.dtype, head_dim=cfg.head_dim)
  if impl == "xla":
    impl = "splash"                  # CPU / fp32: the kernel in Pallas interpret mode
  cfg = cfg.replace(recurrence=None)
  params = t2mlr_jax.init_params(cfg, jax.random.PRNGKey(0))
  tokens, seg = attention_batch(cfg, batch, seq_len)
  out = {"impl": impl}
  fns, results = {}, {}
  for name in ("xla", impl):
    c = cfg.replace(attention=name)
    f = functools.partial(attention_loss(c, seg), tokens=tokens)
    results[name] = jax.block_until_ready(f(params))
    logits = t2mlr_jax.forward(params, c, tokens, mode="parallel", segment_ids=seg)
    results[name] = (results[name], np.asarray(logits, np.float32))
    fns[name] = lambda f=f: f(params)
  (_, g_ref), l_ref = results["xla"]
  (_, g), l = results[impl]
  out["max_logit_diff"] = float(np.max(np.abs(l - l_ref)))
  out["max_grad_diff"] = float(max(np.max(np.abs(np.asarray(a, np.float32) -
                                                 np.asarray(b, np.float32)))
                                   for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g_ref))))
  times = bc.alternate(fns, repeats)
  out["ms_per_step"] = {k: round(bc.median(v) * 1e3, 2) for k, v in times.items()}
  return out


def shape_config(shape):
  """The bf16 model of a shape with T2MLR on its BLOCKS."""
  from t2mlr_jax import ModelConfig, T2MLRConfig
  l_start, l_end = BLOCKS[shape]
  return ModelConfig.preset(shape, dtype="bfloat16",
                            recurrence=T2MLRConfig(l_start=l_start, l_end=l_end))


def compile_only(topology, shapes, batch, seq_len) -> dict:
  """Compile the script's functions for `topology`'s devices without running them (see
  the module's docstring): {shape: {function: its compiled memory, fused calls, fit}}."""
  import jax
  import jax.numpy as jnp
  from jax.sharding import NamedSharding, PartitionSpec

  import t2mlr_jax
  from t2mlr_jax import sharding
  from t2mlr_jax.accel import aot, topologies
  from t2mlr_jax.eval import runner
  from t2mlr_jax.model import kernels
  from t2mlr_jax.train.step import abstract_state, state_shardings
  topo = topologies.resolve(topology)
  devices = topologies.devices(topo)
  mesh = sharding.make_mesh({"data": -1}, devices)
  fused = {key: pattern for key, (_, pattern) in aot.KERNEL_CALLS[topo.platform].items()}
  place = lambda tree, spec: jax.tree.map(
      lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), tree, spec)
  whole = NamedSharding(mesh, PartitionSpec())
  out = {"topology": topology, "device": devices[0].device_kind, "devices": len(devices),
         "memory_budget_bytes": topo.hbm_bytes, "shapes": {}}

  def build(name, lowered, t0):
    compiled = lowered.compile()
    m = compiled.memory_analysis()
    total = (m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
             + m.temp_size_in_bytes)
    text = compiled.as_text()
    row = {"compile_s": round(time.perf_counter() - t0, 1), "total_bytes": int(total),
           "fits": total <= topo.hbm_bytes,
           **{key: len(re.findall(pattern, text)) for key, pattern in fused.items()}}
    print(f"  {name}: {total / 2 ** 30:.2f} of {topo.hbm_bytes / 2 ** 30:.2f} GiB, "
          f"{row}", flush=True)
    return row

  for shape in shapes:
    cfg, rows = shape_config(shape), {}
    print(f"{shape} for {topology} ({devices[0].device_kind}):", flush=True)
    for name, c, mode in (("baseline_train", cfg.replace(recurrence=None), "parallel"),
                          ("t2mlr_train", cfg, "jacobi")):
      t0 = time.perf_counter()
      step, tx = train_step_for(c, mode, mesh)
      state = place(abstract_state(c, tx), state_shardings(c, tx, mesh))
      data = {k: jax.ShapeDtypeStruct((batch, seq_len), jnp.int32,
                                      sharding=sharding.batch_sharding(mesh))
              for k in ("input_ids", "target_ids", "control_flow")}
      rows[name] = build(name, step.lower(state, data), t0)
    params = jax.eval_shape(lambda: t2mlr_jax.init_params(cfg, jax.random.PRNGKey(0)))
    params = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=whole),
                          params)
    # attention_check's loss with the devices' own kernel (cudnn on an sm80+ GPU)
    plain = cfg.replace(recurrence=None)
    impl = kernels.resolve("auto", cfg.dtype, kernels.target_of(devices), cfg.head_dim)
    _, seg = attention_batch(cfg, batch, seq_len)
    t0 = time.perf_counter()
    plain_params = jax.eval_shape(lambda: t2mlr_jax.init_params(plain, jax.random.PRNGKey(0)))
    plain_params = jax.tree.map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=whole), plain_params)
    tokens = jax.ShapeDtypeStruct((batch, seq_len), jnp.int32, sharding=whole)
    with runner.mesh_context(mesh):
      lowered = attention_loss(plain.replace(attention=impl), seg).trace(
          plain_params, tokens).lower()
    rows[f"attention_{impl}"] = build(f"attention_{impl}", lowered, t0)
    for name, rows_b, prompt, new, cf in (("decode_b64", 64, 128, 128, 2),
                                          ("ttft_1024", 1, 1024, 1, 1)):
      t0 = time.perf_counter()
      tokens = jax.ShapeDtypeStruct((rows_b, prompt), jnp.int32, sharding=whole)
      with runner.mesh_context(mesh):        # the kernels of these devices (kernels.target)
        lowered = jax.jit(generate_call(cfg, new, cf)).trace(params, tokens).lower()
      rows[name] = build(name, lowered, t0)
    out["shapes"][shape] = rows
  out["fits"] = all(r["fits"] for rows in out["shapes"].values() for r in rows.values())
  return out


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--shapes", default="smollm2-135m,smollm2-360m")
  p.add_argument("--steps", type=int, default=10)
  p.add_argument("--batch", type=int, default=8)
  p.add_argument("--seq_len", type=int, default=2048)
  p.add_argument("--allow-cpu", dest="allow_cpu", action="store_true")
  p.add_argument("--out", default="bench_accel.json")
  p.add_argument("--compile_only", default=None, metavar="TOPOLOGY",
                 help="compile for these devices (e.g. h200-1, v5e-1) without running")
  args = p.parse_args()
  if args.compile_only:
    # compile-only devices: this host's CPU stays the default backend, nothing runs
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    results = compile_only(args.compile_only, args.shapes.split(","), args.batch,
                           args.seq_len)
    print("wrote", bc.write_json(args.out, results))
    sys.exit(0 if results["fits"] else 1)

  import jax

  from t2mlr_jax import LRTConfig, ModelConfig, T2MLRConfig
  on_cpu = jax.devices()[0].platform == "cpu"
  if on_cpu and not args.allow_cpu:
    p.error("no accelerator found (pass --allow-cpu to check the script at toy size)")
  results = {"device": str(jax.devices()[0].device_kind), "device_count": jax.device_count(),
             "shapes": {}}
  for shape in args.shapes.split(","):
    cfg = shape_config(shape)
    batch, seq_len = args.batch, args.seq_len
    if on_cpu:      # toy size: only checks that the script runs
      cfg = cfg.replace(n_layers=4, d_model=64, n_heads=4, n_kv_heads=2, head_dim=16,
                        d_ff=128, vocab_size=512, dtype="float32",
                        recurrence=T2MLRConfig(l_start=1, l_end=2))
      batch, seq_len = 2, 64
    row = paired_steps(cfg, "t2mlr", "jacobi", batch, seq_len, args.steps)
    for prompt in (128, 1024):
      row[f"ttft_{prompt}_ms"] = {"t2mlr": ttft_ms(cfg, prompt, 5),
                                  "plain": ttft_ms(cfg.replace(recurrence=None), prompt, 5)}
    row["attention_kernel"] = attention_check(cfg, batch, max(seq_len, 128) if on_cpu
                                              else seq_len)
    for b in (1, 64):
      row[f"decode_b{b}"] = decode_tps(cfg, b, 128, 128, 3)
      row[f"decode_b{b}_base"] = decode_tps(cfg.replace(recurrence=None), b, 128, 128, 3)
    results["shapes"][shape] = row
    print(shape, row, flush=True)
  # LRT (layerwise, interleaved S = 2) on nanochat's d12 backbone against that backbone
  lrt = ModelConfig.preset("nanochat-d12", dtype="bfloat16", recurrence=LRTConfig(),
                           schedule_options=dict(passes=2))
  batch, seq_len = args.batch, args.seq_len
  if on_cpu:
    lrt = lrt.replace(n_layers=4, d_model=128, n_heads=2, n_kv_heads=2, head_dim=64,
                      d_ff=256, vocab_size=512, dtype="float32", window_pattern=None)
    batch, seq_len = 2, 64
  row = paired_steps(lrt, "lrt", "interleaved", batch, seq_len, args.steps)
  results["lrt_nanochat_d12"] = row
  print("lrt nanochat-d12", row, flush=True)
  out = os.environ.get("OUT")     # the device tool's output folder, when there is one
  path = bc.write_json(args.out, results)
  if out:
    import shutil
    shutil.copy(path, os.path.join(out, args.out))
  print("wrote", path)


if __name__ == "__main__":
  main()
