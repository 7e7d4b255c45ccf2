"""A model served over HTTP with OpenAI's API (`python -m t2mlr_jax.serve --model=PATH`).

Every source `loading` opens (GGUF, Hugging Face directory, export, training workdir),
with its tokenizer. Routes: `GET /health`, `GET /v1/models`, `POST /v1/completions`,
`POST /v1/chat/completions` (both with `stream` as server-sent events), and the
tokenizer routes lm-eval's remote tokenizer asks for (`GET /tokenizer_info`,
`POST /tokenize`, `POST /detokenize`). Requests share the engine's decode slots
(`engine.py`), each with its own recurrent state; a scheduler thread drives the engine
and hands every request its tokens as they come. Errors are OpenAI's JSON shape with the
right status; the server stays up. Extension field: `recurrence` "exact" (default) or
"off" (control flow 1 on every token). docs/serving.md.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import os
import signal
import threading
import time
import uuid
from typing import Any, Optional

import jax
from absl import logging

from t2mlr_jax.convert.loading import load_model_and_tokenizer
from t2mlr_jax.data.tokenizer import TokenizerView
from t2mlr_jax.model.control_flow import CF_PLAIN, CF_RECURRENT
from t2mlr_jax.serving.engine import TOP_LOGPROBS, Engine, Sampling

try:        # the optional extra `serve` (pip install -e ".[serve]")
  import uvicorn
  from fastapi import FastAPI, Request
  from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, StreamingResponse
except ImportError as e:      # pragma: no cover - the message is the point
  raise ImportError(f"{e}: the server needs FastAPI and uvicorn: pip install -e \".[serve]\"") \
      from None

MAX_BODY_BYTES = 4 * 2**20
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
# the chat page: one static file, no build step, nothing fetched from elsewhere
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "chat_page.html"),
          encoding="utf-8") as _page:
  CHAT_PAGE = _page.read()
RECURRENCE = {"exact": CF_RECURRENT, "off": CF_PLAIN}


class ApiError(Exception):
  """An error answered in OpenAI's shape: {"error": {message, type, param, code}}."""

  def __init__(self, status: int, message: str, param: Optional[str] = None,
               kind: str = "invalid_request_error", headers: Optional[dict] = None):
    super().__init__(message)
    self.status, self.message, self.param, self.kind = status, message, param, kind
    self.headers = headers or {}

  def response(self) -> JSONResponse:
    return JSONResponse({"error": {"message": self.message, "type": self.kind,
                                   "param": self.param, "code": None}},
                        status_code=self.status, headers=self.headers)


# ----------------------------------------------------------------------- request checks

def _typed(body: dict, name: str, kinds, default, allowed: str):
  """body[name] if of one of `kinds` (bool is not a number), else 400 naming the field."""
  value = body.get(name, default)
  if value is None:
    return default
  ok = isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)
  if not ok:
    raise ApiError(400, f"{name}={value!r} is invalid: allowed {allowed}", name)
  return value


@dataclasses.dataclass
class Settings:
  """One request's generation settings, checked."""
  max_tokens: Optional[int]
  sampling: Sampling
  stop: list
  echo: bool
  logprobs: Optional[int]
  stream: bool
  gen_cf: int
  prompt_cf: int
  include_usage: bool = False


def _settings(body: dict, server: "Server", *, chat: bool,
              default_max: Optional[int]) -> Settings:
  """The request's settings; max_tokens None (chat without one): the context's room."""
  max_tokens = _typed(body, "max_completion_tokens" if chat and "max_completion_tokens" in body
                      else "max_tokens", (int,), default_max, "an integer >= 1")
  if max_tokens is not None and not 1 <= max_tokens <= server.engine.max_len:
    raise ApiError(400, f"max_tokens={max_tokens} is invalid: allowed 1.."
                   f"{server.engine.max_len} (--max_len)", "max_tokens")
  temperature = float(_typed(body, "temperature", (int, float), 1.0, "a number in [0, 2]"))
  if not 0 <= temperature <= 2:
    raise ApiError(400, f"temperature={temperature} is invalid: allowed [0, 2]", "temperature")
  top_p = float(_typed(body, "top_p", (int, float), 1.0, "a number in (0, 1]"))
  if not 0 < top_p <= 1:
    raise ApiError(400, f"top_p={top_p} is invalid: allowed (0, 1]", "top_p")
  top_k = _typed(body, "top_k", (int,), 0, "an integer >= 0 (0: off)")
  if top_k < 0:
    raise ApiError(400, f"top_k={top_k} is invalid: allowed an integer >= 0", "top_k")
  seed = _typed(body, "seed", (int,), None, "an integer")
  seed = int(uuid.uuid4().int % 2**31) if seed is None else seed % 2**31
  stop = _typed(body, "stop", (str, list), [], "a string or a list of up to 4 strings")
  stop = [stop] if isinstance(stop, str) else stop
  if len(stop) > 4 or not all(isinstance(s, str) and s for s in stop):
    raise ApiError(400, f"stop={stop!r} is invalid: allowed a string or a list of up to 4 "
                   "non-empty strings", "stop")
  n = _typed(body, "n", (int,), 1, "1")
  if n != 1:
    raise ApiError(400, f"n={n} is invalid: allowed 1", "n")
  if chat:
    want = _typed(body, "logprobs", (bool,), False, "true or false")
    top = _typed(body, "top_logprobs", (int,), 0, f"0..{TOP_LOGPROBS}")
    logprobs = top if want else None
    echo = False
  else:
    logprobs = _typed(body, "logprobs", (int,), None, f"an integer 0..{TOP_LOGPROBS}")
    echo = _typed(body, "echo", (bool,), False, "true or false")
  if logprobs is not None and not 0 <= logprobs <= TOP_LOGPROBS:
    raise ApiError(400, f"logprobs={logprobs} is invalid: allowed 0..{TOP_LOGPROBS}",
                   "logprobs")
  recurrence = _typed(body, "recurrence", (str,), "exact", f"one of {list(RECURRENCE)}")
  if recurrence not in RECURRENCE:
    raise ApiError(400, f"recurrence={recurrence!r} is invalid: allowed one of "
                   f"{list(RECURRENCE)}", "recurrence")
  prompt_cf = CF_PLAIN if recurrence == "off" else (
      server.chat_control_flow if chat else server.completion_control_flow)
  options = _typed(body, "stream_options", (dict,), {}, "an object")
  include_usage = options.get("include_usage", False)
  if not isinstance(include_usage, bool):
    raise ApiError(400, f"stream_options.include_usage={include_usage!r} is invalid: allowed "
                   "true or false", "stream_options")
  return Settings(max_tokens, Sampling(temperature, top_k, top_p, seed), stop, echo, logprobs,
                  _typed(body, "stream", (bool,), False, "true or false"),
                  RECURRENCE[recurrence], prompt_cf, include_usage)


def _prompts(body: dict, tok: TokenizerView, add_bos: bool) -> list[list[int]]:
  """The prompt field as token-id lists: text, token ids, or a list of either."""
  prompt = body.get("prompt")
  bad = ApiError(400, f"prompt={str(prompt)[:60]!r} is invalid: allowed a string, a list of "
                 "token ids, or a list of either", "prompt")
  if isinstance(prompt, str):
    prompt = [prompt]
  elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and
                                                    not isinstance(t, bool) for t in prompt):
    prompt = [prompt]
  if not isinstance(prompt, list) or not prompt:
    raise bad
  out = []
  for p in prompt:
    if isinstance(p, str):
      ids = tok.encode(p, False)
      if add_bos and tok.bos_id is not None:
        ids = [tok.bos_id] + ids
    elif isinstance(p, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
      ids = list(p)
    else:
      raise bad
    out.append(ids)
  return out


# ----------------------------------------------------------------------- the scheduler

class Job:
  """One prompt's generation: the scheduler pushes its events, the HTTP side reads them."""

  def __init__(self, ids: list, settings: Settings, loop):
    self.ids, self.settings, self.loop = ids, settings, loop
    self.events: asyncio.Queue = asyncio.Queue()
    self.cancelled = threading.Event()
    self.produced = 0
    self.submitted = time.perf_counter()

  def emit(self, kind: str, value: Any = None) -> None:
    self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))


class QueueFull(Exception):
  pass


class Scheduler:
  """Drives the engine in one thread: admits queued jobs into free slots (prefill +
  insert), steps every slot, hands out tokens, frees the slots of finished or
  abandoned jobs (within one step)."""

  def __init__(self, engine: Engine, eos_id: Optional[int], max_queue: int):
    self.engine, self.eos_id, self.max_queue = engine, eos_id, max_queue
    self.pending: collections.deque = collections.deque()
    self.wake = threading.Condition()
    self.stopping = False
    self.stats = collections.Counter()
    self.ttft_sum = 0.0
    self.thread = threading.Thread(target=self._run, name="engine", daemon=True)

  def start(self) -> None:
    self.thread.start()

  def submit(self, jobs: list) -> None:
    with self.wake:
      if self.stopping:
        raise ApiError(503, "the server is shutting down", kind="server_error")
      if len(self.pending) + len(jobs) > self.max_queue:
        raise QueueFull()
      self.pending.extend(jobs)
      self.stats["requests_total"] += len(jobs)
      self.wake.notify()

  def depth(self) -> int:
    return len(self.pending)

  def stop(self, timeout: float) -> None:
    """Take no new jobs; finish those in flight and queued (at most `timeout` s)."""
    with self.wake:
      self.stopping = True
      self.wake.notify()
    self.thread.join(timeout)

  def _finish(self, row: Optional[int], job: Job, reason: str) -> None:
    if row is not None:
      self.engine.release(row)
    job.emit("done", reason)

  def _emit_token(self, row: Optional[int], job: Job, out) -> bool:
    """Hand a token to its job; True when the job is finished (its slot freed)."""
    job.produced += 1
    if job.produced == 1:
      self.ttft_sum += time.perf_counter() - job.submitted
      self.stats["first_tokens"] += 1
    if self.eos_id is not None and out.token == self.eos_id:
      self._finish(row, job, "stop")
      return True
    self.stats["tokens_total"] += 1
    job.emit("token", out)
    if job.produced >= job.settings.max_tokens:
      self._finish(row, job, "length")
      return True
    return False

  def _admit(self) -> None:
    while self.pending and self.engine.active() < self.engine.max_batch:
      with self.wake:
        job = self.pending.popleft()
      if job.cancelled.is_set():
        job.emit("done", "cancelled")
        continue
      s = job.settings
      try:
        pre, scores = self.engine.prefill(job.ids, control_flow=s.prompt_cf,
                                          max_tokens=s.max_tokens, echo=s.echo)
        if scores is not None:
          job.emit("prompt", scores)
        row, first = self.engine.insert(job, pre, s.max_tokens, control_flow=s.gen_cf,
                                        sampling=s.sampling, logprobs=s.logprobs is not None)
      except Exception as e:  # noqa: BLE001 - a bad request must not stop the server
        job.emit("error", str(e))
        continue
      self._emit_token(row, job, first)

  def _run(self) -> None:
    while True:
      with self.wake:
        while not self.pending and not self.engine.active() and not self.stopping:
          self.wake.wait(0.5)
        if self.stopping and not self.pending and not self.engine.active():
          return
      for row, job in enumerate(list(self.engine.rows)):
        if job is not None and job.cancelled.is_set():
          self._finish(row, job, "cancelled")
      self._admit()
      if self.engine.active():
        for row, job, out in self.engine.step():
          self._emit_token(row, job, out)


# ----------------------------------------------------------------------- the server

class Server:
  """The model, its tokenizer and engine, and what the routes need to answer."""

  def __init__(self, cfg, params, tokenizer, *, name: str, max_batch: int = 8,
               max_len: Optional[int] = None, max_queue: int = 64,
               api_key: Optional[str] = None, completion_control_flow: int = CF_RECURRENT,
               chat_control_flow: int = CF_PLAIN, add_bos: bool = False):
    self.cfg, self.name, self.api_key = cfg, name, api_key
    self.tok = tokenizer if isinstance(tokenizer, TokenizerView) else TokenizerView(
        tokenizer, name)
    self.engine = Engine(cfg, params, max_batch=max_batch, max_len=max_len)
    self.scheduler = Scheduler(self.engine, self.tok.eos_id, max_queue)
    self.completion_control_flow = completion_control_flow
    self.chat_control_flow = chat_control_flow
    self.add_bos = add_bos
    self.created = int(time.time())
    self.ready = False
    self.late_compiles = 0

  def warmup(self, prompt_lengths=(1,)) -> None:
    """Compile the engine's programs for these prompt lengths' buckets; then ready, and
    any later compile (a bucket not warmed up) is counted and warned about."""
    flows = sorted({self.completion_control_flow, self.chat_control_flow, CF_PLAIN})
    self.engine.warmup(prompt_lengths=prompt_lengths, control_flows=flows,
                       echo=(False, True))
    jax.monitoring.register_event_duration_secs_listener(self._on_compile)
    self.ready = True

  def _on_compile(self, event: str, duration: float, **kwargs) -> None:
    if event == COMPILE_EVENT:
      self.late_compiles += 1
      logging.warning("compiled a program after warm-up (%.1f s; %d so far): a prompt "
                      "bucket not in --warmup_lengths", duration, self.late_compiles)

  def close(self, timeout: float = 30) -> None:
    """Finish the requests in flight and queued (at most `timeout` s), stop counting."""
    self.scheduler.stop(timeout)
    jax.monitoring.unregister_event_duration_listener(self._on_compile)

  def token_text(self, token_id: int) -> str:
    return self.tok.decode([token_id], skip_special_tokens=False)

  def logprob_entries(self, ids, logprobs, tops, n: int, first_none: bool = False) -> dict:
    """OpenAI's completions `logprobs` object for tokens `ids`."""
    tokens = [self.token_text(i) for i in ids]
    offsets, at = [], 0
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


async def _collect(server: Server, job: Job, on_piece=None):
  """Read a job's events: (prompt scores, generated ids, their TokenOuts, text, finish
  reason), calling on_piece(text, out) with each piece of text as it becomes final."""
  ids, outs, scores, sent, reason = [], [], None, "", None
  stops = job.settings.stop
  hold = max((len(s) for s in stops), default=1) - 1
  while True:
    kind, value = await job.events.get()
    if kind == "prompt":
      scores = value
    elif kind == "error":
      raise ApiError(400, value, "prompt")
    elif kind == "done":
      reason = {"cancelled": "stop"}.get(value, value)
      break
    else:
      ids.append(value.token)
      outs.append(value)
      text = server.tok.decode(ids)
      cut = min((text.find(s) for s in stops if s in text), default=-1)
      if cut >= 0:                    # a stop string: end here, free the slot
        job.cancelled.set()
        text, reason = text[:cut], "stop"
      if text.endswith("\ufffd"):     # an incomplete UTF-8 character: wait
        continue
      final = text if cut >= 0 else text[:max(len(sent), len(text) - hold)]
      if on_piece is not None and len(final) > len(sent):
        await on_piece(final[len(sent):], value)
      sent = final
      if cut >= 0:
        break
  text = server.tok.decode(ids)
  cut = min((text.find(s) for s in stops if s in text), default=-1)
  text = text[:cut] if cut >= 0 else text
  if on_piece is not None and len(text) > len(sent):
    await on_piece(text[len(sent):], None)
  return scores, ids, outs, text, reason


def _sse(data: dict) -> str:
  return f"data: {json.dumps(data)}\n\n"


async def _drain(queue: asyncio.Queue, done: asyncio.Future):
  """The queue's chunks as server-sent events, as they come, until `done` (the jobs'
  readers) has finished and the queue is empty."""
  while not (done.done() and queue.empty()):
    getter = asyncio.ensure_future(queue.get())
    await asyncio.wait({getter, done}, return_when=asyncio.FIRST_COMPLETED)
    if getter.done():
      yield _sse(getter.result())
    else:
      getter.cancel()


def create_app(server: Server) -> FastAPI:
  """The FastAPI app of a Server."""
  app = FastAPI(title="t2mlr_jax", docs_url=None, redoc_url=None)

  @app.exception_handler(ApiError)
  async def api_error(request, e: ApiError):
    return e.response()

  @app.middleware("http")
  async def guard(request: Request, call_next):
    if server.api_key and request.url.path != "/health":
      if request.headers.get("authorization", "") != f"Bearer {server.api_key}":
        return ApiError(401, "missing or wrong API key: send Authorization: Bearer KEY",
                        kind="authentication_error").response()
    size = request.headers.get("content-length")
    if size is not None and size.isdigit() and int(size) > MAX_BODY_BYTES:
      return ApiError(413, f"the request body has {size} bytes: allowed at most "
                      f"{MAX_BODY_BYTES}").response()
    return await call_next(request)

  async def body_of(request: Request) -> dict:
    raw = await request.body()
    if len(raw) > MAX_BODY_BYTES:
      raise ApiError(413, f"the request body has {len(raw)} bytes: allowed at most "
                     f"{MAX_BODY_BYTES}")
    try:
      body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
      raise ApiError(400, f"the request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
      raise ApiError(400, "the request body is invalid: allowed a JSON object")
    model = body.get("model", server.name)
    if model != server.name:
      raise ApiError(404, f"model={model!r} does not exist: allowed {server.name!r}",
                     "model", kind="not_found_error")
    return body

  def submit(jobs: list) -> None:
    try:
      server.scheduler.submit(jobs)
    except QueueFull:
      raise ApiError(429, f"the queue is full ({server.scheduler.max_queue} requests): retry "
                     "shortly", kind="rate_limit_error", headers={"Retry-After": "1"}) from None

  def check_lengths(prompts, settings: Settings) -> None:
    for ids in prompts:
      if not ids:
        raise ApiError(400, "the prompt is empty: allowed at least one token", "prompt")
      bad = [t for t in ids if not 0 <= t < server.cfg.vocab_size]
      if bad:
        raise ApiError(400, f"prompt token id {bad[0]} is invalid: allowed 0.."
                       f"{server.cfg.vocab_size - 1}", "prompt")
      if len(ids) + settings.max_tokens > server.engine.max_len:
        raise ApiError(400, f"the prompt's {len(ids)} tokens + max_tokens="
                       f"{settings.max_tokens} exceed the context of "
                       f"{server.engine.max_len} tokens", "max_tokens")

  @app.get("/")
  async def page():
    return HTMLResponse(CHAT_PAGE)

  @app.get("/health")
  async def health():
    if not server.ready:
      return JSONResponse({"status": "warming up"}, status_code=503)
    return {"status": "ok", "model": server.name}

  @app.get("/v1/models")
  async def models():
    return {"object": "list", "data": [{"id": server.name, "object": "model",
                                        "created": server.created, "owned_by": "t2mlr_jax"}]}

  @app.get("/tokenizer_info")
  async def tokenizer_info():
    t = server.tok
    return {"eos_token": t.token_text(t.eos_id), "bos_token": t.token_text(t.bos_id),
            "pad_token": t.token_text(t.pad_id), "chat_template": t.chat_template,
            "model_max_length": server.engine.max_len}

  @app.post("/tokenize")
  async def tokenize(request: Request):
    body = await body_of(request)
    text = _typed(body, "prompt", (str,), None, "a string")
    if text is None:
      raise ApiError(400, "prompt is required: allowed a string", "prompt")
    special = _typed(body, "add_special_tokens", (bool,), False, "true or false")
    ids = server.tok.encode(text, special)
    return {"tokens": ids, "count": len(ids), "max_model_len": server.engine.max_len}

  @app.post("/detokenize")
  async def detokenize(request: Request):
    body = await body_of(request)
    ids = body.get("tokens")
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool)
                                            for t in ids):
      raise ApiError(400, f"tokens={str(ids)[:60]} is invalid: allowed a list of token ids",
                     "tokens")
    return {"prompt": server.tok.decode(ids)}

  @app.post("/v1/completions")
  async def completions(request: Request):
    body = await body_of(request)
    settings = _settings(body, server, chat=False, default_max=16)
    prompts = _prompts(body, server.tok, server.add_bos)
    check_lengths(prompts, settings)
    loop = asyncio.get_running_loop()
    jobs = [Job(ids, settings, loop) for ids in prompts]
    submit(jobs)
    rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
    n = settings.logprobs

    def choice(i, ids, scores, gen, outs, text, reason):
      logprobs = None
      if n is not None:
        gen_part = server.logprob_entries(gen, [o.logprob for o in outs],
                                          [(o.top_ids, o.top_logprobs) for o in outs], n)
        if settings.echo:
          head = server.logprob_entries(
              ids, scores.logprobs, list(zip(scores.top_ids, scores.top_logprobs)), n,
              first_none=True)
          logprobs = {k: head[k] + gen_part[k] for k in ("tokens", "token_logprobs",
                                                         "top_logprobs")}
          shift = sum(len(t) for t in head["tokens"])
          logprobs["text_offset"] = head["text_offset"] + [o + shift for o in
                                                           gen_part["text_offset"]]
        else:
          logprobs = gen_part
      prefix = server.tok.decode(ids) if settings.echo else ""
      return {"text": prefix + text, "index": i, "logprobs": logprobs,
              "finish_reason": reason}

    if settings.stream:
      async def events():
        queue: asyncio.Queue = asyncio.Queue()
        usage = [0, 0]

        async def run(i, job):
          async def piece(text, out):
            await queue.put({"id": rid, "object": "text_completion", "created": created,
                             "model": server.name, "choices": [
                                 {"text": text, "index": i, "logprobs": None,
                                  "finish_reason": None}]})
          try:
            _, gen, _, _, reason = await _collect(server, job, piece)
            usage[0] += len(job.ids)
            usage[1] += len(gen)
            await queue.put({"id": rid, "object": "text_completion", "created": created,
                             "model": server.name, "choices": [
                                 {"text": "", "index": i, "logprobs": None,
                                  "finish_reason": reason}]})
          except ApiError as e:
            await queue.put({"error": {"message": e.message, "type": e.kind}})
        tasks = [asyncio.create_task(run(i, job)) for i, job in enumerate(jobs)]
        try:
          async for event in _drain(queue, asyncio.gather(*tasks)):
            yield event
          if settings.include_usage:
            yield _sse({"id": rid, "object": "text_completion", "created": created,
                        "model": server.name, "choices": [], "usage": {
                            "prompt_tokens": usage[0], "completion_tokens": usage[1],
                            "total_tokens": sum(usage)}})
          yield "data: [DONE]\n\n"
        finally:                          # the client left: free the slots
          for job in jobs:
            job.cancelled.set()
          for t in tasks:
            t.cancel()
      return StreamingResponse(events(), media_type="text/event-stream")

    try:
      results = await asyncio.gather(*(_collect(server, job) for job in jobs))
    finally:
      for job in jobs:
        job.cancelled.set()
    choices, usage = [], {"prompt_tokens": 0, "completion_tokens": 0}
    for i, ((scores, gen, outs, text, reason), ids) in enumerate(zip(results, prompts)):
      choices.append(choice(i, ids, scores, gen, outs, text, reason))
      usage["prompt_tokens"] += len(ids)
      usage["completion_tokens"] += len(gen)
    usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
    return {"id": rid, "object": "text_completion", "created": created,
            "model": server.name, "choices": choices, "usage": usage}

  @app.post("/v1/chat/completions")
  async def chat_completions(request: Request):
    body = await body_of(request)
    settings = _settings(body, server, chat=True, default_max=None)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and
        isinstance(m.get("content"), str) for m in messages):
      raise ApiError(400, "messages is invalid: allowed a non-empty list of {role, content} "
                     "objects with string content", "messages")
    if not server.tok.chat_template:
      raise ApiError(400, f"model {server.name!r} has no chat template: use /v1/completions",
                     "messages")
    try:
      text = server.tok.tok.apply_chat_template(
          [{"role": m["role"], "content": m["content"]} for m in messages])
    except Exception as e:  # noqa: BLE001 - the template's own message
      raise ApiError(400, f"the chat template refused the messages: {e}", "messages") \
          from None
    ids = server.tok.encode(text, False)
    if settings.max_tokens is None:               # as OpenAI: what the context has room for
      settings.max_tokens = max(server.engine.max_len - len(ids), 1)
    check_lengths([ids], settings)
    job = Job(ids, settings, asyncio.get_running_loop())
    submit([job])
    rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())

    def chunk(delta, reason=None):
      return {"id": rid, "object": "chat.completion.chunk", "created": created,
              "model": server.name, "choices": [{"index": 0, "delta": delta,
                                                 "logprobs": None, "finish_reason": reason}]}

    if settings.stream:
      async def events():
        queue: asyncio.Queue = asyncio.Queue()

        async def piece(text, out):
          await queue.put(chunk({"content": text}))
        task = asyncio.ensure_future(_collect(server, job, piece))
        try:
          yield _sse(chunk({"role": "assistant", "content": ""}))
          async for event in _drain(queue, task):
            yield event
          try:
            gen, reason = task.result()[1], task.result()[4]
          except ApiError as e:
            yield _sse({"error": {"message": e.message, "type": e.kind}})
            return
          yield _sse(chunk({}, reason))
          if settings.include_usage:
            yield _sse({**chunk({}), "choices": [], "usage": {
                "prompt_tokens": len(ids), "completion_tokens": len(gen),
                "total_tokens": len(ids) + len(gen)}})
          yield "data: [DONE]\n\n"
        finally:
          job.cancelled.set()
          task.cancel()
      return StreamingResponse(events(), media_type="text/event-stream")

    try:
      _, gen, outs, text, reason = await _collect(server, job)
    finally:
      job.cancelled.set()
    logprobs = None
    if settings.logprobs is not None:
      n = settings.logprobs
      logprobs = {"content": [
          {"token": server.token_text(t), "logprob": o.logprob,
           "top_logprobs": [{"token": server.token_text(int(i)), "logprob": float(lp)}
                            for i, lp in zip(o.top_ids[:n], o.top_logprobs[:n])]}
          for t, o in zip(gen, outs)]}
    return {"id": rid, "object": "chat.completion", "created": created, "model": server.name,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "logprobs": logprobs, "finish_reason": reason}],
            "usage": {"prompt_tokens": len(ids), "completion_tokens": len(gen),
                      "total_tokens": len(ids) + len(gen)}}

  @app.get("/metrics")
  async def metrics():
    s = server.scheduler
    first = max(s.stats["first_tokens"], 1)
    lines = ["# TYPE t2mlr_requests_total counter",
             f"t2mlr_requests_total {s.stats['requests_total']}",
             "# TYPE t2mlr_generated_tokens_total counter",
             f"t2mlr_generated_tokens_total {s.stats['tokens_total']}",
             "# TYPE t2mlr_queue_depth gauge", f"t2mlr_queue_depth {s.depth()}",
             "# TYPE t2mlr_active_slots gauge", f"t2mlr_active_slots {server.engine.active()}",
             "# TYPE t2mlr_compiles_after_warmup_total counter",
             f"t2mlr_compiles_after_warmup_total {server.late_compiles}",
             "# TYPE t2mlr_time_to_first_token_seconds_mean gauge",
             f"t2mlr_time_to_first_token_seconds_mean {s.ttft_sum / first:.6f}"]
    return PlainTextResponse("\n".join(lines) + "\n")

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


def serve_model(model: str, *, step: Optional[int] = None, tokenizer: Optional[str] = None,
                dtype: str = "float32", host: str = "127.0.0.1", port: int = 8000,
                max_batch: int = 8, max_len: Optional[int] = None, max_queue: int = 64,
                api_key: Optional[str] = None, name: Optional[str] = None,
                prompt_control_flow: Optional[int] = None,
                warmup_lengths: tuple[int, ...] = (16, 128)) -> None:
  """Load `model` (any source `loading` opens), compile the engine's programs, and serve
  it in the foreground until SIGTERM or Ctrl-C, finishing the requests in flight."""
  cfg, params, found = load_model_and_tokenizer(model, step, tokenizer, dtype=dtype,
                                                field="--model")
  served = name or model.rstrip("/").split("/")[-1]
  server = Server(cfg, params, found.tokenizer, name=served, max_batch=max_batch,
                  max_len=max_len, max_queue=max_queue, api_key=api_key,
                  completion_control_flow=prompt_control_flow or CF_RECURRENT,
                  chat_control_flow=prompt_control_flow or CF_PLAIN,
                  add_bos=found.documents_start_with_bos)
  warning = exposure_warning(host, api_key)
  if warning:
    print(warning, flush=True)
  print(f"compiling the engine's programs for {served} (max_batch {max_batch}, "
        f"max_len {server.engine.max_len}) ...", flush=True)
  start = time.perf_counter()
  server.warmup(warmup_lengths)
  print(f"compiled in {time.perf_counter() - start:.0f} s", flush=True)
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
