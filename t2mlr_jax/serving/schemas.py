"""The server's requests, checked: each field's type and range, a 400 naming the field
otherwise, and errors in OpenAI's JSON shape (server.py, routes.py)."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Optional

from t2mlr_jax.data.tokenizer import TokenizerView
from t2mlr_jax.model.control_flow import CF_PLAIN, CF_RECURRENT
from t2mlr_jax.serving.engine import TOP_LOGPROBS, Sampling

try:        # the optional extra `serve` (pip install -e ".[serve]")
  from fastapi.responses import JSONResponse
except ImportError as e:      # pragma: no cover - the message is the point
  raise ImportError(f"{e}: the server needs FastAPI and uvicorn: pip install -e \".[serve]\"") \
      from None

MAX_BODY_BYTES = 4 * 2**20
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

def typed(body: dict, name: str, kinds, default, allowed: str):
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


def settings_of(body: dict, server, *, chat: bool,
              default_max: Optional[int]) -> Settings:
  """The request's settings; max_tokens None (chat without one): the context's room."""
  max_tokens = typed(body, "max_completion_tokens" if chat and "max_completion_tokens" in body
                      else "max_tokens", (int,), default_max, "an integer >= 1")
  if max_tokens is not None and not 1 <= max_tokens <= server.engine.max_len:
    raise ApiError(400, f"max_tokens={max_tokens} is invalid: allowed 1.."
                   f"{server.engine.max_len} (--max_len)", "max_tokens")
  temperature = float(typed(body, "temperature", (int, float), 1.0, "a number in [0, 2]"))
  if not 0 <= temperature <= 2:
    raise ApiError(400, f"temperature={temperature} is invalid: allowed [0, 2]", "temperature")
  top_p = float(typed(body, "top_p", (int, float), 1.0, "a number in (0, 1]"))
  if not 0 < top_p <= 1:
    raise ApiError(400, f"top_p={top_p} is invalid: allowed (0, 1]", "top_p")
  top_k = typed(body, "top_k", (int,), 0, "an integer >= 0 (0: off)")
  if top_k < 0:
    raise ApiError(400, f"top_k={top_k} is invalid: allowed an integer >= 0", "top_k")
  seed = typed(body, "seed", (int,), None, "an integer")
  seed = int(uuid.uuid4().int % 2**31) if seed is None else seed % 2**31
  stop = typed(body, "stop", (str, list), [], "a string or a list of up to 4 strings")
  stop = [stop] if isinstance(stop, str) else stop
  if len(stop) > 4 or not all(isinstance(s, str) and s for s in stop):
    raise ApiError(400, f"stop={stop!r} is invalid: allowed a string or a list of up to 4 "
                   "non-empty strings", "stop")
  n = typed(body, "n", (int,), 1, "1")
  if n != 1:
    raise ApiError(400, f"n={n} is invalid: allowed 1", "n")
  if chat:
    want = typed(body, "logprobs", (bool,), False, "true or false")
    top = typed(body, "top_logprobs", (int,), 0, f"0..{TOP_LOGPROBS}")
    logprobs = top if want else None
    echo = False
  else:
    logprobs = typed(body, "logprobs", (int,), None, f"an integer 0..{TOP_LOGPROBS}")
    echo = typed(body, "echo", (bool,), False, "true or false")
  if logprobs is not None and not 0 <= logprobs <= TOP_LOGPROBS:
    raise ApiError(400, f"logprobs={logprobs} is invalid: allowed 0..{TOP_LOGPROBS}",
                   "logprobs")
  recurrence = typed(body, "recurrence", (str,), "exact", f"one of {list(RECURRENCE)}")
  if recurrence not in RECURRENCE:
    raise ApiError(400, f"recurrence={recurrence!r} is invalid: allowed one of "
                   f"{list(RECURRENCE)}", "recurrence")
  prompt_cf = CF_PLAIN if recurrence == "off" else (
      server.chat_control_flow if chat else server.completion_control_flow)
  options = typed(body, "stream_options", (dict,), {}, "an object")
  include_usage = options.get("include_usage", False)
  if not isinstance(include_usage, bool):
    raise ApiError(400, f"stream_options.include_usage={include_usage!r} is invalid: allowed "
                   "true or false", "stream_options")
  return Settings(max_tokens, Sampling(temperature, top_k, top_p, seed), stop, echo, logprobs,
                  typed(body, "stream", (bool,), False, "true or false"),
                  RECURRENCE[recurrence], prompt_cf, include_usage)


def prompts_of(body: dict, tok: TokenizerView, add_bos: bool) -> list[list[int]]:
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
