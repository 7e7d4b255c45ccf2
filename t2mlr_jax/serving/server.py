"""A model served over HTTP with OpenAI's API (`python -m t2mlr_jax.serve --model=PATH`).

Every source `loading` opens (GGUF, Hugging Face directory, export, training workdir),
with its tokenizer. Routes: `GET /health`, `GET /v1/models` (and `/v1/models/{id}`),
`POST /v1/completions`,
`POST /v1/chat/completions` (both with `n` samples a prompt, each in its own slot, and
`stream` as server-sent events that carry `logprobs` and `echo`), and the
tokenizer routes lm-eval's remote tokenizer asks for (`GET /tokenizer_info`,
`POST /tokenize`, `POST /detokenize`). Requests share the engine's decode slots
(`engine.py`), each with its own recurrent state; a scheduler thread drives the engine
and hands every request its tokens as they come. Errors are OpenAI's JSON shape with the
right status; the server stays up. Extension field: `recurrence` "exact" (default) or
"off" (control flow 1 on every token). The routes are in routes.py, the request bodies
(pydantic models, in /openapi.json) in schemas.py, the answers and their server-sent
events in events.py, the scheduler in scheduler.py.
docs/serving.md.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Optional

import jax
from absl import logging

from t2mlr_jax.convert.loading import load_model_and_tokenizer
from t2mlr_jax.data.tokenizer import TokenizerView
from t2mlr_jax.model.control_flow import CF_PLAIN, CF_RECURRENT
from t2mlr_jax.serving import routes
from t2mlr_jax.serving.engine import Engine, Sampling  # noqa: F401 - for callers
from t2mlr_jax.serving.scheduler import Job, Scheduler  # noqa: F401 - for callers
from t2mlr_jax.serving.schemas import MAX_BODY_BYTES, ApiError, Settings  # noqa: F401

try:        # the optional extra `serve` (pip install -e ".[serve]")
  import uvicorn
  from fastapi import FastAPI
except ImportError as e:      # pragma: no cover - the message is the point
  raise ImportError(f"{e}: the server needs FastAPI and uvicorn: pip install -e \".[serve]\"") \
      from None

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


# ----------------------------------------------------------------------- the server

class Server:
  """The model, its tokenizer and engine, and what the routes need to answer."""

  def __init__(self, cfg, params, tokenizer, *, name: str, max_batch: int = 8,
               max_len: Optional[int] = None, max_queue: int = 1024,
               api_key: Optional[str] = None, completion_control_flow: int = CF_RECURRENT,
               chat_control_flow: int = CF_PLAIN, add_bos: bool = False,
               cache_dtype: Optional[str] = None):
    self.cfg, self.name, self.api_key = cfg, name, api_key
    self.tok = tokenizer if isinstance(tokenizer, TokenizerView) else TokenizerView(
        tokenizer, name)
    self.engine = Engine(cfg, params, max_batch=max_batch, max_len=max_len,
                         cache_dtype=cache_dtype)
    self.scheduler = Scheduler(self.engine, self.tok.eos_id, max_queue)
    self.completion_control_flow = completion_control_flow
    self.chat_control_flow = chat_control_flow
    self.add_bos = add_bos
    self.created = int(time.time())
    self.ready = False
    self.late_compiles = 0

  def warmup(self, prompt_lengths=None) -> int:
    """Compile the engine's programs for every prompt bucket up to max_len (or these
    prompt lengths' buckets); then ready, and any later compile (a program warm-up did
    not compile) is counted and warned about. Returns the number of programs compiled."""
    flows = sorted({self.completion_control_flow, self.chat_control_flow, CF_PLAIN})
    n = self.engine.warmup(prompt_lengths=prompt_lengths, control_flows=flows,
                           echo=(False, True))
    jax.monitoring.register_event_duration_secs_listener(self._on_compile)
    self.ready = True
    return n

  def _on_compile(self, event: str, duration: float, **kwargs) -> None:
    if event == COMPILE_EVENT:
      self.late_compiles += 1
      logging.warning("compiled a program after warm-up (%.1f s; %d so far): a prompt "
                      "bucket --warmup_lengths left out", duration, self.late_compiles)

  def close(self, timeout: float = 30) -> None:
    """Finish the requests in flight and queued (at most `timeout` s), stop counting."""
    self.scheduler.stop(timeout)
    jax.monitoring.unregister_event_duration_listener(self._on_compile)

  def token_text(self, token_id: int) -> str:
    return self.tok.decode([token_id], skip_special_tokens=False)

  def logprob_entries(self, ids, logprobs, tops, n: int, first_none: bool = False,
                      at: int = 0) -> dict:
    """OpenAI's completions `logprobs` object for tokens `ids`, text offsets from `at`."""
    tokens = [self.token_text(i) for i in ids]
    offsets = []
    for t in tokens:
      offsets.append(at)
      at += len(t)
    top = [{self.token_text(int(i)): float(lp) for i, lp in zip(ti[:n], tl[:n])}
           for ti, tl in tops]
    values = [float(v) for v in logprobs]
    if first_none:
      values, top = [None] + values, [None] + top
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": top,
            "text_offset": offsets}


def create_app(server: Server) -> FastAPI:
  """The FastAPI app of a Server: the routes (routes.py), the key and size guard, and
  every ApiError answered in OpenAI's shape."""
  app = FastAPI(title="t2mlr_jax", docs_url=None, redoc_url=None)
  app.state.server = server
  app.add_exception_handler(ApiError, routes.api_error)
  app.add_exception_handler(routes.StarletteHTTPException, routes.http_error)
  app.add_exception_handler(routes.RequestValidationError, routes.validation_error)
  app.middleware("http")(routes.guard)
  app.include_router(routes.router)
  return app


def run_in_thread(server: Server, port: int, host: str = "127.0.0.1"):
  """(uvicorn.Server, thread): the app of a warmed-up Server on a loopback port in a
  thread (tests, benchmarks); stop with `.should_exit = True`, then `server.close()`."""
  uv = uvicorn.Server(uvicorn.Config(create_app(server), host=host, port=port,
                                     log_level="warning"))
  thread = threading.Thread(target=uv.run, daemon=True)
  thread.start()
  deadline = time.time() + 30
  while not uv.started and time.time() < deadline and thread.is_alive():
    time.sleep(0.05)
  return uv, thread


# ----------------------------------------------------------------------- the command line

def exposure_warning(host: str, api_key: Optional[str]) -> Optional[str]:
  """A warning when the server is reachable beyond this host without a key."""
  if host in ("127.0.0.1", "localhost", "::1") or api_key:
    return None
  return (f"warning: serving on {host} without --api_key: anyone who can reach it can use "
          "it")


def default_compile_cache() -> str:
  """$XDG_CACHE_HOME/t2mlr_jax/jax_compile (~/.cache/t2mlr_jax/jax_compile without it)."""
  root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(root, "t2mlr_jax", "jax_compile")


def use_compile_cache(path: Optional[str]) -> Optional[str]:
  """JAX's persistent compilation cache in `path` (None: `default_compile_cache()`; "":
  off), every program kept: set before anything compiles, so a restart loads them.
  Returns the directory, or None when off."""
  if path == "":
    return None
  path = os.path.expanduser(path or default_compile_cache())
  jax.config.update("jax_compilation_cache_dir", path)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  return path


def serve_model(model: str, *, step: Optional[int] = None, tokenizer: Optional[str] = None,
                dtype: str = "float32", host: str = "127.0.0.1", port: int = 8000,
                max_batch: int = 8, max_len: Optional[int] = None, max_queue: int = 1024,
                api_key: Optional[str] = None, name: Optional[str] = None,
                prompt_control_flow: Optional[int] = None,
                warmup_lengths: Optional[tuple[int, ...]] = None,
                cache_dtype: Optional[str] = None, compile_cache: Optional[str] = None,
                own=None) -> None:
  """Load `model` (any source `loading` opens), compile the engine's programs (every
  prompt bucket, or `warmup_lengths`' buckets; cached in `compile_cache`), and serve it in
  the foreground until SIGTERM or Ctrl-C, finishing the requests in flight. `own`: a
  training workdir's task vocabulary, as `loading.find_tokenizer` takes it."""
  cache_dir = use_compile_cache(compile_cache)
  cfg, params, found = load_model_and_tokenizer(model, step, tokenizer, dtype=dtype,
                                                field="--model", own=own)
  if max_len is not None and not 2 <= max_len <= cfg.max_seq_len:
    raise ValueError(f"--max_len={max_len} is invalid: allowed 2..{cfg.max_seq_len} (the "
                     "model's context)")
  served = name or model.rstrip("/").split("/")[-1]
  server = Server(cfg, params, found.tokenizer, name=served, max_batch=max_batch,
                  max_len=max_len, max_queue=max_queue, api_key=api_key,
                  completion_control_flow=prompt_control_flow or CF_RECURRENT,
                  chat_control_flow=prompt_control_flow or CF_PLAIN,
                  add_bos=found.documents_start_with_bos, cache_dtype=cache_dtype)
  del params                 # the loader's host copy: the engine holds its own on the device
  warning = exposure_warning(host, api_key)
  if warning:
    print(warning, flush=True)
  engine = server.engine
  print(f"compiling the engine's programs for {served} (max_batch {max_batch}, max_len "
        f"{engine.max_len}, KV cache {engine.cache_bytes() / 2**20:.1f} MiB "
        f"{jax.numpy.dtype(engine.cache_dtype).name} at its largest) ...", flush=True)
  start = time.perf_counter()
  n = server.warmup(warmup_lengths)
  print(f"warm-up: {n} programs compiled in {time.perf_counter() - start:.1f} s (compile "
        f"cache: {cache_dir or 'off'})", flush=True)
  server.scheduler.start()
  app = create_app(server)
  print(f"serving {served} at http://{host}:{port}/v1", flush=True)
  config = uvicorn.Config(app, host=host, port=port, log_level="warning",
                          timeout_graceful_shutdown=30)
  # uvicorn answers SIGTERM by finishing the requests in flight, then re-raises the signal
  # with the handler it found: ours lets the process end normally (exit 0)
  signal.signal(signal.SIGTERM, lambda signum, frame: None)
  uvicorn.Server(config).run()            # SIGTERM / Ctrl-C: stop taking, finish in flight
  server.close(timeout=30)
  print("stopped", flush=True)
