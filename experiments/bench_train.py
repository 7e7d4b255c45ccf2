"""Training-step cost: Jacobi(D_f, D_b) vs the plain model, adaptive Jacobi, memory,
compile time (docs/performance.md#cost-model); LRT's schedules vs the plain backbone.

    python experiments/bench_train.py            # writes experiments/results/bench_train.json
    python experiments/bench_train.py --parts step,memory --shape s5
    python experiments/bench_train.py --parts lrt_step,lrt_memory,lrt_compile --out bench_train_lrt.json

Parts:
  step     ms/step of the baseline (recurrence off), Jacobi with fixed sweeps and
           Jacobi with jacobi_tol, alternating, medians; sweeps run and the loss
           difference between fixed and adaptive sweeps.
  step_raw the same with the raw cache (`residual=False`, R_{t+1} = o_t), whose
           recurrence contracts on random weights, so jacobi_tol can stop early; the
           default residual cache R <- norm(o + R) is a near-integrator and does not.
  step_trained
           the same on a trained S5 word-problem model (--workdir) at its own training
           shape (batch, length from its config), on word problems of that length.
  memory   temporary bytes of the compiled step (XLA memory_analysis) as D_f grows
           (D_b fixed) and as D_b grows, for each remat policy.
  compile  compile seconds of the 30-layer step: scanned segments vs unrolled layers.
  lrt_step LRT (layerwise, the release's init) at --lrt_shape: ms/step of interleaved
           S = 2, 3, chunked S = 2 and multi-refine K = 3 against the plain backbone's
           step (recurrence=None), alternating, medians.
  lrt_memory
           temporary bytes of the compiled LRT steps as S (interleaved) and K
           (multi-refine) grow, and of the plain step.
  lrt_compile
           compile seconds of the plain, interleaved S = 2, 3, 8 and multi-refine K = 3
           steps.
  hf_step  the plain step (loss and gradient, recurrence off) against transformers'
           PyTorch LlamaForCausalLM with the same weights on the same batch (its loss
           checked equal), alternated, medians: what a user of the official PyTorch
           release (HF Llama underneath) pays for the same step on this machine.
  loss_memory
           temporary bytes of the compiled loss-and-gradient of a 2-layer model at
           SmolLM2's width and vocabulary (V = 49152) and T = 4096, batch 1, with the
           full cross-entropy ([B, T, V] fp32 logits) and with the chunked one
           (train.loss_chunk), plain and T2MLR (Jacobi 4/2).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as bc  # noqa: E402

SHAPES = {
    # name: (preset or ModelConfig kwargs, l_start, l_end, batch, seq_len)
    "smollm2-135m": ("smollm2-135m", 13, 18, 1, 256),
    "s5": (dict(vocab_size=188, d_model=64, n_layers=4, n_heads=4, d_ff=256, max_seq_len=512,
                rope_theta=None), 1, 2, 32, 168),
}


LRT_SHAPES = {
    # name: (ModelConfig kwargs, batch, seq_len)
    # nanochat's backbone at depth 6 (d_model 384, 3 heads of 128, vocab 32768)
    "nanochat-d6": (dict(n_layers=6, d_model=384, n_heads=3, n_kv_heads=3, d_ff=1536,
                         max_seq_len=2048), 4, 256),
    # the S5 jobs' Llama backbone (configs/s5_retrieval_lrt.py)
    "s5": (SHAPES["s5"][0], 32, 168),
}


def build_lrt(shape: str, **rec_kw):
  from t2mlr_jax import LRTConfig, ModelConfig
  from t2mlr_jax.config import PRESETS
  kw, B, T = LRT_SHAPES[shape]
  base = {**PRESETS["nanochat-d12"], "value_embeds": None} if shape.startswith("nanochat") else {}
  rec = LRTConfig(**{"gate_channels": min(32, kw["d_model"]), **rec_kw})
  return ModelConfig(**{**base, **kw}, recurrence=rec), B, T


def lrt_loss_and_grad(cfg, mode, **opts):
  """jit(value_and_grad) of t2mlr_jax.loss under `mode` on (params, tokens)."""
  import jax

  from t2mlr_jax import loss
  return jax.jit(jax.value_and_grad(lambda p, t: loss(p, cfg, t, mode=mode, **opts)))


LRT_RUNS = {   # name: (mode, options); "baseline" is the backbone with recurrence=None
    "baseline": ("parallel", {}),
    "interleaved_S2": ("interleaved", {"passes": 2}),
    "interleaved_S3": ("interleaved", {"passes": 3}),
    "chunked_S2": ("chunked", {"passes": 2}),
    "multi_refine_K3": ("multi_refine", {"refine_passes": 3}),
}


def part_lrt_step(shape, repeats):
  import jax
  import numpy as np

  import t2mlr_jax
  cfg, B, T = build_lrt(shape)
  params = t2mlr_jax.init_params(cfg, jax.random.PRNGKey(0))
  base_cfg = cfg.replace(recurrence=None)
  base_params = t2mlr_jax.init_params(base_cfg, jax.random.PRNGKey(0))
  tokens = np.random.RandomState(0).randint(0, cfg.vocab_size, (B, T)).astype(np.int32)
  fns = {}
  for name, (mode, opts) in LRT_RUNS.items():
    c, p = (base_cfg, base_params) if name == "baseline" else (cfg, params)
    fn = lrt_loss_and_grad(c, mode, **opts)
    jax.block_until_ready(fn(p, tokens))                     # compile + first run
    fns[name] = lambda fn=fn, p=p: fn(p, tokens)
  times = bc.alternate(fns, repeats)
  med = {k: bc.median(v) for k, v in times.items()}
  return {"shape": shape, "batch": B, "seq_len": T, "params": cfg.num_params(),
          "baseline_params": base_cfg.num_params(),
          "ms_per_step": {k: round(v * 1e3, 1) for k, v in med.items()},
          "ratio_to_baseline": {k: round(v / med["baseline"], 3) for k, v in med.items()},
          "raw_seconds": {k: [round(x, 4) for x in v] for k, v in times.items()}}


def _lrt_compiled(cfg, B, T, mode, **opts):
  import jax
  import numpy as np

  import t2mlr_jax
  params = jax.eval_shape(lambda: t2mlr_jax.init_params(cfg, jax.random.PRNGKey(0)))
  tokens = jax.ShapeDtypeStruct((B, T), np.int32)
  start = time.perf_counter()
  compiled = lrt_loss_and_grad(cfg, mode, **opts).lower(params, tokens).compile()
  return compiled, time.perf_counter() - start


def part_lrt_memory(shape):
  cfg, B, T = build_lrt(shape)
  mb = lambda c, mode, **o: round(
      _lrt_compiled(c, B, T, mode, **o)[0].memory_analysis().temp_size_in_bytes / 2**20, 1)
  return {"shape": shape, "batch": B, "seq_len": T, "unit": "MiB",
          "baseline": mb(cfg.replace(recurrence=None), "parallel"),
          "interleaved_by_S": {S: mb(cfg, "interleaved", passes=S) for S in (1, 2, 3, 4, 8)},
          "chunked_by_S": {S: mb(cfg, "chunked", passes=S) for S in (2, 4)},
          "multi_refine_by_K": {K: mb(cfg, "multi_refine", refine_passes=K) for K in (1, 2, 3)}}


def part_lrt_compile(shape):
  cfg, B, T = build_lrt(shape)
  sec = lambda c, mode, **o: round(_lrt_compiled(c, B, T, mode, **o)[1], 2)
  return {"shape": shape, "n_layers": cfg.n_layers, "unit": "s",
          "baseline": sec(cfg.replace(recurrence=None), "parallel"),
          "interleaved_by_S": {S: sec(cfg, "interleaved", passes=S) for S in (2, 3, 8)},
          "multi_refine_K3": sec(cfg, "multi_refine", refine_passes=3)}


def build(shape: str, **kw):
  """(cfg, B, T) of a T2MLR shape; `kw`: T2MLRConfig fields and schedule options."""
  from t2mlr_jax import ModelConfig, T2MLRConfig
  from t2mlr_jax.registry import schedule_option_defaults
  base, l_start, l_end, B, T = SHAPES[shape]
  options = {k: v for k, v in kw.items() if k in schedule_option_defaults()}
  rec = T2MLRConfig(l_start=l_start, l_end=l_end,
                    **{k: v for k, v in kw.items() if k not in options})
  cfg = (ModelConfig.preset(base, recurrence=rec, schedule_options=options)
         if isinstance(base, str) else ModelConfig(**base, recurrence=rec,
                                                   schedule_options=options))
  return cfg, B, T


def loss_and_grad(cfg, mode):
  """jit(value_and_grad) of the loss on (params, tokens[, labels]); labels default to
  the next tokens."""
  import jax

  from t2mlr_jax import forward
  from t2mlr_jax.losses import cross_entropy, next_token_labels

  def loss(params, tokens, labels=None):
    logits, aux = forward(params, cfg, tokens, mode=mode, return_aux=True)
    labels = next_token_labels(tokens) if labels is None else labels
    return cross_entropy(logits, labels)[0], aux

  return jax.jit(jax.value_and_grad(loss, has_aux=True))


def compare_steps(cfg, params, batch, repeats, tol):
  """The baseline (recurrence off), Jacobi with fixed sweeps and Jacobi with jacobi_tol
  on the same batch (tokens[, labels]), alternated: medians, sweeps run, losses."""
  import jax
  base_params = {k: v for k, v in params.items() if k != "recurrence"}
  tol_cfg = cfg.replace(schedule_options=cfg.schedule_options.replace(jacobi_tol=tol))
  fns = {"baseline": (loss_and_grad(cfg.replace(recurrence=None), "parallel"), base_params),
         "jacobi_fixed": (loss_and_grad(cfg, "jacobi"), params),
         "jacobi_tol": (loss_and_grad(tol_cfg, "jacobi"), params)}
  outs = {name: jax.block_until_ready(fn(p, *batch))      # compile + first run
          for name, (fn, p) in fns.items()}
  times = bc.alternate({k: (lambda f=f, p=p: f(p, *batch)) for k, (f, p) in fns.items()},
                       repeats)
  med = {k: bc.median(v) for k, v in times.items()}
  (l_fixed, aux_fixed), _ = outs["jacobi_fixed"]
  (l_tol, aux_tol), _ = outs["jacobi_tol"]
  rc, opts = cfg.recurrence, cfg.schedule_options
  return {"jacobi_tol": tol, "residual": rc.residual,
          "d_forward": opts.d_forward, "d_backward": opts.d_backward,
          "ms_per_step": {k: round(v * 1e3, 1) for k, v in med.items()},
          "ratio_to_baseline": {k: round(v / med["baseline"], 3) for k, v in med.items()},
          "sweeps": {"fixed": int(aux_fixed["jacobi_sweeps"]),
                     "tol": int(aux_tol["jacobi_sweeps"])},
          "residual_after_sweeps": {"fixed": float(aux_fixed["jacobi_residual"]),
                                    "tol": float(aux_tol["jacobi_residual"])},
          "loss": {"fixed": float(l_fixed), "tol": float(l_tol),
                   "abs_diff": abs(float(l_fixed) - float(l_tol))},
          "raw_seconds": {k: [round(x, 4) for x in v] for k, v in times.items()}}


def part_step(shape, repeats, gamma, tol, residual=True):
  import jax
  import numpy as np

  import t2mlr_jax
  cfg, B, T = build(shape, d_forward=16, d_backward=4, residual=residual)
  params = t2mlr_jax.init_params(cfg, jax.random.PRNGKey(0))
  params["recurrence"]["gamma_rec"] = np.float32(gamma)
  params["recurrence"]["gamma_cur"] = np.float32(gamma)
  tokens = np.random.RandomState(0).randint(0, cfg.vocab_size, (B, T)).astype(np.int32)
  return {"shape": shape, "batch": B, "seq_len": T, "gamma": gamma,
          **compare_steps(cfg, params, (tokens,), repeats, tol)}


def part_step_trained(workdir, repeats, tol):
  import numpy as np

  from t2mlr_jax import checkpoint
  from t2mlr_jax.data import s5_examples
  cfg, params = checkpoint.load(workdir)
  config = checkpoint.load_config(workdir)
  if config.data.task != "s5_word_problem":
    raise SystemExit(f"--workdir: {workdir} holds a {config.data.task!r} run; "
                     "step_trained needs an s5_word_problem run")
  B, T = config.train.batch_size, config.data.max_actions
  problems = [s5_examples.generate_word_problem((7, i), T, group=config.data.group)
              for i in range(B)]
  tokens = np.stack([ex["input_ids"] for ex in problems])
  labels = np.stack([ex["target_ids"] for ex in problems])     # the running states
  return {"workdir": os.path.relpath(workdir, bc.ROOT), "batch": B, "seq_len": T,
          **compare_steps(cfg, params, (tokens, labels), repeats, tol)}


def temp_bytes(cfg, B, T):
  import jax
  import numpy as np

  import t2mlr_jax
  params = jax.eval_shape(lambda: t2mlr_jax.init_params(cfg, jax.random.PRNGKey(0)))
  tokens = jax.ShapeDtypeStruct((B, T), np.int32)
  compiled = loss_and_grad(cfg, "jacobi").lower(params, tokens).compile()
  return int(compiled.memory_analysis().temp_size_in_bytes)


def part_memory(shape):
  out = {"shape": shape, "by_d_forward": {}, "by_d_backward": {}}
  for remat in ("none", "full"):
    for d_f in (4, 8, 16, 32):
      cfg, B, T = build(shape, d_forward=d_f, d_backward=4)
      cfg = cfg.replace(remat=remat)
      out["by_d_forward"].setdefault(remat, {})[d_f] = temp_bytes(cfg, B, T)
    for d_b in (1, 2, 4, 8):
      cfg, B, T = build(shape, d_forward=16, d_backward=d_b)
      cfg = cfg.replace(remat=remat)
      out["by_d_backward"].setdefault(remat, {})[d_b] = temp_bytes(cfg, B, T)
  for remat, row in out["by_d_forward"].items():
    vals = list(row.values())
    out.setdefault("flat_in_d_forward", {})[remat] = round(max(vals) / min(vals), 3)
  return out


def part_hf_step(shape, repeats, threads=2):
  import jax
  import numpy as np
  import torch
  import transformers

  import t2mlr_jax
  from t2mlr_jax.convert.hf import _hf_state_dict, config_to_hf
  cfg, B, T = build(shape, d_forward=16, d_backward=4)
  cfg = cfg.replace(recurrence=None)
  params = t2mlr_jax.init_params(cfg, jax.random.PRNGKey(0))
  tokens = np.random.RandomState(0).randint(0, cfg.vocab_size, (B, T)).astype(np.int32)
  ours = loss_and_grad(cfg, "parallel")
  torch.set_num_threads(threads)
  hf_cfg = transformers.LlamaConfig(**{k: v for k, v in config_to_hf(cfg).items()
                                       if k not in ("architectures", "torch_dtype")})
  model = transformers.LlamaForCausalLM(hf_cfg)
  sd = {k: torch.as_tensor(np.array(v, np.float32))
        for k, v in _hf_state_dict(cfg, jax.device_get(params)).items()}
  missing = model.load_state_dict(sd, strict=False).missing_keys
  if [k for k in missing if k != "lm_head.weight"]:
    raise SystemExit(f"HF model missing weights: {missing}")
  ids = torch.as_tensor(tokens, dtype=torch.long)

  def hf_step():
    model.zero_grad(set_to_none=True)
    out = model(ids, labels=ids)
    out.loss.backward()
    return out.loss

  (ours_loss, _), _ = jax.block_until_ready(ours(params, tokens))
  hf_loss = float(hf_step())
  times = bc.alternate({"ours": lambda: ours(params, tokens), "hf_pytorch": hf_step}, repeats)
  med = {k: bc.median(v) for k, v in times.items()}
  return {"shape": shape, "batch": B, "seq_len": T, "torch_threads": threads,
          "torch": torch.__version__, "transformers": transformers.__version__,
          "loss": {"ours": float(ours_loss), "hf_pytorch": hf_loss},
          "ms_per_step": {k: round(v * 1e3, 1) for k, v in med.items()},
          "ours_over_hf": round(med["ours"] / med["hf_pytorch"], 3),
          "raw_seconds": {k: [round(x, 4) for x in v] for k, v in times.items()}}


def part_loss_memory(T=4096, chunks=(1024, 512, 256)):
  import jax
  import numpy as np

  import t2mlr_jax
  from t2mlr_jax import ModelConfig, T2MLRConfig
  from t2mlr_jax.model.api import loss
  base = dict(vocab_size=49152, d_model=576, n_layers=2, n_heads=9, n_kv_heads=3, d_ff=1536,
              max_seq_len=T, tie_embeddings=True)
  out = {"T": T, "batch": 1, "vocab": 49152, "logits_bytes": T * 49152 * 4, "models": {}}
  for name, rec, mode in (("plain", None, "parallel"),
                          ("t2mlr", T2MLRConfig(l_start=1, l_end=1), "jacobi")):
    cfg = ModelConfig(**base, recurrence=rec, schedule_options=dict(d_forward=4, d_backward=2))
    params = jax.eval_shape(lambda: t2mlr_jax.init_params(cfg, jax.random.PRNGKey(0)))
    tokens = jax.ShapeDtypeStruct((1, T), np.int32)
    row = {}
    for chunk in (None, *chunks):
      f = jax.value_and_grad(lambda p, t, c=chunk: loss(p, cfg, t, mode=mode, loss_chunk=c))
      compiled = jax.jit(f).lower(params, tokens).compile()
      row["full" if chunk is None else f"chunk_{chunk}"] = int(
          compiled.memory_analysis().temp_size_in_bytes)
    row["saved_bytes"] = {k: row["full"] - v for k, v in row.items() if k != "full"}
    out["models"][name] = row
  return out


def part_compile(shape):
  import jax
  import numpy as np

  import t2mlr_jax
  out = {"shape": shape}
  for scan in (True, False):
    cfg, B, T = build(shape, d_forward=16, d_backward=4)
    cfg = cfg.replace(scan_layers=scan)
    params = jax.eval_shape(lambda: t2mlr_jax.init_params(cfg, jax.random.PRNGKey(0)))
    tokens = jax.ShapeDtypeStruct((B, T), np.int32)
    start = time.perf_counter()
    loss_and_grad(cfg, "jacobi").lower(params, tokens).compile()
    out["scanned" if scan else "unrolled"] = round(time.perf_counter() - start, 2)
  out["n_layers"] = cfg.n_layers
  return out


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--shape", default="smollm2-135m", choices=sorted(SHAPES))
  p.add_argument("--parts", default="step,step_raw,memory,compile")
  p.add_argument("--repeats", type=int, default=5)
  p.add_argument("--gamma", type=float, default=0.5)
  p.add_argument("--tol", type=float, default=1e-4)
  p.add_argument("--workdir", default=os.path.join(bc.ROOT, "workdirs", "s5_length_sweep",
                                                   "word", "t2mlr_middle"),
                 help="trained S5 word-problem run for the step_trained part")
  p.add_argument("--lrt_shape", default="nanochat-d6", choices=sorted(LRT_SHAPES))
  p.add_argument("--out", default=None)
  args = p.parse_args()
  results = {}
  for part in args.parts.split(","):
    if part == "step":
      results["step"] = part_step(args.shape, args.repeats, args.gamma, args.tol)
    elif part == "step_raw":
      results["step_raw"] = part_step(args.shape, args.repeats, args.gamma, args.tol,
                                      residual=False)
    elif part == "step_trained":
      results["step_trained"] = part_step_trained(args.workdir, args.repeats, args.tol)
    elif part == "memory":
      results["memory"] = part_memory(args.shape)
    elif part == "compile":
      results["compile"] = part_compile(args.shape)
    elif part == "lrt_step":
      results["lrt_step"] = part_lrt_step(args.lrt_shape, args.repeats)
    elif part == "lrt_memory":
      results["lrt_memory"] = part_lrt_memory(args.lrt_shape)
    elif part == "lrt_compile":
      results["lrt_compile"] = part_lrt_compile(args.lrt_shape)
    elif part == "hf_step":
      results["hf_step"] = part_hf_step(args.shape, args.repeats)
    elif part == "loss_memory":
      results["loss_memory"] = part_loss_memory()
    else:
      p.error(f"unknown part {part!r}")
    results[part] = {"machine": bc.machine_info(), "date": time.strftime("%Y-%m-%d %H:%M"),
                     **results[part]}
    print(part, {k: v for k, v in results[part].items()
                 if k not in ("raw_seconds", "machine")}, flush=True)
  out = args.out or f"bench_train_{args.shape}.json"
  old = bc.read_json(out, default={})   # keep the parts not rerun
  kept = ("step", "step_raw", "step_trained", "memory", "compile", "lrt_step",
          "lrt_memory", "lrt_compile", "loss_memory", "hf_step")
  results = {**{k: v for k, v in old.items() if k in kept},
             **results}
  print("wrote", bc.write_json(out, results))


if __name__ == "__main__":
  main()
