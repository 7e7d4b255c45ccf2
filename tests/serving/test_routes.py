"""What clients we did not write read from the server (the tiny GGUF model on a loopback
port): the generated end-of-sequence token's log-probability entry (lm-eval drops the
last entry), streams that carry log-probabilities and echo, n samples a prompt each in its
own slot, a client leaving mid-stream logged in one INFO line, and the error papercuts."""

import asyncio
import gc
import http.client
import json
import logging
import time
import urllib.request

import jax
import numpy as np
import pytest
from fastapi.exceptions import RequestValidationError

from serving.test_server import Running
from t2mlr_jax import forward, generate
from t2mlr_jax.serving import routes, server as serving

from _gguf_fixtures import tiny_gguf_model

PROMPT = "Numbers 1 22 333"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
  return tiny_gguf_model(tmp_path_factory.mktemp("routes"))


@pytest.fixture(scope="module")
def running(model):
  cfg, params, tok = model
  run = Running(serving.Server(cfg, params, tok, name="tiny", max_batch=4, max_len=64))
  yield run
  run.stop()


def _stream(running, path, body) -> list:
  """The chunks (JSON objects) of a streamed answer, up to data: [DONE]."""
  req = urllib.request.Request(running.base + path, data=json.dumps(
      {**body, "stream": True}).encode(), headers={"Content-Type": "application/json"})
  chunks = []
  with urllib.request.urlopen(req, timeout=60) as r:
    for line in r:
      line = line.decode().strip()
      if line == "data: [DONE]":
        return chunks
      if line.startswith("data: "):
        chunks.append(json.loads(line[6:]))
  raise AssertionError(f"no data: [DONE] after {chunks}")


def _logp(params, cfg, ids):
  """In-process log-probabilities [len(ids), V] of the next token at each position."""
  logits = np.asarray(forward(params, cfg, np.array([ids]), mode="exact"))[0]
  return np.asarray(jax.nn.log_softmax(logits, -1))


def _joined(parts: list) -> dict:
  """Completions' `logprobs` objects one after another, as one."""
  return {k: sum((p[k] for p in parts), []) for k in ("tokens", "token_logprobs",
                                                      "top_logprobs", "text_offset")}


def _close(a, b) -> None:
  """Two answers' log-probabilities (nested dicts and lists) equal, numbers within 1e-5:
  a row's place in the batched cache moves its sums by a few ulps."""
  if isinstance(a, dict):
    assert isinstance(b, dict) and list(a) == list(b), (a, b)
    for k in a:
      _close(a[k], b[k])
  elif isinstance(a, list):
    assert isinstance(b, list) and len(a) == len(b), (a, b)
    for x, y in zip(a, b):
      _close(x, y)
  elif isinstance(a, float):
    assert abs(a - b) <= 1e-5, (a, b)
  else:
    assert a == b, (a, b)


def test_a_generated_eos_has_its_entry_and_counts(model, running, monkeypatch):
  """lm-eval's scoring request (echo, max_tokens 1, logprobs 1) when the greedy token is
  the end of sequence: prompt + 1 entries, the prompt's equal to the in-process ones, the
  last the EOS's; it counts as generated, finish "stop", and is not in the text. Chat's
  logprobs and both streams carry it too."""
  cfg, params, tok = model
  ids = tok.encode(PROMPT)
  logp = _logp(params, cfg, ids)
  eos = int(np.argmax(logp[-1]))
  monkeypatch.setattr(running.server.scheduler, "eos_id", eos)
  body = {"prompt": ids, "max_tokens": 1, "temperature": 0, "logprobs": 1, "echo": True}
  status, out, _ = running.post("/v1/completions", body)
  assert status == 200, out
  choice, lp = out["choices"][0], out["choices"][0]["logprobs"]
  assert len(lp["token_logprobs"]) == len(ids) + 1 and lp["token_logprobs"][0] is None
  np.testing.assert_allclose(lp["token_logprobs"][1:len(ids)],
                             logp[np.arange(len(ids) - 1), ids[1:]], atol=1e-5)
  np.testing.assert_allclose(lp["token_logprobs"][-1], logp[-1, eos], atol=1e-5)
  assert lp["tokens"][-1] == running.server.token_text(eos)
  assert list(lp["top_logprobs"][-1]) == [running.server.token_text(eos)]
  assert choice["text"] == tok.decode(ids) and choice["finish_reason"] == "stop"
  assert out["usage"]["completion_tokens"] == 1
  chunks = _stream(running, "/v1/completions", {**body, "max_tokens": 4})
  _close(_joined([c["choices"][0]["logprobs"] for c in chunks
                  if c["choices"][0]["logprobs"]]), lp)
  assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
  messages = [{"role": "user", "content": "Hi"}]
  chat_ids = tok.encode(tok.apply_chat_template(messages))
  eos = int(np.argmax(_logp(params, cfg, chat_ids)[-1]))
  monkeypatch.setattr(running.server.scheduler, "eos_id", eos)
  chat = {"messages": messages, "max_tokens": 3, "temperature": 0, "logprobs": True,
          "top_logprobs": 2}
  status, out, _ = running.post("/v1/chat/completions", chat)
  assert status == 200, out
  content = out["choices"][0]["logprobs"]["content"]
  assert [e["token"] for e in content] == [running.server.token_text(eos)]
  assert len(content[0]["top_logprobs"]) == 2
  assert out["choices"][0]["message"]["content"] == ""
  assert out["choices"][0]["finish_reason"] == "stop"
  assert out["usage"]["completion_tokens"] == 1
  chunks = _stream(running, "/v1/chat/completions", chat)
  _close(sum((c["choices"][0]["logprobs"]["content"] for c in chunks
              if c["choices"][0]["logprobs"]), []), content)


def test_ignore_eos_goes_on_to_max_tokens(model, running, monkeypatch):
  """vLLM's `ignore_eos` (guidellm sends it for fixed output lengths): an end of sequence
  keeps its entry and count but not its text, and the answer goes on to max_tokens
  (finish "length"), the tokens after it those of the model fed the EOS."""
  cfg, params, tok = model
  ids = tok.encode(PROMPT)
  eos = int(np.argmax(_logp(params, cfg, ids)[-1]))
  monkeypatch.setattr(running.server.scheduler, "eos_id", eos)
  body = {"prompt": ids, "max_tokens": 4, "temperature": 0, "logprobs": 1,
          "ignore_eos": True}
  status, out, _ = running.post("/v1/completions", body)
  assert status == 200, out
  choice = out["choices"][0]
  assert choice["finish_reason"] == "length" and out["usage"]["completion_tokens"] == 4
  lp = choice["logprobs"]
  assert lp["tokens"][0] == running.server.token_text(eos)
  rest = tok.decode([int(t) for t in np.asarray(generate(
      params, cfg, np.asarray([ids]), max_new_tokens=4))[0][1:] if int(t) != eos])
  assert choice["text"] == rest
  status, out, _ = running.post("/v1/completions", {**body, "ignore_eos": "yes"})
  assert status == 400 and out["error"]["param"] == "ignore_eos"


def test_streams_carry_logprobs_and_echo(model, running):
  """A stream with logprobs and echo: the prompt's text and entries in the first chunk,
  then one entry a chunk; joined, they are the answer unstreamed (text included). Chat's
  stream the same in its shape."""
  tok = model[2]
  body = {"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "logprobs": 2, "echo": True}
  status, out, _ = running.post("/v1/completions", body)
  assert status == 200, out
  chunks = _stream(running, "/v1/completions", body)
  first = chunks[0]["choices"][0]
  assert first["text"] == PROMPT and first["logprobs"]["token_logprobs"][0] is None
  assert len(first["logprobs"]["tokens"]) == len(tok.encode(PROMPT))
  assert "".join(c["choices"][0]["text"] for c in chunks) == out["choices"][0]["text"]
  _close(_joined([c["choices"][0]["logprobs"] for c in chunks
                  if c["choices"][0]["logprobs"]]), out["choices"][0]["logprobs"])
  chat = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 6,
          "temperature": 0, "logprobs": True, "top_logprobs": 3}
  status, out, _ = running.post("/v1/chat/completions", chat)
  assert status == 200, out
  chunks = _stream(running, "/v1/chat/completions", chat)
  streamed = sum((c["choices"][0]["logprobs"]["content"] for c in chunks
                  if c["choices"][0]["logprobs"]), [])
  _close(streamed, out["choices"][0]["logprobs"]["content"])
  assert len(streamed) == out["usage"]["completion_tokens"]
  assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == \
      out["choices"][0]["message"]["content"]


def test_n_samples_each_in_its_own_slot_seeded_and_streamed(running):
  """n=3 at temperature 1 with a seed: three choices indexed 0..2, not all equal, the same
  on repeat, the first the n=1 answer of that seed; a stream tags each sample's chunks by
  index and joins to the same choices; two prompts give six; n beyond the slots is a 400
  naming n and the limit."""
  body = {"prompt": PROMPT, "max_tokens": 8, "temperature": 1.0, "seed": 7, "n": 3,
          "logprobs": 0}
  status, out, _ = running.post("/v1/completions", body)
  assert status == 200, out
  texts = [c["text"] for c in out["choices"]]
  assert [c["index"] for c in out["choices"]] == [0, 1, 2] and len(set(texts)) > 1
  assert [c["text"] for c in running.post("/v1/completions", body)[1]["choices"]] == texts
  one = running.post("/v1/completions", {**body, "n": 1})[1]
  assert [c["text"] for c in one["choices"]] == texts[:1]
  assert out["usage"]["completion_tokens"] == sum(len(c["logprobs"]["tokens"])
                                                 for c in out["choices"])
  streamed = ["", "", ""]
  for chunk in _stream(running, "/v1/completions", body):
    for c in chunk["choices"]:
      streamed[c["index"]] += c["text"]
  assert streamed == texts
  two = running.post("/v1/completions", {**body, "prompt": [PROMPT, "To be"]})[1]
  assert [c["index"] for c in two["choices"]] == list(range(6))
  assert [c["text"] for c in two["choices"][:3]] == texts
  chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "n": 2,
          "seed": 1}
  status, out, _ = running.post("/v1/chat/completions", chat)
  assert status == 200 and [c["index"] for c in out["choices"]] == [0, 1]
  streamed = ["", ""]
  for chunk in _stream(running, "/v1/chat/completions", chat):
    for c in chunk["choices"]:
      streamed[c["index"]] += c["delta"].get("content", "")
  assert streamed == [c["message"]["content"] for c in out["choices"]]
  status, out, _ = running.post("/v1/completions", {**body, "n": 5})
  assert status == 400 and out["error"]["param"] == "n", out
  assert "allowed 1..4" in out["error"]["message"]


@pytest.mark.parametrize("path, body, param, said", [
    ("/v1/completions", {"prompt": list(range(70))}, "prompt",
     "the prompt has 70 tokens: allowed at most 63"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "To be " * 40}]},
     "messages", "the messages (through the chat template) has"),
    ("/v1/completions", {"prompt": list(range(60)), "max_tokens": 10}, "max_tokens",
     "the prompt has 60 tokens + max_tokens=10: more than the context of 64 tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "logprobs": True, "top_logprobs": 9}, "top_logprobs",
     "top_logprobs=9 is invalid: allowed 0..5"),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, "messages",
     "messages[].role='wizard' is invalid"),
    ("/v1/completions", {"max_tokens": 2}, "prompt", "prompt is required: allowed a string"),
    ("/v1/completions", {"model": "gpt-4", "prompt": "x"}, "model",
     "model='gpt-4' does not exist: allowed 'tiny'"),
])
def test_errors_name_the_field_at_fault(running, path, body, param, said):
  """An over-long prompt is the prompt's error (its count and the limit), not max_tokens';
  top_logprobs' range names it; a wrong model is 404 model_not_found naming the served one
  (a missing one is the served one); every error is OpenAI's object."""
  status, out, _ = running.post(path, body)
  assert status == (404 if param == "model" else 400), out
  assert out["error"]["param"] == param and out["error"]["message"].startswith(said), out
  assert out["error"]["type"] == "invalid_request_error"
  if param == "model":
    assert out["error"]["code"] == "model_not_found"
    assert running.post(path, {"prompt": "x", "max_tokens": 1})[0] == 200


def test_fastapis_validation_errors_are_openai_errors():
  """A 422 of FastAPI's own (a typed parameter) is OpenAI's 400 naming the field."""
  error = RequestValidationError([{"loc": ("body", "n"), "msg": "Input should be a valid "
                                   "integer", "type": "int_parsing"}])
  response = asyncio.run(routes.validation_error(None, error))
  assert response.status_code == 400
  assert json.loads(response.body) == {"error": {
      "message": "n is invalid: Input should be a valid integer",
      "type": "invalid_request_error", "param": "n", "code": None}}


def test_a_client_leaving_mid_stream_is_one_info_line(running, monkeypatch, caplog):
  """The client closes after the first chunk: one INFO line names it, no ERROR (no
  un-retrieved future, no pending task destroyed), the slot is freed, the next request
  is answered."""
  engine = running.server.engine
  real_step = engine.step
  monkeypatch.setattr(engine, "step", lambda *a, **k: (time.sleep(0.05), real_step(*a, **k))[1])
  caplog.set_level(logging.INFO)
  for path, body in (("/v1/completions", {"prompt": PROMPT, "n": 2}),
                     ("/v1/chat/completions", {"messages": [{"role": "user",
                                                             "content": "Hi"}]})):
    conn = http.client.HTTPConnection("127.0.0.1", running.port, timeout=30)
    conn.request("POST", path, json.dumps({**body, "max_tokens": 30, "stream": True}),
                 {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200 and resp.readline().startswith(b"data: ")
    conn.close()                                      # the client leaves
    deadline = time.time() + 10
    while engine.active() and time.time() < deadline:
      time.sleep(0.02)
    assert engine.active() == 0
  time.sleep(0.2)
  gc.collect()
  assert running.post("/v1/completions", {"prompt": "To", "max_tokens": 2})[0] == 200
  left = [r for r in caplog.records if "left mid-stream" in r.getMessage()]
  assert [r.levelno for r in left] == [logging.INFO, logging.INFO], caplog.text
  assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
