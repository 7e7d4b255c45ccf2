"""Ahead-of-time compiles of a config's steps for a TPU slice or a GPU node (`python -m
t2mlr_jax.compile`): the train step exactly as the trainer builds it, the exact-mode eval
step and generate's decode step, over compile-only devices, with per-device memory,
collectives, custom kernels (Mosaic on TPU; cuDNN fused attention and GEMMs on GPU) and
the cost model's FLOP floor.

Everything is built from shapes (`jax.eval_shape`): a model initialised from a checkpoint
(`model.init_from`) compiles from the checkpoint's config alone, or from a preset name
(`--config.model.init_from=smollm2-1.7b`) when no copy of the model is at hand.
"""

from __future__ import annotations

import collections
import os
import re
import threading
import time
from typing import Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from t2mlr_jax import flops, sharding
from t2mlr_jax.accel import topologies
from t2mlr_jax.config import PRESETS
from t2mlr_jax.convert.pretrained import pretrained_config
from t2mlr_jax.eval import bpb, runner
from t2mlr_jax.model import decode
from t2mlr_jax.registry import family_of
from t2mlr_jax.train import config as config_lib, rl as rl_lib, tasks
from t2mlr_jax.train.optimizer import make_optimizer
from t2mlr_jax.train.step import abstract_state, check_batch, make_train_step, state_shardings

STEPS = ("train", "eval", "decode")
HEARTBEAT_S = 30.0          # a line this often while the compiler runs
COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all",
               "collective-permute")
# Custom kernels counted in a compiled program, by the platform it is compiled for: key ->
# (what the report calls them, the pattern of one call in the optimized HLO text). A call
# inside a loop body (the layer scan) counts once.
KERNEL_CALLS = {
    "tpu": {"mosaic": ("Mosaic kernels", r'custom_call_target="tpu_custom_call"')},
    "gpu": {"fused_attention": ("cuDNN fused attention", r'custom_call_target="__cudnn\$fmha'),
            # cuBLAS calls, and the GEMM fusions XLA emits with Triton or cuDNN
            "gemm": ("GEMMs", r'custom_call_target="__cublas\$(?:lt\$matmul|gemm)"|'
                              r'calls=%\S+, [^\n]*"kind":"__(?:triton_gemm|'
                              r'triton_nested_gemm_fusion|cudnn\$fusion)"')},
}
GiB = 2 ** 30


class DoesNotFit(Exception):
  """The compiler ran out of device memory (its message shortened to the numbers)."""


def _fail(field, value, allowed):
  raise ValueError(f"{field}={value!r} is invalid: allowed {allowed}")


def shape_config(config):
  """The config with `model.init_from` replaced by the model's shape: a directory's
  config.json / model.json (no weights are read) or a preset name's shape."""
  src = config.model.get("init_from")
  if not src:
    return config
  config = config.copy_and_resolve_references()
  if src in PRESETS:
    shape = PRESETS[src]
  elif not os.path.isdir(src):
    raise ValueError(f"config field model.init_from={src!r} is invalid: allowed a Hugging "
                     "Face directory or parameter export (its config is read, not its "
                     f"weights) or, for the shape alone, a preset name: {sorted(PRESETS)}")
  else:
    base = pretrained_config(src)
    shape = {k: getattr(base, k) for k in (
        "vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "head_dim",
        "rope_theta", "rms_norm_eps", "tie_embeddings", "qkv_bias")}
  with config.unlocked():
    for key, value in shape.items():
      if key == "max_seq_len":
        continue                   # the config's own (training length), as init_from keeps
      config.model[key] = value
    config.model.init_from = None
    config.model.init_required = False
  return config


def batch_keys(config) -> tuple[str, ...]:
  """The arrays a training batch of this config's task holds ([B, T] int32 each)."""
  d = config.data
  keys = ["input_ids", "target_ids", "control_flow"]
  if d.task == "lm":
    keys += ["positions"] + (["segment_ids"] if d.get("mask_documents") else [])
  elif d.task == "sft" and d.get("packed"):
    keys += ["positions", "segment_ids"]
  return tuple(keys)


def _abstract(tree, shardings):
  return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                      tree, shardings)


def _batch(keys, B, T, mesh):
  sh = sharding.batch_sharding(mesh)
  return {k: jax.ShapeDtypeStruct((B, T), jnp.int32, sharding=sh) for k in keys}


def _hlo_counts(text: str, platform: str = "tpu") -> tuple[dict, dict]:
  """(count of each collective op, count of each of the platform's KERNEL_CALLS) in
  optimized HLO text."""
  counts = collections.Counter()
  for op in COLLECTIVES:
    # an op appears as `op(` or, split in two, as `op-start(` (count the start only)
    counts[op] = len(re.findall(rf"\b{op}(?:-start)?\(", text))
  kernels = {key: len(re.findall(pattern, text))
             for key, (_, pattern) in KERNEL_CALLS.get(platform, {}).items()}
  return {k: v for k, v in counts.items() if v}, kernels


_OOM = (re.compile(r"Used ([\d.]+[KMGT]?) of ([\d.]+[KMGT]?) (hbm|vmem)"),
        re.compile(r"required for ([\w ]+?) \(([\d.]+[KMGT]?)\) exceeds available (\w+) "
                   r"\(([\d.]+[KMGT]?)\)"))


def _oom_summary(message: str) -> Optional[str]:
  """The compiler's out-of-memory error shortened to its numbers, None if it is not one."""
  if "RESOURCE_EXHAUSTED" not in message and "Ran out of memory" not in message:
    return None
  m = _OOM[0].search(message)
  if m:
    used, cap, space = m.groups()
    return f"the compiler needs {used} of {cap} {space} per device"
  m = _OOM[1].search(message)
  if m:
    what, used, space, cap = m.groups()
    return f"the compiler needs {used} of {cap} {space.lower()} per device (for {what})"
  first = next((ln for ln in message.splitlines() if "RESOURCE_EXHAUSTED" in ln), message)
  return " ".join(first.split())[:300]


def _compile(jitted, args, topo, log, name) -> tuple:
  """(compiled, seconds) of a jitted function on abstract args, or DoesNotFit."""
  t0 = time.perf_counter()
  log(f"lowering the {name} step for {topo.name} ({topo.num_devices} devices)...")
  lowered = jitted.lower(*args)
  log(f"compiling it with XLA's {topo.platform.upper()} compiler (seconds for a small "
      f"model; minutes for a 100M+ model on many devices; lowered in "
      f"{time.perf_counter() - t0:.0f} s)...")
  done = threading.Event()

  def heartbeat():                    # a compile of several minutes is never silent
    while not done.wait(HEARTBEAT_S):
      log(f"  still compiling the {name} step ({time.perf_counter() - t0:.0f} s so far)")

  threading.Thread(target=heartbeat, daemon=True).start()
  try:
    compiled = lowered.compile()
  except Exception as e:              # XlaRuntimeError and friends
    summary = _oom_summary(str(e))
    if summary is None:
      raise
    raise DoesNotFit(summary) from None
  finally:
    done.set()
  seconds = time.perf_counter() - t0
  log(f"compiled the {name} step in {seconds:.0f} s")
  return compiled, seconds


def _memory(compiled) -> dict:
  m = compiled.memory_analysis()
  get = lambda name: int(getattr(m, name, 0) or 0)
  out = {"argument_bytes": get("argument_size_in_bytes"),
         "output_bytes": get("output_size_in_bytes"),
         "alias_bytes": get("alias_size_in_bytes"),
         "temp_bytes": get("temp_size_in_bytes"),
         "code_bytes": get("generated_code_size_in_bytes")}
  out["total_bytes"] = (out["argument_bytes"] + out["output_bytes"] - out["alias_bytes"]
                        + out["temp_bytes"] + out["code_bytes"])
  return out


def _step_entry(name, compiled, seconds, topo, step_flops, extra, keep_text=False) -> dict:
  mem = _memory(compiled)
  text = compiled.as_text()
  collectives, kernels = _hlo_counts(text, topo.platform)
  per_device = step_flops / topo.num_devices if step_flops else None
  # arrays the device holds beside this program's own (RL: the reference model)
  held = mem["total_bytes"] + extra.get("resident_bytes", 0)
  entry = {"step": name, **extra, "compile_seconds": round(seconds, 1), **mem,
           "hbm_bytes": topo.hbm_bytes, "fits": held <= topo.hbm_bytes,
           "headroom_bytes": topo.hbm_bytes - held,
           "collectives": collectives, "kernels": kernels,
           "mosaic_kernels": kernels.get("mosaic", 0),
           "model_flops_per_device": per_device,
           "step_seconds_floor": per_device / topo.peak_flops if per_device else None}
  if keep_text:
    entry["hlo_text"] = text
  return entry


def _failed_entry(name, reason, topo, extra) -> dict:
  return {"step": name, **extra, "fits": False, "hbm_bytes": topo.hbm_bytes,
          "error": reason}


def compile_config(config, topology: str, *, steps: Sequence[str] = ("train",),
                   num_slices: int = 1, log: Callable[[str], None] = lambda s: None,
                   keep_text: bool = False) -> dict:
  """Compile `steps` of an experiment config for a topology (a TPU slice or a GPU node,
  `topologies.resolve`); the report as a dict (see `format_report`; keep_text: each
  step's optimized HLO too, as `hlo_text`). Raises ValueError for a bad config, topology
  or step name, topologies.TopologyUnavailable without libtpu / the CUDA plugin."""
  bad = [s for s in steps if s not in STEPS]
  if bad or not steps:
    _fail("--steps", ",".join(steps), f"a comma-separated subset of {STEPS}")
  if isinstance(num_slices, bool) or not isinstance(num_slices, int) or num_slices < 1:
    _fail("--num_slices", num_slices, "an integer >= 1")
  topo = topologies.resolve(topology)
  config = shape_config(config)
  devices = topologies.devices(topo, num_slices)
  cfg = config_lib.validate(config, devices)
  t = config.train
  mode = config_lib.train_mode(config, cfg)
  mesh = sharding.make_mesh(dict(config.mesh), devices, getattr(cfg, "d_model", None))
  k = t.get("grad_accum_steps", 1)
  check_batch(t.batch_size, k, mesh)
  family = family_of(cfg)
  cfg = family.for_devices(cfg, devices)
  tx, schedule = make_optimizer(config_lib.optimizer_config(config),
                                t.num_steps * rl_lib.updates_per_step(config), cfg)
  state = abstract_state(cfg, tx)
  shardings = state_shardings(cfg, tx, mesh)
  replicated, total = sharding.replicated_bytes(state, shardings)
  per_device_state = sharding.per_device_bytes(state, shardings)
  report = {
      "config": config.get("name", ""), "topology": topo.name,
      "jax_topology": topo.jax_topology, "num_slices": num_slices,
      "devices": topo.num_devices * num_slices, "device_kind": devices[0].device_kind,
      "platform": topo.platform, "memory_text": topo.memory_text,
      "hbm_bytes_per_device": topo.hbm_bytes, "peak_flops_per_device": topo.peak_flops,
      "peak_text": topo.peak_text,
      "mesh": dict(mesh.shape), "attention": getattr(cfg, "attention", None),
      "mode": mode, "batch_size": t.batch_size, "seq_len": t.seq_len,
      "grad_accum_steps": k, "dtype": getattr(cfg, "dtype", "float32"),
      "remat": getattr(cfg, "remat", None), "num_params": cfg.num_params(),
      "state_bytes_total": total, "state_bytes_per_device": per_device_state,
      "state_replicated_bytes": replicated,
      "state_sharded_bytes_per_device": per_device_state - replicated,
      "replicated_arrays": _replicated_params(state.params, shardings.params),
      "steps": []}
  jax_steps = []
  params_abs = _abstract(state.params, shardings.params)
  if "train" in steps and rl_lib.rl_config(config) is not None:
    # an RL config's train step is GRPO's update, and its sampler beside it
    rl_lib.check(config, cfg, tasks.get_task(config), needs_tokenizer=False)
    jax_steps += rl_lib.aot_steps(config, cfg, tx, schedule, mesh, _abstract(state, shardings),
                                  params_abs)
  elif "train" in steps:
    step = make_train_step(cfg, tx, schedule, mode, mesh, t.get("loss_chunk"), k, t.num_steps,
                           t.get("grad_accum_average", "tokens"))
    args = (_abstract(state, shardings), _batch(batch_keys(config), t.batch_size, t.seq_len,
                                                mesh))
    step_flops = family.train_step_flops(cfg, t.batch_size, t.seq_len, mode)
    jax_steps.append(("train", step, args, step_flops, {"mode": mode}))
  if "eval" in steps:
    jax_steps.append(_eval_step(config, cfg, mesh, params_abs))
  if "decode" in steps:
    if not family.decodes:
      _fail("--steps", "decode", f"train or eval for a {family.name} model (it has no "
            "decode step)")
    jax_steps.append(_decode_step(config, cfg, mesh, params_abs))
  for name, fn, args, step_flops, extra in jax_steps:
    try:
      compiled, seconds = _compile(fn, args, topo, log, name)
      report["steps"].append(_step_entry(name, compiled, seconds, topo, step_flops, extra,
                                         keep_text))
    except DoesNotFit as e:
      report["steps"].append(_failed_entry(name, str(e), topo, extra))
  report["fits"] = all(s["fits"] for s in report["steps"])
  return report


def _replicated_params(params, shardings, limit: int = 8) -> list:
  """The largest parameters stored whole on every device: [(path, shape, bytes)]."""
  rows = []
  flat = jax.tree_util.tree_flatten_with_path(params)[0]
  for (path, leaf), sh in zip(flat, jax.tree.leaves(shardings)):
    if sh.mesh.size > 1 and all(ax is None for ax in tuple(sh.spec)):
      nbytes = int(np.prod(leaf.shape)) * np.dtype(leaf.dtype).itemsize
      rows.append([sharding._path_str(path), list(leaf.shape), nbytes])
  rows.sort(key=lambda r: -r[2])
  return rows[:limit]


def _eval_rows(config, mesh) -> int:
  """The eval batch as the trainer runs it: data.eval_batch_size padded up to a multiple
  of the mesh's batch axes (sharding.shard_eval_batch)."""
  rows = int(config.data.get("eval_batch_size", 8) or 8)
  n = sharding.batch_divisor(mesh)
  return -(-rows // n) * n


def _eval_step(config, cfg, mesh, params_abs):
  """The exact-mode eval step of the config's task (bits per byte for `lm`)."""
  B, T = _eval_rows(config, mesh), config.train.seq_len
  batch = _batch(batch_keys(config), B, T, mesh)
  vocab = getattr(cfg, "vocab_size", 0)
  ctx = runner.mesh_context(mesh)
  if config.data.task == "lm":
    token_bytes = jax.ShapeDtypeStruct((vocab,), jnp.int32,
                                       sharding=jax.sharding.NamedSharding(
                                           mesh, jax.sharding.PartitionSpec()))
    fn = _in_context(bpb._bpb_batch, ctx, cfg=cfg, mode="exact")
    args = (params_abs, batch, token_bytes)
  else:
    fn = _in_context(runner._eval_batch, ctx, cfg=cfg, mode="exact")
    args = (params_abs, batch)
  step_flops = family_of(cfg).forward_flops(cfg, B, T, "exact")
  return ("eval", fn, args, step_flops, {"mode": "exact", "batch_size": B})


class _in_context:
  """A jitted function whose `lower` traces under a context (the mesh's abstract form)."""

  def __init__(self, jitted, ctx, **static):
    self.jitted, self.ctx, self.static = jitted, ctx, static

  def lower(self, *args):
    with self.ctx:
      return self.jitted.lower(*args, **self.static)


def _decode_step(config, cfg, mesh, params_abs):
  """generate's per-token decode step: a batch of data.eval_batch_size rows (padded to the
  batch axes) over a cache of model.max_seq_len slots, caches split over the batch axes."""
  B, S = _eval_rows(config, mesh), cfg.max_seq_len
  P = min(16, S - 1)

  def prefill_shapes(params, prompt):
    lengths = jnp.full((prompt.shape[0],), P, jnp.int32)
    cf = jnp.full(prompt.shape, 2, jnp.int32)
    return decode._prefill_left_padded(params, cfg, prompt, lengths, S, cf, True, "exact",
                                       None)[1]

  with runner.mesh_context(mesh):      # the kernels of the mesh's devices (kernels.target)
    state = jax.eval_shape(prefill_shapes, params_abs,
                           jax.ShapeDtypeStruct((B, P), jnp.int32))
  n = sharding.batch_divisor(mesh)
  P_ = jax.sharding.PartitionSpec

  def place(a):
    if a.ndim == 0 or a.shape[0] % n:
      spec = P_()
    else:
      spec = P_(sharding.batch_axes(mesh), *([None] * (a.ndim - 1)))
    return jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=jax.sharding.NamedSharding(mesh,
                                                                                      spec))

  state_abs = jax.tree.map(place, state)
  token = jax.ShapeDtypeStruct((B,), jnp.int32, sharding=sharding.batch_sharding(mesh, 1))
  step = jax.jit(lambda params, st, tok: decode.decode_step(params, cfg, st, tok),
                 donate_argnums=1)
  fn = _in_context(step, runner.mesh_context(mesh))
  return ("decode", fn, (params_abs, state_abs, token),
          B * flops.decode_flops_per_token(cfg, S), {"batch_size": B, "cache_len": S})


def _gib(n) -> str:
  """Bytes in GiB (MiB / KiB below one), as the report prints them."""
  if n is None:
    return "-"
  for unit, size in (("GiB", GiB), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
    if abs(n) >= size or unit == "KiB":
      return f"{n / size:.2f} {unit}"


def format_report(report: dict) -> str:
  """The report as a few lines of text (per device: a chip, a core on v2 / v3, a GPU)."""
  r = report
  lines = [
      f"{r['config']} on {r['topology']} ({r['jax_topology']}, {r['devices']} x "
      f"{r['device_kind']}, {r['memory_text']}), mesh "
      f"{r['mesh']}, attention {r['attention']}, {r['mode']}, batch {r['batch_size']} x "
      f"{r['seq_len']}" + (f" in {r['grad_accum_steps']} microbatches"
                           if r["grad_accum_steps"] > 1 else "") + f", {r['dtype']}",
      f"  state per device: {_gib(r['state_bytes_per_device'])} "
      f"({_gib(r['state_sharded_bytes_per_device'])} sharded + "
      f"{_gib(r['state_replicated_bytes'])} replicated on every device; the whole state "
      f"{_gib(r['state_bytes_total'])})"]
  if r["replicated_arrays"]:
    top = ", ".join(f"{p} {tuple(s)}" for p, s, _ in r["replicated_arrays"][:4])
    lines.append(f"  replicated parameters (largest): {top}")
  for s in r["steps"]:
    if "error" in s:
      lines.append(f"  {s['step']}: DOES NOT FIT: {s['error']}")
      continue
    verdict = "fits" if s["fits"] else "DOES NOT FIT"
    coll = ", ".join(f"{k} {v}" for k, v in s["collectives"].items()) or "none"
    labels = KERNEL_CALLS.get(r["platform"], {})
    kernels = "; ".join(f"{labels[k][0]} {v}" for k, v in s["kernels"].items())
    floor = ("" if s["step_seconds_floor"] is None else
             f"; model FLOPs {s['model_flops_per_device']:.3g} per device, >= "
             f"{s['step_seconds_floor'] * 1e3:.3g} ms at {r['peak_text']} (a floor)")
    # RL's programs: their rows, and what the device holds beside them (the reference)
    rows = (f" ({s['rows']} rows of {s['prompt_width']} + {s['completion_tokens']} tokens)"
            if "rows" in s else "")
    beside = (f" + {_gib(s['resident_bytes'])} held beside it"
              if s.get("resident_bytes") else "")
    lines.append(
        f"  {s['step']}{rows}: {verdict}: {_gib(s['total_bytes'])}{beside} of "
        f"{_gib(s['hbm_bytes'])} per device (arguments {_gib(s['argument_bytes'])}, temporaries "
        f"{_gib(s['temp_bytes'])}, outputs {_gib(s['output_bytes'])}, aliased "
        f"{_gib(s['alias_bytes'])}), headroom {_gib(s['headroom_bytes'])}; compiled in "
        f"{s['compile_seconds']:.0f} s; collectives: {coll}; {kernels}{floor}")
  lines.append("fits" if r["fits"] else "does not fit")
  return "\n".join(lines)
