"""The server's routes (an APIRouter): each handler reads the Server from
`request.app.state.server`, reads the body and checks it as its pydantic model
(schemas.py: a 400 in OpenAI's shape, not FastAPI's 422; the model documents the body in
/openapi.json), hands its jobs to the scheduler and answers in OpenAI's shape, as one
JSON body or as server-sent events."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import time
import uuid

from t2mlr_jax.serving.scheduler import Job, QueueFull
from t2mlr_jax.serving.schemas import (
  MAX_BODY_BYTES,
  ApiError,
  ChatRequest,
  CompletionRequest,
  DetokenizeRequest,
  Settings,
  TokenizeRequest,
  openapi_body,
  parsed,
  prompts_of,
  settings_of,
)

try:        # the optional extra `serve` (pip install -e ".[serve]")
  from fastapi import APIRouter, Request
  from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, StreamingResponse
  from starlette.exceptions import HTTPException as StarletteHTTPException
except ImportError as e:      # pragma: no cover - the message is the point
  raise ImportError(f"{e}: the server needs FastAPI and uvicorn: pip install -e \".[serve]\"") \
      from None

# the chat page: one static file, no build step, nothing fetched from elsewhere
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "chat_page.html"),
          encoding="utf-8") as _page:
  CHAT_PAGE = _page.read()

router = APIRouter()


# ----------------------------------------------------------------------- app-wide

async def api_error(request: Request, e: ApiError) -> JSONResponse:
  """The exception handler: an ApiError answered in OpenAI's shape."""
  return e.response()


HTTP_ERROR_TYPES = {404: "not_found_error", 405: "invalid_request_error"}


async def http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
  """FastAPI's own errors (an unknown path: 404, a wrong method: 405) in OpenAI's shape
  instead of {"detail": ...}."""
  what = {404: f"{request.method} {request.url.path} does not exist: see /v1/models, "
               "/v1/completions, /v1/chat/completions",
          405: f"{request.method} is not allowed on {request.url.path}"}.get(
              e.status_code, str(e.detail))
  return ApiError(e.status_code, what, None, HTTP_ERROR_TYPES.get(
      e.status_code, "invalid_request_error"), dict(e.headers or {})).response()


async def guard(request: Request, call_next):
  """The middleware: the API key (all but /health) and the body's declared size."""
  server = request.app.state.server
  if server.api_key and request.url.path != "/health":
    if request.headers.get("authorization", "") != f"Bearer {server.api_key}":
      return ApiError(401, "missing or wrong API key: send Authorization: Bearer KEY",
                      error_type="authentication_error").response()
  size = request.headers.get("content-length")
  if size is not None and size.isdigit() and int(size) > MAX_BODY_BYTES:
    return ApiError(413, f"the request body has {size} bytes: allowed at most "
                    f"{MAX_BODY_BYTES}").response()
  return await call_next(request)


# ----------------------------------------------------------------------- request helpers

async def body_of(request: Request, server) -> dict:
  """The body as a JSON object naming this server's model (or none); 413/400/404 else."""
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
                   "model", error_type="not_found_error")
  return body


async def request_of(request: Request, server, model):
  """The body as a checked `model` (schemas.py); 413/400/404 as body_of, 400 naming the
  first invalid field."""
  return parsed(model, await body_of(request, server), server.engine.max_len)


def submit(server, jobs: list) -> None:
  """Queue the jobs; 429 with Retry-After when the queue is full."""
  try:
    server.scheduler.submit(jobs)
  except QueueFull:
    raise ApiError(429, f"the queue is full ({server.scheduler.max_queue} requests): retry "
                   "shortly", error_type="rate_limit_error", headers={"Retry-After": "1"}) from None


def check_lengths(server, prompts, settings: Settings) -> None:
  """Each prompt non-empty, its ids in the vocabulary, and it + max_tokens in the context."""
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


# ----------------------------------------------------------------------- job events

async def _collect(server, job: Job, on_piece=None):
  """Read a job's events: (prompt scores, generated ids, their TokenOuts, text, finish
  reason), calling on_piece(text, out) with each piece of text as it becomes final."""
  ids, outs, scores, sent, reason = [], [], None, "", None
  stops = job.settings.stop
  hold = max((len(s) for s in stops), default=1) - 1
  while True:
    event, value = await job.events.get()
    if event == "prompt":
      scores = value
    elif event == "error":
      raise ApiError(400, value, "prompt")
    elif event == "done":
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



# ----------------------------------------------------------------------- small routes

@router.get("/")
async def page():
  return HTMLResponse(CHAT_PAGE)


@router.get("/health")
async def health(request: Request):
  server = request.app.state.server
  if not server.ready:
    return JSONResponse({"status": "warming up"}, status_code=503)
  return {"status": "ok", "model": server.name}


def _model_card(server) -> dict:
  return {"id": server.name, "object": "model", "created": server.created,
          "owned_by": "t2mlr_jax"}


@router.get("/v1/models")
async def models(request: Request):
  return {"object": "list", "data": [_model_card(request.app.state.server)]}


@router.get("/v1/models/{model_id:path}")
async def model(request: Request, model_id: str):
  """One model's card, as OpenAI's GET /v1/models/{model}; 404 naming the served one."""
  server = request.app.state.server
  if model_id != server.name:
    raise ApiError(404, f"model={model_id!r} does not exist: allowed {server.name!r}",
                   "model", error_type="not_found_error")
  return _model_card(server)


@router.get("/tokenizer_info")
async def tokenizer_info(request: Request):
  server = request.app.state.server
  t = server.tok
  return {"eos_token": t.token_text(t.eos_id), "bos_token": t.token_text(t.bos_id),
          "pad_token": t.token_text(t.pad_id), "chat_template": t.chat_template,
          "model_max_length": server.engine.max_len}


@router.post("/tokenize", openapi_extra=openapi_body(TokenizeRequest))
async def tokenize(request: Request):
  server = request.app.state.server
  req = await request_of(request, server, TokenizeRequest)
  ids = server.tok.encode(req.prompt, req.add_special_tokens)
  return {"tokens": ids, "count": len(ids), "max_model_len": server.engine.max_len}


@router.post("/detokenize", openapi_extra=openapi_body(DetokenizeRequest))
async def detokenize(request: Request):
  server = request.app.state.server
  req = await request_of(request, server, DetokenizeRequest)
  return {"prompt": server.tok.decode(req.tokens)}


@router.get("/metrics")
async def metrics(request: Request):
  server = request.app.state.server
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


# ----------------------------------------------------------------------- completions

@router.post("/v1/completions", openapi_extra=openapi_body(CompletionRequest))
async def completions(request: Request):
  server = request.app.state.server
  req = await request_of(request, server, CompletionRequest)
  settings = settings_of(req, server)
  prompts = prompts_of(req.prompt, server.tok, server.add_bos)
  check_lengths(server, prompts, settings)
  loop = asyncio.get_running_loop()
  jobs = [Job(ids, settings, loop) for ids in prompts]
  submit(server, jobs)
  rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
  if settings.stream:
    return StreamingResponse(_completion_events(server, jobs, rid, created),
                             media_type="text/event-stream")
  try:
    results = await asyncio.gather(*(_collect(server, job) for job in jobs))
  finally:
    for job in jobs:
      job.cancelled.set()
  choices, usage = [], {"prompt_tokens": 0, "completion_tokens": 0}
  for i, ((scores, gen, outs, text, reason), ids) in enumerate(zip(results, prompts)):
    choices.append(_completion_choice(server, settings, i, ids, scores, gen, outs, text,
                                      reason))
    usage["prompt_tokens"] += len(ids)
    usage["completion_tokens"] += len(gen)
  usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
  return {"id": rid, "object": "text_completion", "created": created,
          "model": server.name, "choices": choices, "usage": usage}


def _completion_choice(server, settings: Settings, i, ids, scores, gen, outs, text,
                       reason) -> dict:
  """One prompt's choice: its text (after the prompt with echo) and `logprobs` object."""
  n = settings.logprobs
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


async def _completion_events(server, jobs: list, rid: str, created: int):
  """The completions' chunks as server-sent events, every prompt's as they come; the
  client leaving frees the slots."""
  queue: asyncio.Queue = asyncio.Queue()
  usage = [0, 0]

  def chunk(i, text, reason=None):
    return {"id": rid, "object": "text_completion", "created": created,
            "model": server.name, "choices": [
                {"text": text, "index": i, "logprobs": None, "finish_reason": reason}]}

  async def run(i, job):
    async def piece(text, out):
      await queue.put(chunk(i, text))
    try:
      _, gen, _, _, reason = await _collect(server, job, piece)
      usage[0] += len(job.ids)
      usage[1] += len(gen)
      await queue.put(chunk(i, "", reason))
    except ApiError as e:
      await queue.put({"error": {"message": e.message, "type": e.error_type}})
  tasks = [asyncio.create_task(run(i, job)) for i, job in enumerate(jobs)]
  try:
    async for event in _drain(queue, asyncio.gather(*tasks)):
      yield event
    if jobs[0].settings.include_usage:
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


# ----------------------------------------------------------------------- chat completions

@router.post("/v1/chat/completions", openapi_extra=openapi_body(ChatRequest))
async def chat_completions(request: Request):
  server = request.app.state.server
  req = await request_of(request, server, ChatRequest)
  settings = settings_of(req, server)
  ids = _chat_prompt(server, req.messages)
  if settings.max_tokens is None:               # as OpenAI: what the context has room for
    settings.max_tokens = max(server.engine.max_len - len(ids), 1)
  check_lengths(server, [ids], settings)
  job = Job(ids, settings, asyncio.get_running_loop())
  submit(server, [job])
  rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
  chunk = functools.partial(_chat_chunk, server.name, rid, created)
  if settings.stream:
    return StreamingResponse(_chat_events(server, job, chunk),
                             media_type="text/event-stream")
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


def _chat_prompt(server, messages) -> list[int]:
  """The (checked) messages through the model's chat template, as token ids; 400 naming
  messages."""
  if not server.tok.chat_template:
    raise ApiError(400, f"model {server.name!r} has no chat template: use /v1/completions",
                   "messages")
  try:
    text = server.tok.tok.apply_chat_template(
        [{"role": m.role, "content": m.text} for m in messages])
  except Exception as e:  # noqa: BLE001 - the template's own message
    raise ApiError(400, f"the chat template refused the messages: {e}", "messages") \
        from None
  return server.tok.encode(text, False)


def _chat_chunk(name: str, rid: str, created: int, delta: dict, reason=None) -> dict:
  return {"id": rid, "object": "chat.completion.chunk", "created": created,
          "model": name, "choices": [{"index": 0, "delta": delta,
                                      "logprobs": None, "finish_reason": reason}]}


async def _chat_events(server, job: Job, chunk):
  """The chat completion's chunks as server-sent events; the client leaving frees the
  slot."""
  queue: asyncio.Queue = asyncio.Queue()
  ids, settings = job.ids, job.settings

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
      yield _sse({"error": {"message": e.message, "type": e.error_type}})
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
