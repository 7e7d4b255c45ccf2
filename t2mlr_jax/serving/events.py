"""A job's events read into its answer (`collect`), the answers' log-probabilities in
OpenAI's shapes, and streamed answers as server-sent events: every sample's chunks as they
come, tagged by index, with their tokens' log-probabilities (and the prompt's, with echo,
in the first). A client that leaves mid-stream frees the slots and is logged in one line."""

from __future__ import annotations

import asyncio
import json
from typing import NamedTuple, Optional

from absl import logging

from t2mlr_jax.serving.scheduler import Job
from t2mlr_jax.serving.schemas import ApiError

DONE = "data: [DONE]\n\n"


class Result(NamedTuple):
  """A job's answer: the prompt's scores (echo), the generated tokens (the end of
  sequence included: it counts and has its log-probability, not its text), their
  TokenOuts, the text and the finish reason."""
  scores: object
  tokens: list
  outs: list
  text: str
  reason: Optional[str]


async def collect(server, job: Job, on_token=None, on_prompt=None) -> Result:
  """Read a job's events into its Result, calling on_prompt(scores) when the prompt's come
  and on_token(text, out) for each token with the text that became final with it ("" while
  a stop string or a character is incomplete; out None: the rest, at the end)."""
  tokens, outs, text_ids, scores, sent, reason = [], [], [], None, "", None
  stops = job.settings.stop
  hold = max((len(s) for s in stops), default=1) - 1
  while True:
    event, value = await job.events.get()
    if event == "prompt":
      scores = value
      if on_prompt is not None:
        await on_prompt(value)
      continue
    if event == "error":
      raise ApiError(400, value, "prompt")
    if event == "done":
      reason = {"cancelled": "stop"}.get(value, value)
      break
    tokens.append(value.token)
    outs.append(value)
    if event == "eos":
      if on_token is not None:
        await on_token("", value)
      continue
    text_ids.append(value.token)
    text = server.tok.decode(text_ids)
    cut = min((text.find(s) for s in stops if s in text), default=-1)
    if cut >= 0:                    # a stop string: end here, free the slot
      job.cancelled.set()
      text, reason = text[:cut], "stop"
    final = sent if text.endswith("\ufffd") else (    # an incomplete UTF-8 character: wait
        text if cut >= 0 else text[:max(len(sent), len(text) - hold)])
    if on_token is not None:
      await on_token(final[len(sent):], value)
    sent = final
    if cut >= 0:
      break
  text = _cut(server.tok.decode(text_ids), stops)
  if on_token is not None and len(text) > len(sent):
    await on_token(text[len(sent):], None)
  return Result(scores, tokens, outs, text, reason)


def _cut(text: str, stops) -> str:
  cut = min((text.find(s) for s in stops if s in text), default=-1)
  return text[:cut] if cut >= 0 else text


# ----------------------------------------------------------------------- log-probabilities

def prompt_logprobs(server, n: int, ids, scores) -> dict:
  """The completions `logprobs` object of an echoed prompt: the first token's None."""
  return server.logprob_entries(ids, scores.logprobs,
                                list(zip(scores.top_ids, scores.top_logprobs)), n,
                                first_none=True)


def token_logprobs(server, n: int, tokens, outs, at: int = 0) -> dict:
  """The completions `logprobs` object of generated tokens, text offsets from `at`."""
  return server.logprob_entries(tokens, [o.logprob for o in outs],
                                [(o.top_ids, o.top_logprobs) for o in outs], n, at=at)


def end_of(logprobs: dict, at: int) -> int:
  """The text offset after a `logprobs` object (`at` when it has no tokens)."""
  if not logprobs["tokens"]:
    return at
  return logprobs["text_offset"][-1] + len(logprobs["tokens"][-1])


def joined(head: dict, tail: dict) -> dict:
  return {k: head[k] + tail[k] for k in head}


def chat_logprobs(server, n: int, tokens, outs) -> dict:
  """Chat's `logprobs` object: {"content": [{token, logprob, bytes, top_logprobs}]}."""
  def entry(token_id, logprob):
    text = server.token_text(int(token_id))
    return {"token": text, "logprob": float(logprob), "bytes": list(text.encode())}
  return {"content": [
      {**entry(t, o.logprob), "top_logprobs": [entry(i, lp) for i, lp in zip(
          o.top_ids[:n], o.top_logprobs[:n])]} for t, o in zip(tokens, outs)]}


# ----------------------------------------------------------------------- server-sent events

def sse(data: dict) -> str:
  return f"data: {json.dumps(data)}\n\n"


async def _drain(queue: asyncio.Queue, done: asyncio.Future):
  """The queue's chunks as server-sent events, as they come, until `done` (the jobs'
  readers) has finished and the queue is empty."""
  while not (done.done() and queue.empty()):
    getter = asyncio.ensure_future(queue.get())
    try:
      await asyncio.wait({getter, done}, return_when=asyncio.FIRST_COMPLETED)
    finally:
      if not getter.done():
        getter.cancel()
    if not getter.cancelled():
      yield sse(getter.result())


async def stream(jobs: list, run_one, tail, rid: str):
  """Server-sent events of `jobs`: run_one(i, job, put) puts job i's chunks as they come,
  tail() gives the chunks after every job's (usage), then [DONE]. A client that leaves
  frees the slots (within a step) and is logged in one INFO line."""
  queue: asyncio.Queue = asyncio.Queue()

  async def guarded(i, job):
    try:
      await run_one(i, job, queue.put)
    except ApiError as e:
      await queue.put(e.body())
  tasks = [asyncio.create_task(guarded(i, job)) for i, job in enumerate(jobs)]
  done = asyncio.gather(*tasks, return_exceptions=True)   # a cancelled reader: no error
  try:
    async for event in _drain(queue, done):
      yield event
    for r in done.result():
      if isinstance(r, BaseException):
        raise r
    for data in tail():
      yield sse(data)
    yield DONE
  except (asyncio.CancelledError, GeneratorExit):
    logging.info("%s: the client left mid-stream; its %d slot(s) freed", rid, len(jobs))
    raise
  finally:
    for job in jobs:
      job.cancelled.set()
    for t in tasks:
      t.cancel()


def completion_stream(server, jobs: list, rid: str, created: int, prompt_tokens: int):
  """The completions' chunks (one choice index a job) as server-sent events."""
  settings = jobs[0].settings
  n, generated = settings.logprobs, [0]

  def chunk(i, text, logprobs=None, reason=None):
    return {"id": rid, "object": "text_completion", "created": created, "model": server.name,
            "choices": [{"text": text, "index": i, "logprobs": logprobs,
                         "finish_reason": reason}]}

  async def run_one(i, job, put):
    at = 0

    async def on_prompt(scores):
      nonlocal at
      head = None if n is None else prompt_logprobs(server, n, job.ids, scores)
      at = 0 if head is None else end_of(head, 0)
      await put(chunk(i, server.tok.decode(job.ids), head))

    async def on_token(text, out):
      nonlocal at
      lp = None
      if n is not None:
        lp = token_logprobs(server, n, [] if out is None else [out.token],
                            [] if out is None else [out], at)
        at = end_of(lp, at)
      if text or (lp is not None and out is not None):
        await put(chunk(i, text, lp))
    result = await collect(server, job, on_token, on_prompt if settings.echo else None)
    generated[0] += len(result.tokens)
    await put(chunk(i, "", None, result.reason))

  def tail():
    if not settings.include_usage:
      return []
    return [{**chunk(0, ""), "choices": [], "usage": usage(prompt_tokens, generated[0])}]
  return stream(jobs, run_one, tail, rid)


def chat_stream(server, jobs: list, rid: str, created: int, prompt_tokens: int):
  """The chat completion's chunks (one choice index a job) as server-sent events: each
  choice's role first, then its content as it comes, then its finish reason."""
  settings = jobs[0].settings
  n, generated = settings.logprobs, [0]

  def chunk(i, delta, logprobs=None, reason=None):
    return {"id": rid, "object": "chat.completion.chunk", "created": created,
            "model": server.name, "choices": [{"index": i, "delta": delta,
                                               "logprobs": logprobs, "finish_reason": reason}]}

  async def run_one(i, job, put):
    await put(chunk(i, {"role": "assistant", "content": ""}))

    async def on_token(text, out):
      lp = None if n is None or out is None else chat_logprobs(server, n, [out.token], [out])
      if text or lp is not None:
        await put(chunk(i, {"content": text}, lp))
    result = await collect(server, job, on_token)
    generated[0] += len(result.tokens)
    await put(chunk(i, {}, None, result.reason))

  def tail():
    if not settings.include_usage:
      return []
    return [{**chunk(0, {}), "choices": [], "usage": usage(prompt_tokens, generated[0])}]
  return stream(jobs, run_one, tail, rid)


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
  return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
          "total_tokens": prompt_tokens + completion_tokens}
