"""The server's request bodies as pydantic models (each field's type, bounds and default;
/openapi.json documents them), a 400 naming the first invalid field with the values it
allows, and errors in OpenAI's JSON shape (server.py, routes.py)."""

from __future__ import annotations

import dataclasses
import typing
import uuid
from typing import Annotated, Literal, Optional, Union

import numpy as np

from t2mlr_jax.data.tokenizer import TokenizerView
from t2mlr_jax.model.control_flow import CF_PLAIN, CF_RECURRENT
from t2mlr_jax.serving.engine import TOP_LOGPROBS, Sampling

try:        # the optional extra `serve` (pip install -e ".[serve]"; pydantic comes with FastAPI)
  from fastapi.responses import JSONResponse
  from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
  )
  from pydantic_core import PydanticCustomError
except ImportError as e:      # pragma: no cover - the message is the point
  raise ImportError(f"{e}: the server needs FastAPI and uvicorn: pip install -e \".[serve]\"") \
      from None

MAX_BODY_BYTES = 4 * 2**20
RECURRENCE = {"exact": CF_RECURRENT, "off": CF_PLAIN}
RANGE_ERRORS = {"greater_than", "greater_than_equal", "less_than", "less_than_equal"}


class ApiError(Exception):
  """An error answered in OpenAI's shape: {"error": {message, type, param, code}}."""

  def __init__(self, status: int, message: str, param: Optional[str] = None,
               error_type: str = "invalid_request_error", headers: Optional[dict] = None,
               code: Optional[str] = None):
    super().__init__(message)
    self.status, self.message, self.param = status, message, param
    self.error_type, self.code = error_type, code
    self.headers = headers or {}

  def body(self) -> dict:
    return {"error": {"message": self.message, "type": self.error_type, "param": self.param,
                      "code": self.code}}

  def response(self) -> JSONResponse:
    return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def model_not_found(model, served: str) -> ApiError:
  """OpenAI's answer to a model it does not serve: 404, code model_not_found."""
  return ApiError(404, f"model={model!r} does not exist: allowed {served!r}", "model",
                  code="model_not_found")


# ----------------------------------------------------------------------- field types

@dataclasses.dataclass(frozen=True)
class Allowed:
  """What a field's 400 says it allows: `text` (for a value of the wrong type; `in_range`
  for one out of the field's bounds), in `message` (`missing` for no value), formatted
  with name, value and cut (str(value)[:60]). It is the field's description in the schema."""
  text: str
  in_range: Optional[str] = None
  message: str = "{name}={value!r} is invalid: allowed {text}"
  missing: str = "{name} is required: allowed {text}"

  def __get_pydantic_json_schema__(self, core_schema, handler):
    schema = handler(core_schema)
    schema.setdefault("description", f"allowed {self.text}")
    return schema


def refuse(message: str, param: str) -> PydanticCustomError:
  """A rule pydantic's own checks don't express, broken: the 400's message and field."""
  return PydanticCustomError("api_error", "{message}", {"message": message, "param": param})


MaxTokens = Annotated[Optional[StrictInt], Field(json_schema_extra={"minimum": 1}),
                      Allowed("an integer >= 1")]
Temperature = Annotated[StrictFloat, Field(ge=0, le=2), Allowed("a number in [0, 2]", "[0, 2]")]
TopP = Annotated[StrictFloat, Field(gt=0, le=1), Allowed("a number in (0, 1]", "(0, 1]")]
TopK = Annotated[StrictInt, Field(ge=0),
                 Allowed("an integer >= 0 (0: off)", "an integer >= 0")]
Seed = Annotated[Optional[StrictInt], Allowed("an integer")]
Stop = Annotated[Union[StrictStr, list], Field(default_factory=list),
                 Allowed("a string or a list of up to 4 strings")]
N = Annotated[StrictInt, Field(ge=1), Allowed("an integer >= 1 (at most --max_batch)",
                                        "an integer >= 1")]
Flag = Annotated[StrictBool, Allowed("true or false")]
Recurrence = Annotated[Literal["exact", "off"], Allowed(f"one of {list(RECURRENCE)}")]
TokenIds = Annotated[list[StrictInt], Field(min_length=1)]
Prompt = Annotated[
    Union[StrictStr, TokenIds,
          Annotated[list[Union[StrictStr, list[StrictInt]]], Field(min_length=1)]],
    Allowed("a string, a list of token ids, or a list of either",
            message="{name}={cut!r} is invalid: allowed {text}")]


class StreamOptions(BaseModel):
  model_config = ConfigDict(extra="ignore")
  include_usage: Flag = False


Options = Annotated[Optional[StreamOptions], Allowed("an object")]


ROLES = ("system", "developer", "user", "assistant", "tool")


class TextPart(BaseModel):
  """One part of a message's content in OpenAI's list form; text is the only kind served."""
  model_config = ConfigDict(extra="ignore")
  type: Literal["text"]
  text: StrictStr


class Message(BaseModel):
  """A chat turn: content a string or a list of text parts; null only on an assistant's."""
  model_config = ConfigDict(extra="ignore")
  role: StrictStr
  content: Optional[Union[StrictStr, list[TextPart]]]

  @field_validator("content", mode="before")
  @classmethod
  def _text_parts_only(cls, content):
    for part in content if isinstance(content, list) else ():
      part_type = part.get("type") if isinstance(part, dict) else None
      if part_type != "text":
        raise refuse(f"messages[].content part type={part_type!r} is not supported: allowed "
                     "'text' (this model reads text only)", "messages")
    return content

  @model_validator(mode="after")
  def _role_and_content(self):
    if self.role not in ROLES:
      raise refuse(f"messages[].role={self.role!r} is invalid: allowed one of {list(ROLES)}",
                   "messages")
    if self.content is None and self.role != "assistant":
      raise refuse(f"messages[].content=None is invalid for role {self.role!r}: allowed a "
                   "string or a list of text parts (null only on an assistant turn)",
                   "messages")
    return self

  @property
  def text(self) -> str:
    """The content as one string (parts joined, as OpenAI concatenates them)."""
    if self.content is None or isinstance(self.content, str):
      return self.content or ""
    return "".join(part.text for part in self.content)


# ----------------------------------------------------------------------- request bodies

class RequestBody(BaseModel):
  """A request body: OpenAI's fields this server does not use are ignored, null is the
  default; fields are checked in their order here, the first invalid one answered."""
  model_config = ConfigDict(extra="ignore")
  model: Optional[str] = Field(None, description="the served model's name (--name)")

  @model_validator(mode="before")
  @classmethod
  def _null_is_the_default(cls, data):
    if not isinstance(data, dict):
      return data
    if "max_completion_tokens" in data and "max_completion_tokens" in cls.model_fields:
      data = {k: v for k, v in data.items() if k != "max_tokens"}    # the newer name wins
    return {k: v for k, v in data.items() if v is not None}

  @field_validator("max_tokens", "max_completion_tokens", check_fields=False)
  @classmethod
  def _within_the_context(cls, value, info: ValidationInfo):
    max_len = (info.context or {}).get("max_len")
    if value is not None and not 1 <= value <= (max_len or value):
      raise refuse(f"max_tokens={value} is invalid: allowed 1..{max_len} (--max_len)",
                   "max_tokens")
    return value

  @field_validator("n", check_fields=False)
  @classmethod
  def _up_to_the_slots(cls, n, info: ValidationInfo):
    max_batch = (info.context or {}).get("max_batch")
    if max_batch is not None and n > max_batch:
      raise refuse(f"n={n} is invalid: allowed 1..{max_batch} (one decode slot a sample: "
                   "--max_batch)", "n")
    return n

  @field_validator("stop", check_fields=False)
  @classmethod
  def _up_to_4_strings(cls, stop):
    stop = [stop] if isinstance(stop, str) else stop
    if len(stop) > 4 or not all(isinstance(s, str) and s for s in stop):
      raise refuse(f"stop={stop!r} is invalid: allowed a string or a list of up to 4 "
                   "non-empty strings", "stop")
    return stop


class CompletionRequest(RequestBody):
  """POST /v1/completions."""
  max_tokens: MaxTokens = 16
  temperature: Temperature = 1.0
  top_p: TopP = 1.0
  top_k: TopK = 0
  seed: Seed = None
  stop: Stop
  n: N = 1
  logprobs: Annotated[Optional[StrictInt],
                      Field(json_schema_extra={"minimum": 0, "maximum": TOP_LOGPROBS}),
                      Allowed(f"an integer 0..{TOP_LOGPROBS}")] = None
  echo: Annotated[Flag, Field(validate_default=True)] = False
  ignore_eos: Flag = False      # vLLM's extension: go on past end-of-sequence to max_tokens
  recurrence: Recurrence = "exact"
  stream_options: Options = None
  stream: Flag = False
  prompt: Prompt

  @field_validator("echo")
  @classmethod
  def _logprobs_in_range(cls, echo, info: ValidationInfo):
    """logprobs' range (checked after echo's type, as the server always has)."""
    n = info.data.get("logprobs")
    if n is not None and not 0 <= n <= TOP_LOGPROBS:
      raise refuse(f"logprobs={n} is invalid: allowed 0..{TOP_LOGPROBS}", "logprobs")
    return echo


class ChatRequest(RequestBody):
  """POST /v1/chat/completions; max_tokens None: the room left in the context."""
  max_tokens: MaxTokens = None
  max_completion_tokens: MaxTokens = None
  temperature: Temperature = 1.0
  top_p: TopP = 1.0
  top_k: TopK = 0
  seed: Seed = None
  stop: Stop
  n: N = 1
  logprobs: Flag = False
  top_logprobs: Annotated[StrictInt, Allowed(f"0..{TOP_LOGPROBS}")] = 0
  ignore_eos: Flag = False      # vLLM's extension: go on past end-of-sequence to max_tokens
  recurrence: Recurrence = "exact"
  stream_options: Options = None
  stream: Flag = False
  messages: Annotated[list[Message], Field(min_length=1), Allowed(
      "a non-empty list of {role, content} objects with string or text-part content",
      message="{name} is invalid: allowed {text}")]

  @field_validator("top_logprobs")
  @classmethod
  def _top_in_range(cls, top):
    if not 0 <= top <= TOP_LOGPROBS:
      raise refuse(f"top_logprobs={top} is invalid: allowed 0..{TOP_LOGPROBS}", "top_logprobs")
    return top


class TokenizeRequest(RequestBody):
  """POST /tokenize."""
  prompt: Annotated[StrictStr, Allowed("a string")]
  add_special_tokens: Flag = False


class DetokenizeRequest(RequestBody):
  """POST /detokenize."""
  tokens: Annotated[list[StrictInt], Allowed("a list of token ids",
                                             message="{name}={cut} is invalid: allowed {text}")]


# ----------------------------------------------------------------------- checking

def parsed(model: type[RequestBody], body: dict, max_len: int,
           max_batch: Optional[int] = None) -> RequestBody:
  """The body as a `model`, checked (max_tokens within max_len, n within max_batch); 400
  naming the first invalid field otherwise."""
  try:
    return model.model_validate(body, context={"max_len": max_len, "max_batch": max_batch})
  except ValidationError as e:
    raise refused(e, model, body) from None


def _model_in(annotation) -> Optional[type]:
  """The pydantic model a field holds (itself, in a list or Optional), if any."""
  for a in (annotation, *typing.get_args(annotation)):
    if isinstance(a, type) and not typing.get_args(a) and issubclass(a, BaseModel):
      return a
  return None


def refused(e: ValidationError, model: type[BaseModel], body: dict) -> ApiError:
  """The 400 of the first error: the message of the field's Allowed (nested fields by
  their dotted name), or the message a rule of ours raised."""
  err = e.errors()[0]
  if err["type"] == "api_error":
    return ApiError(400, err["ctx"]["message"], err["ctx"]["param"])
  names, field, value = [], None, body
  for part in err["loc"]:
    info = getattr(model, "model_fields", {}).get(part) if isinstance(part, str) else None
    if info is None:
      break
    names.append(part)
    field, model = info, _model_in(info.annotation)
    value = value.get(part) if isinstance(value, dict) else None
  allowed = next((m for m in field.metadata if isinstance(m, Allowed)), None) if field \
      else None
  if allowed is None:
    return ApiError(400, f"the request body is invalid: {err['msg']}",
                    names[0] if names else None)
  text, message = allowed.text, allowed.message
  if err["type"] in RANGE_ERRORS:
    text = allowed.in_range or text
    value = float(value) if field.annotation is float else value
  if err["type"] == "missing" and len(names) == len(err["loc"]):     # the field itself
    message = allowed.missing
  return ApiError(400, message.format(name=".".join(names), value=value,
                                      cut=str(value)[:60], text=text), names[0])


def openapi_body(model: type[BaseModel]) -> dict:
  """A route's `openapi_extra` documenting `model` as its JSON body (the routes read the
  body themselves, to answer errors as OpenAI does); nested models inlined."""
  schema = model.model_json_schema()
  defs = schema.pop("$defs", {})

  def inline(node):
    if isinstance(node, dict):
      if "$ref" in node:
        return inline(defs[node["$ref"].rsplit("/", 1)[-1]])
      return {k: inline(v) for k, v in node.items()}
    return [inline(v) for v in node] if isinstance(node, list) else node
  return {"requestBody": {"required": True,
                          "content": {"application/json": {"schema": inline(schema)}}}}


# ----------------------------------------------------------------------- the settings

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
  n: int = 1
  ignore_eos: bool = False      # an end-of-sequence token does not end the answer


def settings_of(req: Union[CompletionRequest, ChatRequest], server) -> Settings:
  """A checked request's settings; max_tokens None (chat without one): the context's room."""
  chat = isinstance(req, ChatRequest)
  seed = int(uuid.uuid4().int % 2**31) if req.seed is None else req.seed % 2**31
  prompt_cf = CF_PLAIN if req.recurrence == "off" else (
      server.chat_control_flow if chat else server.completion_control_flow)
  return Settings(
      getattr(req, "max_completion_tokens", None) or req.max_tokens,
      Sampling(float(req.temperature), req.top_k, float(req.top_p), seed), req.stop,
      False if chat else req.echo,
      (req.top_logprobs if req.logprobs else None) if chat else req.logprobs,
      req.stream, RECURRENCE[req.recurrence], prompt_cf,
      req.stream_options is not None and req.stream_options.include_usage, req.n,
      req.ignore_eos)


def sample_seeds(seed: int, n: int) -> list[int]:
  """The seeds of n samples of one request: the first is the request's (n=1 unchanged),
  the others drawn from (seed, i): distinct (but for a 2**-31 chance), the same on
  every repeat."""
  return [seed] + [int(np.random.SeedSequence([seed, i]).generate_state(1)[0] % 2**31)
                   for i in range(1, n)]


def prompts_of(prompt, tok: TokenizerView, add_bos: bool) -> list[list[int]]:
  """A checked prompt as token-id lists: text, token ids, or a list of either."""
  if isinstance(prompt, str) or all(isinstance(t, int) for t in prompt):
    prompt = [prompt]
  out = []
  for p in prompt:
    if isinstance(p, str):
      ids = tok.encode(p, False)
      if add_bos and tok.bos_id is not None:
        ids = [tok.bos_id] + ids
    else:
      ids = list(p)
    out.append(ids)
  return out
