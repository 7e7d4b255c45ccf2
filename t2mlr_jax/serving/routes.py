"""The server's routes (an APIRouter): each handler reads the Server from
`request.app.state.server`, reads the body and checks it as its pydantic model
(schemas.py: a 400 in OpenAI's shape, not FastAPI's 422; the model documents the body in
/openapi.json), hands its jobs (one a sample: n a prompt) to the scheduler and answers in
OpenAI's shape, as one JSON body or as server-sent events (events.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import time
import uuid

from t2mlr_jax.serving import events
from t2mlr_jax.serving.scheduler import Job, QueueFull
from t2mlr_jax.serving.schemas import (
  MAX_BODY_BYTES,
  ApiError,
  ChatRequest,
  CompletionRequest,
  DetokenizeRequest,
  Settings,
  TokenizeRequest,
  model_not_found,
  openapi_body,
  parsed,
  prompts_of,
  sample_seeds,
  settings_of,
)

try:        # the optional extra `serve` (pip install -e ".[serve]")
  from fastapi import APIRouter, Request
  from fastapi.exceptions import RequestValidationError
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


async def validation_error(request: Request, e: RequestValidationError) -> JSONResponse:
  """FastAPI's own validation errors (its 422) as OpenAI's 400 naming the field."""
  err = (e.errors() or [{}])[0]
  loc = [str(p) for p in err.get("loc", ()) if p not in ("body", "query", "path")]
  param = loc[0] if loc else None
  return ApiError(400, f"{'.'.join(loc) or 'the request'} is invalid: "
                  f"{err.get('msg', 'see the API')}", param).response()


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
  model = body.get("model")
  if model is not None and model != server.name:      # none: the served one (as vLLM)
    raise model_not_found(model, server.name)
  return body


async def request_of(request: Request, server, model):
  """The body as a checked `model` (schemas.py); 413/400/404 as body_of, 400 naming the
  first invalid field."""
  return parsed(model, await body_of(request, server), server.engine.max_len,
                server.engine.max_batch)


def submit(server, jobs: list) -> None:
  """Queue the jobs; 429 with Retry-After when the queue is full."""
  try:
    server.scheduler.submit(jobs)
  except QueueFull:
    raise ApiError(429, f"the queue is full ({server.scheduler.max_queue} requests): retry "
                   "shortly", error_type="rate_limit_error", headers={"Retry-After": "1"}) from None


def check_lengths(server, prompts, settings: Settings, param: str = "prompt") -> None:
  """Each prompt non-empty, its ids in the vocabulary, shorter than the context (a 400
  naming `param`: prompt, or messages), and it + max_tokens in the context."""
  limit = server.engine.max_len
  what = "the prompt" if param == "prompt" else "the messages (through the chat template)"
  for ids in prompts:
    if not ids:
      raise ApiError(400, "the prompt is empty: allowed at least one token", param)
    bad = [t for t in ids if not 0 <= t < server.cfg.vocab_size]
    if bad:
      raise ApiError(400, f"prompt token id {bad[0]} is invalid: allowed 0.."
                     f"{server.cfg.vocab_size - 1}", param)
    if len(ids) >= limit:
      raise ApiError(400, f"{what} has {len(ids)} tokens: allowed at most {limit - 1} (the "
                     f"context of {limit} tokens, --max_len, holds the prompt and at least "
                     "one generated token)", param)
    if len(ids) + settings.max_tokens > limit:
      raise ApiError(400, f"{what} has {len(ids)} tokens + max_tokens={settings.max_tokens}: "
                     f"more than the context of {limit} tokens: allowed max_tokens <= "
                     f"{limit - len(ids)}", "max_tokens")


def jobs_of(prompts, settings: Settings, loop) -> list:
  """n jobs a prompt (prompt-major: OpenAI's choice indexes), each sample its own seed
  (and, in the engine, its own slot and recurrent state)."""
  seeds = sample_seeds(settings.sampling.seed, settings.n)
  return [Job(ids, dataclasses.replace(settings, sampling=dataclasses.replace(
      settings.sampling, seed=seed)), loop) for ids in prompts for seed in seeds]


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
    raise model_not_found(model_id, server.name)
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
  jobs = jobs_of(prompts, settings, asyncio.get_running_loop())
  submit(server, jobs)
  rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
  prompt_tokens = sum(len(ids) for ids in prompts)
  if settings.stream:
    return StreamingResponse(events.completion_stream(server, jobs, rid, created,
                                                      prompt_tokens),
                             media_type="text/event-stream")
  results = await _gathered(server, jobs)
  choices = [_completion_choice(server, settings, i, job.ids, result)
             for i, (job, result) in enumerate(zip(jobs, results))]
  return {"id": rid, "object": "text_completion", "created": created,
          "model": server.name, "choices": choices,
          "usage": events.usage(prompt_tokens, sum(len(r.tokens) for r in results))}


async def _gathered(server, jobs: list) -> list:
  """Every job's Result; the jobs' slots freed however it ends."""
  try:
    return await asyncio.gather(*(events.collect(server, job) for job in jobs))
  finally:
    for job in jobs:
      job.cancelled.set()


def _completion_choice(server, settings: Settings, i: int, ids, result) -> dict:
  """One sample's choice: its text (after the prompt with echo) and `logprobs` object."""
  n, logprobs = settings.logprobs, None
  if n is not None:
    head = events.prompt_logprobs(server, n, ids, result.scores) if settings.echo else None
    at = 0 if head is None else events.end_of(head, 0)
    logprobs = events.token_logprobs(server, n, result.tokens, result.outs, at)
    logprobs = logprobs if head is None else events.joined(head, logprobs)
  prefix = server.tok.decode(ids) if settings.echo else ""
  return {"text": prefix + result.text, "index": i, "logprobs": logprobs,
          "finish_reason": result.reason}


# ----------------------------------------------------------------------- chat completions

@router.post("/v1/chat/completions", openapi_extra=openapi_body(ChatRequest))
async def chat_completions(request: Request):
  server = request.app.state.server
  req = await request_of(request, server, ChatRequest)
  settings = settings_of(req, server)
  ids = _chat_prompt(server, req.messages)
  if settings.max_tokens is None:               # as OpenAI: what the context has room for
    settings.max_tokens = max(server.engine.max_len - len(ids), 1)
  check_lengths(server, [ids], settings, "messages")
  jobs = jobs_of([ids], settings, asyncio.get_running_loop())
  submit(server, jobs)
  rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
  if settings.stream:
    return StreamingResponse(events.chat_stream(server, jobs, rid, created, len(ids)),
                             media_type="text/event-stream")
  results = await _gathered(server, jobs)
  n = settings.logprobs
  choices = [{"index": i, "message": {"role": "assistant", "content": r.text},
              "logprobs": None if n is None else events.chat_logprobs(server, n, r.tokens,
                                                                      r.outs),
              "finish_reason": r.reason} for i, r in enumerate(results)]
  return {"id": rid, "object": "chat.completion", "created": created, "model": server.name,
          "choices": choices,
          "usage": events.usage(len(ids), sum(len(r.tokens) for r in results))}


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
