"""The serving engine: a request decoded in a slot equals in-process decoding, alone and
with other requests joining and leaving around it (rolls and bucket moves included);
sampling is per request; the prompt's echo log-probabilities are the exact ones; after
warm-up nothing compiles."""

import jax
import numpy as np
import pytest

from t2mlr_jax import LRTConfig, ModelConfig, forward, generate
from t2mlr_jax.model.lstm import LSTMConfig
from t2mlr_jax.serving import engine as serving_engine
from t2mlr_jax.serving.engine import Engine, Sampling

from _util import active_lrt_params, active_params, random_tokens, tiny_cfg

GAP = 1e-4          # the parity rule: tokens equal up to the first top-2 gap <= GAP
TOL = 1e-5          # logits


def _models():
  t2mlr = tiny_cfg()
  lrt = ModelConfig(vocab_size=37, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, d_ff=64,
                    max_seq_len=64, recurrence=LRTConfig(gate_channels=8))
  return {"plain": (t2mlr.replace(recurrence=None), active_params(t2mlr, seed=3)),
          "t2mlr": (t2mlr, active_params(t2mlr, seed=3)),
          "lrt": (lrt, active_lrt_params(lrt, seed=4))}


MODELS = _models()


GREEDY = Sampling()


def _run_alone(engine, prompt, n, cf=2, gen_cf=2, sampling=GREEDY):
  """(tokens, logits [n, V]) of one request through the engine."""
  pre, _ = engine.prefill(prompt, control_flow=cf, max_tokens=n)
  row, first = engine.insert("me", pre, n, control_flow=gen_cf, sampling=sampling)
  tokens, logits = [first.token], [np.asarray(pre.logits)]
  while len(tokens) < n:
    out, step_logits = engine.step(return_logits=True)
    tokens.append(out[0][2].token)
    logits.append(np.asarray(step_logits)[row])
  engine.release(row)
  return np.array(tokens), np.stack(logits)


def _agree(tokens, logits, ref_tokens, ref_logits):
  """The parity rule: logits within TOL, tokens equal up to the first near-tie."""
  assert np.max(np.abs(logits - ref_logits)) <= TOL
  top2 = np.sort(ref_logits, -1)[..., -2:]
  decisive = (top2[..., 1] - top2[..., 0]) > GAP
  upto = len(tokens) if decisive.all() else int(np.argmin(decisive))
  np.testing.assert_array_equal(tokens[:upto], ref_tokens[:upto])
  return upto


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("prompt_cf", [1, 2])
def test_a_request_alone_equals_in_process_generate(name, prompt_cf):
  cfg, params = MODELS[name]
  engine = Engine(cfg, params, max_batch=4)
  prompt = random_tokens(cfg, 1, 7, seed=1)[0]
  tokens, logits = _run_alone(engine, prompt, 10, cf=prompt_cf)
  ref, ref_logits = generate(params, cfg, prompt[None], max_new_tokens=10,
                             prompt_control_flow=prompt_cf, return_logits=True)
  assert _agree(tokens, logits, np.asarray(ref)[0], np.asarray(ref_logits)[0]) >= 5
  assert engine.active() == 0


@pytest.mark.parametrize("name", [pytest.param("plain", marks=pytest.mark.slow), "t2mlr",
                                  pytest.param("lrt", marks=pytest.mark.slow)])
def test_a_request_among_seven_others_equals_itself_alone(name):
  """Eight requests of different lengths, joining at different steps, sampled or greedy,
  the engine rolling its rows both ways and moving between batch buckets: the greedy one under test
  equals its run alone, and each sampled one its own run alone under its seed."""
  cfg, params = MODELS[name]
  rng = np.random.default_rng(0)
  requests = []
  join_at = (0, 1, 2, 3, 4, 5, 20, 30)         # eight at once, then two late ones
  for i in range(8):
    L = int(rng.integers(2, 20))
    n = int(rng.integers(12, 24)) if i < 6 else 20 - 4 * (i - 6)
    sampling = Sampling() if i % 3 == 0 else Sampling(temperature=0.9, top_k=int(i % 2) * 8,
                                                      top_p=0.9, seed=100 + i)
    requests.append((random_tokens(cfg, 1, L, seed=10 + i)[0], n, sampling))
  alone = [_run_alone(Engine(cfg, params, max_batch=8, max_len=48), p, n, sampling=s)
           for p, n, s in requests]
  engine = Engine(cfg, params, max_batch=8, max_len=48)
  rolls = []
  real_roll = engine._roll
  engine._roll = lambda shift: (rolls.append(shift), real_roll(shift))
  got = {i: ([], []) for i in range(len(requests))}
  waiting = list(range(len(requests)))
  batches = set()
  step = 0
  while waiting or engine.active():
    if waiting and step >= join_at[waiting[0]]:
      i = waiting.pop(0)
      prompt, n, sampling = requests[i]
      pre, _ = engine.prefill(prompt, max_tokens=n)
      row, first = engine.insert(i, pre, n, sampling=sampling)
      got[i][0].append(first.token)
      got[i][1].append(np.asarray(pre.logits))
    batches.add(engine.batch)
    out, logits = engine.step(return_logits=True)
    for row, i, tok in out:
      got[i][0].append(tok.token)
      got[i][1].append(np.asarray(logits)[row])
    for row, i, _ in out:
      if len(got[i][0]) == requests[i][1]:
        engine.release(row)
    step += 1
  assert rolls and min(rolls) < 0 < max(rolls)          # rolled both ways
  assert {1, 2, 4, 8} <= batches
  for i, (ref_tokens, ref_logits) in enumerate(alone):
    tokens, logits = np.array(got[i][0]), np.stack(got[i][1])
    assert len(tokens) == requests[i][1]
    if requests[i][2].temperature == 0:
      _agree(tokens, logits, ref_tokens, ref_logits)
    else:                                   # the same draws while the logits agree
      assert np.max(np.abs(logits[:3] - ref_logits[:3])) <= TOL
      np.testing.assert_array_equal(tokens[:3], ref_tokens[:3])


def test_sampling_is_per_request_and_seeded():
  cfg, params = MODELS["t2mlr"]
  engine = Engine(cfg, params, max_batch=2)
  prompt = random_tokens(cfg, 1, 5, seed=2)[0]
  a = _run_alone(engine, prompt, 12, sampling=Sampling(temperature=1.0, seed=7))[0]
  b = _run_alone(engine, prompt, 12, sampling=Sampling(temperature=1.0, seed=7))[0]
  c = _run_alone(engine, prompt, 12, sampling=Sampling(temperature=1.0, seed=8))[0]
  greedy = _run_alone(engine, prompt, 12)[0]
  top1 = _run_alone(engine, prompt, 12, sampling=Sampling(temperature=1.0, top_k=1, seed=9))[0]
  np.testing.assert_array_equal(a, b)
  assert (a != c).any()
  np.testing.assert_array_equal(top1, greedy)
  with pytest.raises(ValueError, match="top_p"):
    Sampling(top_p=0.0)


def test_recurrence_off_runs_every_generated_token_non_recurrent():
  """gen control flow 1 (the server's recurrence "off"): the logits are the forward pass
  with every token at control flow 1 over the same tokens."""
  cfg, params = MODELS["t2mlr"]
  engine = Engine(cfg, params, max_batch=1)
  prompt = random_tokens(cfg, 1, 6, seed=3)[0]
  tokens, logits = _run_alone(engine, prompt, 8, cf=1, gen_cf=1)
  seq = np.concatenate([prompt, tokens[:-1]])[None]
  ref = np.asarray(forward(params, cfg, seq, mode="exact",
                           control_flow=np.ones_like(seq)))[0, len(prompt) - 1:]
  assert np.max(np.abs(logits - ref)) <= TOL
  on = _run_alone(engine, prompt, 8, cf=1, gen_cf=2)[1]
  assert np.max(np.abs(on[1:] - logits[1:])) > 1e-3      # the recurrence mattered


@pytest.mark.parametrize("name", ["t2mlr", "lrt"])
def test_echo_scores_the_prompt_under_the_exact_recurrence(name):
  cfg, params = MODELS[name]
  engine = Engine(cfg, params, max_batch=1)
  prompt = random_tokens(cfg, 1, 11, seed=4)[0]
  _, scores = engine.prefill(prompt, max_tokens=1, echo=True)
  logits = np.asarray(forward(params, cfg, prompt[None], mode="exact",
                              control_flow=np.full((1, 11), 2)))[0]
  logp = jax.nn.log_softmax(logits, -1)
  np.testing.assert_allclose(scores.logprobs, np.asarray(logp)[np.arange(10), prompt[1:]],
                             atol=TOL)
  np.testing.assert_array_equal(scores.top_ids[:, 0], logits[:-1].argmax(-1))
  assert scores.top_logprobs.shape == (10, 5)


def test_nothing_compiles_after_warmup():
  """Warm-up compiles every step, insert and prefill the requests below use; twenty mixed
  requests (lengths, sampling, control flows, joins, leaves) then compile nothing."""
  cfg, params = MODELS["lrt"]
  engine = Engine(cfg, params, max_batch=4, max_len=48)
  engine.warmup(prompt_lengths=(1, 17), control_flows=(1, 2), echo=(False, True))
  compiles = []
  listener = lambda event, duration, **kw: compiles.append(event) if event == (
      "/jax/core/compile/backend_compile_duration") else None
  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    rng = np.random.default_rng(1)
    live = []                  # [row, owner, tokens still to come]

    def step_and_release():
      for _row, owner, _ in engine.step():
        next(e for e in live if e[1] == owner)[2] -= 1
      for entry in [e for e in live if e[2] <= 0]:
        engine.release(engine.rows.index(entry[1]))
        live.remove(entry)

    for i in range(20):
      while engine.active() == engine.max_batch:      # full: step until a slot frees
        step_and_release()
      L, n = int(rng.integers(1, 30)), int(rng.integers(1, 12))
      prompt = np.random.default_rng(i).integers(0, cfg.vocab_size, L)   # numpy: no compile
      pre, _ = engine.prefill(prompt, control_flow=1 + i % 2, max_tokens=n, echo=i % 4 == 0)
      row, _ = engine.insert(i, pre, n, control_flow=2 - i % 3 // 2,
                             sampling=Sampling(temperature=0.5 * (i % 2), seed=i))
      live.append([row, i, n - 1])
      for _ in range(int(rng.integers(1, 4))):
        step_and_release()
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
  assert compiles == []


def test_host_parameters_are_put_on_the_device_once():
  """A loader's numpy parameters (a GGUF's) live on the device in the engine: prefill,
  insert and decode steps (sampled, a bucket move included) run with every host-to-device
  transfer disallowed (what they need the engine puts there explicitly); the tokens equal
  those of device parameters; the guard does catch a step given host parameters."""
  cfg, params = MODELS["t2mlr"]
  host = jax.tree.map(np.asarray, params)
  engine = Engine(cfg, host, max_batch=2, max_len=32)
  assert all(isinstance(x, jax.Array) for x in jax.tree.leaves(engine.params))
  prompt = np.asarray(random_tokens(cfg, 1, 5, seed=4)[0])
  sampled = Sampling(temperature=0.7, seed=5)
  with jax.transfer_guard_host_to_device("disallow"):
    tokens, _ = _run_alone(engine, prompt, 3)
    pre, _ = engine.prefill(prompt, max_tokens=4)
    engine.insert("a", pre, 4, sampling=sampled)
    engine.insert("b", engine.prefill(prompt, max_tokens=4)[0], 4)     # batch 1 -> 2
    steps = [engine.step() for _ in range(3)]
  assert len(steps[-1]) == 2
  ref, _ = _run_alone(Engine(cfg, params, max_batch=2, max_len=32), prompt, 3)
  np.testing.assert_array_equal(tokens, ref)
  with jax.transfer_guard_host_to_device("disallow"), pytest.raises(Exception,
                                                                    match="Disallowed"):
    serving_engine._advance(host, engine.layers, cfg, engine.slots.decode, engine.slots.token,
                            engine.slots.cf)


def test_seeds_become_the_same_keys_on_the_host():
  for seed in (0, 7, 2**31, 2**40 + 7, -3):
    np.testing.assert_array_equal(serving_engine.host_key(seed), np.asarray(jax.random.PRNGKey(seed)))


def test_max_len_defaults_to_a_serving_length_within_the_context():
  cfg, params = MODELS["plain"]
  assert Engine(cfg, params).max_len == cfg.max_seq_len                   # 64: the context
  long = cfg.replace(max_seq_len=8192)
  assert Engine(long, params).max_len == serving_engine.SERVING_MAX_LEN == 2048
  with pytest.raises(ValueError, match=r"max_len=65 is invalid: allowed 2\.\.64"):
    Engine(cfg, params, max_len=65)
  with pytest.raises(ValueError, match="cache_dtype='float16' is invalid"):
    Engine(cfg, params, cache_dtype="float16")


def test_a_bfloat16_cache_is_half_the_size_and_keeps_the_tokens():
  """The cache's bytes are slots x layers x length x KV heads x head_dim x 2 x dtype
  bytes, those of the arrays the engine holds at its largest buckets; a bfloat16 cache
  halves them and keeps the greedy tokens (logits within 0.05) of a float32 one."""
  cfg, params = MODELS["t2mlr"]
  f32 = Engine(cfg, params, max_batch=2, max_len=32)
  bf16 = Engine(cfg, params, max_batch=2, max_len=32, cache_dtype="bfloat16")
  want = 2 * cfg.n_layers * 32 * cfg.n_kv_heads * cfg.head_dim * 2 * 4
  assert f32.cache_bytes() == want and bf16.cache_bytes() == want // 2
  prompt = np.asarray(random_tokens(cfg, 1, 6, seed=5)[0])
  tokens, logits = _run_alone(f32, prompt, 8)
  got, got_logits = _run_alone(bf16, prompt, 8)
  np.testing.assert_array_equal(got, tokens)
  assert np.max(np.abs(got_logits - logits)) <= 0.05
  for engine in (f32, bf16):             # both rows and the whole length: the largest
    for i in range(2):
      engine.insert(i, engine.prefill(prompt, max_tokens=26)[0], 26)
    held = sum(a.nbytes for kv in engine.slots.decode.kv for a in kv)
    assert held == engine.cache_bytes()
    assert engine.slots.decode.kv[0].k.dtype == engine.cache_dtype


def test_a_model_without_a_decode_step_is_refused():
  lstm = LSTMConfig(vocab_size=16, d_model=8, n_layers=1)
  with pytest.raises(ValueError, match="no decode step"):
    Engine(lstm, {})
  cfg, params = MODELS["plain"]
  engine = Engine(cfg, params, max_len=16)
  with pytest.raises(ValueError, match="exceed the context of 16 tokens"):
    engine.prefill(list(range(10)), max_tokens=7)
