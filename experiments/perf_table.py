"""docs/performance.md's tables, generated from the benchmark JSON files.

    python experiments/perf_table.py            # print the markdown
    python experiments/perf_table.py --write    # replace it between the markers in docs/performance.md
"""

from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "experiments"))
from bench_common import read_json  # noqa: E402

START, END = "<!-- perf:start -->", "<!-- perf:end -->"


def _machine(d) -> str:
  m = d["machine"]
  return f"{m.get('cpu_model', m['platform'])}, {m['cpus']} cores, jax {m['jax']}, commit {m['commit']}"


def decode_rows(d) -> list[str]:
  out = [f"**Decode** (`python experiments/bench_decode.py`; {_machine(d)}). "
         f"{d['shape']} with T2MLR on layers {d['recurrent_block'][0]}–"
         f"{d['recurrent_block'][1]}, random weights, fp32, greedy, prompt {d['prompt']}, "
         f"{d['new_tokens']} new tokens; per-token medians, runs alternated. Weights "
         f"{d['weight_bytes'] / 1e6:.0f} MB at a measured {d['read_bandwidth_gbs']} GB/s: "
         f"streaming floor {d['weight_streaming_floor_ms']} ms/token.", "",
         "| batch | T2MLR ms/token | plain ms/token | T2MLR overhead | × floor | HF generate ms/token | speed-up vs HF |",
         "|---|---|---|---|---|---|---|"]
  for b, r in d["batches"].items():
    hf = r.get("hf_ms_per_token")
    hf_ms = "–" if hf is None else f"{hf:.1f}"
    speedup = "–" if hf is None else "{:.2f}×".format(r["speedup_vs_hf"])
    out.append(f"| {b} | {r['t2mlr_ms_per_token']:.1f} | {r['base_ms_per_token']:.1f} | "
               f"{100 * r['t2mlr_overhead']:+.1f}% | {r['t2mlr_vs_floor']:.2f} | "
               f"{hf_ms} | {speedup} |")
  return out


def train_rows(d, name) -> list[str]:
  out = []
  if "step" in d:
    s = d["step"]
    out += [f"**Train step** (`python experiments/bench_train.py --shape={name}`; "
            f"{_machine(d)}). B={s['batch']}, T={s['seq_len']}, fp32, γ = {s['gamma']} "
            f"(recurrence on), Jacobi {s['d_forward']}/{s['d_backward']}; medians, "
            "alternated. Each cache's rows come from one run with its own baseline.", "",
            "| cache | step | ms | × baseline | sweeps | loss |", "|---|---|---|---|---|---|"]
    for part, cache in (("step", "residual (default)"), ("step_raw", "raw (`residual=False`)")):
      if part not in d:
        continue
      s = d[part]
      out += [f"| {cache} | baseline (no recurrence) | {s['ms_per_step']['baseline']:.0f} | "
              "1.00 | – | – |",
              f"| {cache} | Jacobi, fixed sweeps | {s['ms_per_step']['jacobi_fixed']:.0f} | "
              f"{s['ratio_to_baseline']['jacobi_fixed']:.2f} | {s['sweeps']['fixed']} | "
              f"{s['loss']['fixed']:.6f} |",
              f"| {cache} | Jacobi, jacobi_tol={s['jacobi_tol']} | "
              f"{s['ms_per_step']['jacobi_tol']:.0f} | "
              f"{s['ratio_to_baseline']['jacobi_tol']:.2f} | {s['sweeps']['tol']} | "
              f"{s['loss']['tol']:.6f} |"]
    out.append("")
  if "step_trained" in d:
    s = d["step_trained"]
    ms, ratio = s["ms_per_step"], s["ratio_to_baseline"]
    out += [f"Trained model (`--parts=step_trained`, `{s['workdir']}`, its own shape "
            f"B={s['batch']}, T={s['seq_len']}, Jacobi {s['d_forward']}/{s['d_backward']}): "
            f"baseline {ms['baseline']:.0f} ms, fixed sweeps {ms['jacobi_fixed']:.0f} ms "
            f"({ratio['jacobi_fixed']:.2f}×, {s['sweeps']['fixed']} sweeps), "
            f"jacobi_tol={s['jacobi_tol']} {ms['jacobi_tol']:.0f} ms "
            f"({ratio['jacobi_tol']:.2f}×, {s['sweeps']['tol']} sweeps); loss on the "
            f"running states {s['loss']['fixed']:.3g} vs {s['loss']['tol']:.3g}.", ""]
  if "hf_step" in d:
    h = d["hf_step"]
    out += [f"Plain step against transformers' PyTorch `LlamaForCausalLM` with the same "
            f"weights (`--parts=hf_step`; {_machine(h if 'machine' in h else d)}; "
            f"B={h['batch']}, T={h['seq_len']}, loss and "
            f"gradient, torch {h['torch']} with {h['torch_threads']} threads, alternated, "
            f"medians; losses {h['loss']['ours']:.6f} vs {h['loss']['hf_pytorch']:.6f}): "
            f"ours {h['ms_per_step']['ours']:.0f} ms, PyTorch "
            f"{h['ms_per_step']['hf_pytorch']:.0f} ms ({h['ours_over_hf']:.2f}×).", ""]
  if "memory" in d:
    m = d["memory"]
    out.append("Peak temporary memory of the compiled step (XLA `memory_analysis`, MB):")
    out.append("")
    out.append("| remat | " + " | ".join(f"D_f={k}" for k in m["by_d_forward"]["none"]) +
               " | " + " | ".join(f"D_b={k}" for k in m["by_d_backward"]["none"]) + " |")
    out.append("|---" * (1 + len(m["by_d_forward"]["none"]) + len(m["by_d_backward"]["none"]))
               + "|")
    for remat in m["by_d_forward"]:
      f = " | ".join(f"{v / 1e6:.0f}" for v in m["by_d_forward"][remat].values())
      b = " | ".join(f"{v / 1e6:.0f}" for v in m["by_d_backward"][remat].values())
      out.append(f"| {remat} | {f} | {b} |")
    out.append("")
  if "compile" in d:
    c = d["compile"]
    out.append(f"Compile time of the {c['n_layers']}-layer Jacobi train step: "
               f"{c['scanned']} s scanned, {c['unrolled']} s unrolled.")
    out.append("")
  return out


def prefill_rows(d) -> list[str]:
  out = [f"**Exact parallel prefill** (`python experiments/bench_prefill.py`; "
         f"{_machine(d)}): Jacobi sweeps until max|ΔR| < {d['tol']} (at most T) vs "
         "token-by-token exact prefill, batch 1.", "",
         "| model | T | exact ms | Jacobi ms | speed-up | sweeps | max logit diff | runs |",
         "|---|---|---|---|---|---|---|---|"]
  for model, rows in d["models"].items():
    for T, r in rows.items():
      out.append(f"| {model} | {T} | {r['exact_ms']:.0f} | {r['jacobi_ms']:.0f} | "
                 f"{r['speedup']:.2f}× | {r['sweeps']} | {r['max_logit_diff']:.1e} | "
                 f"{r.get('repeats', '')} |")
  return out


LRT_STEPS = (("interleaved_S2", "interleaved, S = 2"), ("interleaved_S3", "interleaved, S = 3"),
             ("chunked_S2", "chunked, S = 2"), ("multi_refine_K3", "multi-refine, K = 3"))


def lrt_train_rows(d, out_name) -> list[str]:
  out = []
  if "lrt_step" in d:
    s = d["lrt_step"]
    out += [f"**LRT train step, {s['shape']}** (`python experiments/bench_train.py "
            f"--parts=lrt_step --lrt_shape={s['shape']} --out={out_name}`; {_machine(d)}). "
            f"B={s['batch']}, T={s['seq_len']}, fp32, LRT-layerwise with the release's init "
            f"({s['params'] / 1e6:.2f}M parameters; the plain backbone "
            f"{s['baseline_params'] / 1e6:.2f}M); forward + backward of `t2mlr_jax.loss`; "
            "medians, alternated.", "",
            "| schedule | ms | × plain step |", "|---|---|---|",
            f"| plain backbone (`recurrence=None`) | {s['ms_per_step']['baseline']:.0f} | 1.00 |"]
    for key, label in LRT_STEPS:
      if key in s["ms_per_step"]:
        out.append(f"| {label} | {s['ms_per_step'][key]:.0f} | "
                   f"{s['ratio_to_baseline'][key]:.2f}× |")
    out.append("")
  if "lrt_memory" in d:
    m = d["lrt_memory"]
    row = lambda by: ", ".join(f"{k}: {v:.0f}" for k, v in by.items())
    out += [f"LRT peak temporary memory of the compiled step, MiB (XLA `memory_analysis`, "
            f"same shape; `--parts=lrt_memory`): plain {m['baseline']:.0f}; interleaved by S "
            f"{row(m['interleaved_by_S'])}; chunked by S {row(m['chunked_by_S'])}; "
            f"multi-refine by K {row(m['multi_refine_by_K'])}.", ""]
  if "lrt_compile" in d:
    c = d["lrt_compile"]
    out += [f"LRT compile seconds ({c['n_layers']} layers, `--parts=lrt_compile`): plain "
            f"{c['baseline']}, interleaved S = 2 / 3 / 8: "
            f"{' / '.join(str(v) for v in c['interleaved_by_S'].values())}, multi-refine "
            f"K = 3: {c['multi_refine_K3']}.", ""]
  return out


def lrt_decode_rows(d) -> list[str]:
  out = [f"**LRT decode** (`python experiments/bench_decode.py --recurrence=lrt --batch=1 "
         f"--prompt={d['prompt']} --new={d['new_tokens']}`; {_machine(d)}). {d['shape']} "
         "backbone, random weights with the release's LRT init, fp32, greedy; per-token "
         "medians (generate N − generate 1, alternated); the value-embedding tables are "
         "gathered, not streamed.", "",
         "| batch | plain ms/token | LRT-layerwise ms/token | overhead | LRT-shared ms/token | overhead |",
         "|---|---|---|---|---|---|"]
  for b, r in d["batches"].items():
    out.append(f"| {b} | {r['base_ms_per_token']:.1f} | {r['lrt_layerwise_ms_per_token']:.1f} | "
               f"{100 * r['lrt_layerwise_overhead']:+.1f}% | {r['lrt_shared_ms_per_token']:.1f} | "
               f"{100 * r['lrt_shared_overhead']:+.1f}% |")
  return out


def loss_memory_rows(d) -> list[str]:
  m = d["loss_memory"]
  chunks = [k for k in next(iter(m["models"].values())) if k.startswith("chunk_")]
  out = [f"**Chunked cross-entropy** (`python experiments/bench_train.py --parts=loss_memory "
         f"--out=bench_loss_memory.json`; {_machine(d)}): peak temporary memory (XLA "
         f"`memory_analysis`, MB) of the compiled loss and gradient of a 2-layer model, "
         f"V = {m['vocab']}, T = {m['T']}, batch {m['batch']}; the fp32 logits alone are "
         f"{m['logits_bytes'] / 1e6:.0f} MB. `train.loss_chunk` = positions per chunk.", "",
         "| model | full CE | " + " | ".join(f"chunk {c[6:]}" for c in chunks) + " | saved |",
         "|---" * (3 + len(chunks)) + "|"]
  for name, row in m["models"].items():
    saved = max(row["saved_bytes"].values())
    out.append(f"| {name} | {row['full'] / 1e6:.0f} | " +
               " | ".join(f"{row[c] / 1e6:.0f}" for c in chunks) +
               f" | {saved / 1e6:.0f} ({100 * saved / row['full']:.0f}%) |")
  return out


def xla_flags_rows(d) -> list[str]:
  out = [f"**XLA:CPU options** (`python experiments/xla_cpu_flags.py`; {_machine(d)}): the "
         "plain smollm2-135m step (B=1, T=256, fp32) under each `XLA_FLAGS` setting, "
         "ours and transformers' PyTorch Llama alternated in each run (medians); the "
         "ratio is the comparable number, since each run measures both sides. Our loss "
         "shows whether an option changed the numerics.", "",
         "| setting | XLA_FLAGS | ours ms | HF PyTorch ms | ours ÷ HF | our loss |",
         "|---|---|---|---|---|---|"]
  for name, r in d["runs"].items():
    if "error" in r:
      out.append(f"| {name} | `{r['xla_flags']}` | failed: {' '.join(r['error'])[:80]} | | | |")
      continue
    ms = r["ms_per_step"]
    out.append(f"| {name} | `{r['xla_flags'] or '(none)'}` | {ms['ours']:.0f} | "
               f"{ms['hf_pytorch']:.0f} | {r['ours_over_hf']:.3f} | {r['loss_ours']:.6f} |")
  return out


def table() -> str:
  parts = []
  d = read_json("bench_decode.json", default=None)
  if d:
    parts += decode_rows(d) + [""]
  for name in ("smollm2-135m", "s5"):
    t = read_json(f"bench_train_{name}.json", default=None)
    if t:
      parts += train_rows(t, name)
  p = read_json("bench_prefill.json", default=None)
  if p:
    parts += prefill_rows(p) + [""]
  for out_name in ("bench_train_lrt.json", "bench_train_lrt_s5.json"):
    t = read_json(out_name, default=None)
    if t:
      parts += lrt_train_rows(t, out_name)
  d = read_json("bench_decode_lrt.json", default=None)
  if d:
    parts += lrt_decode_rows(d) + [""]
  d = read_json("bench_loss_memory.json", default=None)
  if d:
    parts += loss_memory_rows(d) + [""]
  d = read_json("xla_cpu_flags.json", default=None)
  if d:
    parts += xla_flags_rows(d) + [""]
  return "\n".join(parts).rstrip() + "\n"


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--write", action="store_true")
  args = ap.parse_args()
  text = table()
  if not args.write:
    print(text)
    return
  readme = os.path.join(ROOT, "docs", "performance.md")
  with open(readme) as f:
    s = f.read()
  if START not in s or END not in s:
    raise SystemExit(f"docs/performance.md has no {START} ... {END} markers")
  head, rest = s.split(START, 1)
  _, tail = rest.split(END, 1)
  with open(readme, "w") as f:
    f.write(head + START + "\n" + text + END + tail)


if __name__ == "__main__":
  main()
