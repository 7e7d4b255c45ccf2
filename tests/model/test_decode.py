"""Decoding: KV-cached generation equals the exact recurrence run teacher-forced."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2mlr_jax import forward, generate
from t2mlr_jax.model import decode

from _util import active_params, random_tokens, tiny_cfg

N_NEW = 8
MARGIN = 1e-4


@pytest.fixture(scope="module")
def model():
  cfg = tiny_cfg()
  return cfg, active_params(cfg, seed=5)


def _teacher_forced_check(params, cfg, prompt, new, prompt_cf):
  """Each generated token is the argmax of exact logits on prompt + generated so far."""
  seq = np.concatenate([prompt, np.asarray(new)], axis=1)
  P = prompt.shape[1]
  cf = np.concatenate([np.full(prompt.shape, prompt_cf), np.full(new.shape, 2)], axis=1)
  logits = np.asarray(forward(params, cfg, seq, mode="exact", control_flow=cf.astype(np.int32)))
  step = logits[:, P - 1:-1]                       # logits that chose each new token
  top2 = np.sort(step, axis=-1)[..., -2:]
  decisive = (top2[..., 1] - top2[..., 0]) > MARGIN
  # compare up to the first near-tie of each row (after one, the paths may diverge)
  upto = np.where(decisive.all(1), step.shape[1], np.argmin(decisive, axis=1))
  for b in range(seq.shape[0]):
    np.testing.assert_array_equal(np.asarray(new)[b, :upto[b]], step[b, :upto[b]].argmax(-1))
  assert upto.sum() >= seq.shape[0] * 4, "too many near-ties for a meaningful comparison"


@pytest.mark.parametrize("prompt_cf", [1, 2])
def test_greedy_equals_exact_teacher_forced(model, prompt_cf):
  cfg, params = model
  prompt = random_tokens(cfg, 3, 6, seed=7)
  new = generate(params, cfg, prompt, max_new_tokens=N_NEW, prompt_control_flow=prompt_cf)
  assert new.shape == (3, N_NEW)
  _teacher_forced_check(params, cfg, prompt, new, prompt_cf)


def test_plain_model_generate(model):
  cfg, params = model
  base = cfg.replace(recurrence=None)
  prompt = random_tokens(cfg, 2, 5, seed=8)
  new = generate(params, base, prompt, max_new_tokens=N_NEW)
  seq = np.concatenate([prompt, np.asarray(new)], axis=1)
  logits = np.asarray(forward(params, base, seq, mode="parallel"))[:, 4:-1]
  top2 = np.sort(logits, -1)[..., -2:]
  ok = (top2[..., 1] - top2[..., 0]) > MARGIN
  assert ok.all()
  np.testing.assert_array_equal(new, logits.argmax(-1))


def test_left_padded_batch_equals_one_at_a_time(model):
  cfg, params = model
  lengths = [7, 4, 2]
  prompts = [random_tokens(cfg, 1, n, seed=20 + n)[0] for n in lengths]
  P = max(lengths)
  batch = np.zeros((3, P), np.int32)
  for b, p in enumerate(prompts):
    batch[b, P - len(p):] = p
  out, out_logits = generate(params, cfg, batch, max_new_tokens=N_NEW, prompt_lengths=lengths,
                             return_logits=True)
  for b, p in enumerate(prompts):
    one, one_logits = generate(params, cfg, p[None], max_new_tokens=N_NEW, return_logits=True)
    np.testing.assert_allclose(out_logits[b], one_logits[0], atol=1e-5)
    top2 = np.sort(np.asarray(one_logits[0]), -1)[..., -2:]
    decisive = (top2[:, 1] - top2[:, 0]) > MARGIN
    upto = N_NEW if decisive.all() else int(np.argmin(decisive))
    np.testing.assert_array_equal(out[b, :upto], one[0, :upto])


def test_eos_stops_and_repeats(model):
  cfg, params = model
  prompt = random_tokens(cfg, 2, 5, seed=9)
  free = np.asarray(generate(params, cfg, prompt, max_new_tokens=N_NEW))
  eos = int(free[0, 2])
  out = np.asarray(generate(params, cfg, prompt, max_new_tokens=N_NEW, eos_id=eos))
  for b in range(2):
    hits = np.where(free[b] == eos)[0]
    if len(hits):
      k = hits[0]
      np.testing.assert_array_equal(out[b, :k + 1], free[b, :k + 1])
      assert (out[b, k:] == eos).all()
    else:
      np.testing.assert_array_equal(out[b], free[b])


def test_sampling(model):
  cfg, params = model
  prompt = random_tokens(cfg, 2, 5, seed=10)
  greedy = generate(params, cfg, prompt, max_new_tokens=N_NEW)
  key = jax.random.PRNGKey(0)
  top1 = generate(params, cfg, prompt, max_new_tokens=N_NEW, temperature=1.0, top_k=1, rng=key)
  np.testing.assert_array_equal(top1, greedy)
  tiny_p = generate(params, cfg, prompt, max_new_tokens=N_NEW, temperature=1.0, top_p=1e-6, rng=key)
  np.testing.assert_array_equal(tiny_p, greedy)
  s1 = generate(params, cfg, prompt, max_new_tokens=N_NEW, temperature=2.0, rng=key)
  s2 = generate(params, cfg, prompt, max_new_tokens=N_NEW, temperature=2.0, rng=key)
  s3 = generate(params, cfg, prompt, max_new_tokens=N_NEW, temperature=2.0,
                rng=jax.random.PRNGKey(1))
  np.testing.assert_array_equal(s1, s2)
  assert not np.array_equal(s1, s3)


def test_sample_filters():
  logits = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]]))
  keys = jax.random.split(jax.random.PRNGKey(0), 400)
  draw = lambda **kw: np.array([int(decode.sample(logits, k, 1.0, **kw)[0]) for k in keys[:200]])
  assert set(draw(top_k=2, top_p=None)) == {0, 1}
  assert set(draw(top_k=None, top_p=0.7)) == {0, 1}      # 0.5 < 0.7 <= 0.8
  assert set(draw(top_k=None, top_p=0.5)) == {0}
  assert set(draw(top_k=None, top_p=None)) == {0, 1, 2, 3}


@pytest.mark.parametrize("kwargs,field", [
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(max_new_tokens=100), "max_seq_len"),
    (dict(max_new_tokens=4, temperature=1.0), "rng"),
    (dict(max_new_tokens=4, prompt_control_flow=0), "prompt_control_flow"),
    (dict(max_new_tokens=4, top_p=1.5), "top_p"),
    (dict(max_new_tokens=4, prompt_lengths=[9, 1]), "prompt_lengths"),
])
def test_bad_generate_arguments(model, kwargs, field):
  cfg, params = model
  with pytest.raises(ValueError, match=field):
    generate(params, cfg, random_tokens(cfg, 2, 5), **kwargs)


def test_parallel_jacobi_prefill_capped_at_T_equals_exact(model):
  """Jacobi prefill with T sweeps is exact by construction (docs/models.md#jacobi)."""
  cfg, params = model
  prompt = random_tokens(cfg, 2, 12, seed=12)
  exact_new, exact_logits = generate(params, cfg, prompt, max_new_tokens=N_NEW,
                                     return_logits=True)
  jac_new, jac_logits = generate(params, cfg, prompt, max_new_tokens=N_NEW, return_logits=True,
                                 prefill="jacobi")
  np.testing.assert_allclose(jac_logits, exact_logits, atol=1e-5)
  np.testing.assert_array_equal(jac_new, exact_new)
  from t2mlr_jax.model import modes
  from t2mlr_jax.model.schedules import jacobi as schedule
  inp = modes.seq_inputs(jnp.asarray(prompt))
  aux = schedule.jacobi_prefill(params, cfg, jnp.asarray(prompt), inp, tol=1e-6).aux
  assert 1 <= int(aux["jacobi_sweeps"]) <= 12


@pytest.mark.parametrize("B", [pytest.param(1, marks=pytest.mark.slow), 2])
def test_decode_loop_updates_the_kv_cache_in_place(model, B):
  """The compiled generate loop holds no full copy of any layer's KV cache (a
  structural check, not a timing one): at batch 1 a [B, N_kv, S, K] cache made XLA:CPU
  copy every cache twice per token."""
  import re
  cfg, params = model
  P, N = 5, 3
  prompt = jnp.asarray(random_tokens(cfg, B, P, seed=9))
  hlo = decode._generate.lower(
      params, cfg, prompt, jnp.full((B,), P, jnp.int32), jnp.full((B, P), 2, jnp.int32),
      jax.random.PRNGKey(0), N, 0.0, None, None, None, True, False, "exact",
      None).compile().as_text()
  shape = f"f32[{B * cfg.n_kv_heads},{P + N},{cfg.head_dim}]"
  assert hlo.count(shape) > 0, "cache shape not found: the layout changed, update the test"
  copies = re.findall(re.escape(shape) + r"\{[0-9,]*\} copy\(", hlo)
  assert not copies, f"{len(copies)} copies of a KV cache in the compiled decode loop"


def test_non_recurrent_prompt_prefill_is_the_exact_prefill(model):
  """A cf-1 prompt is prefilled by one parallel pass (every layer in one scan, the span's
  last layer tapped): its last logits and the recurrent state it leaves equal the
  token-by-token exact prefill's, with left padding."""
  from t2mlr_jax.model.modes import SeqInputs
  cfg, params = model
  lengths = jnp.array([7, 4], jnp.int32)
  prompt = random_tokens(cfg, 2, 7, seed=31)
  outs = {}
  for method_cf in (1, 2):     # cf 2 here only to force the exact path; same tokens
    t = np.arange(7)[None]
    pad = 7 - np.asarray(lengths)[:, None]
    cf = np.where(t >= pad, 1, 0).astype(np.int32)
    inp = SeqInputs(jnp.asarray(cf), jnp.asarray(np.maximum(t - pad, 0), jnp.int32), None)
    outs[method_cf] = decode.prefill(params, cfg, jnp.asarray(prompt), inp, 16,
                                     recurrent_prompt=method_cf == 2)
  (lp, sp), (le, se) = outs[1], outs[2]
  np.testing.assert_allclose(lp, le, atol=1e-5)
  np.testing.assert_allclose(sp.state, se.state, atol=1e-5)
  assert float(jnp.abs(sp.state).max()) > 0             # the state is really written
  for a, b in zip(jax.tree.leaves(sp.kv), jax.tree.leaves(se.kv)):
    np.testing.assert_allclose(a, b, atol=1e-5)


def test_per_token_prompt_control_flow_equals_the_exact_forward(model):
  """A [B, P] prompt control flow (mixed 1s and 2s, as a task's prompt has) decodes with
  the logits the exact forward gives that control flow, teacher-forced."""
  cfg, params = model
  prompt = random_tokens(cfg, 2, 7, seed=21)
  pcf = np.array([[1, 1, 2, 2, 1, 2, 2], [2, 1, 1, 1, 2, 2, 1]], np.int32)
  new, logits = generate(params, cfg, prompt, max_new_tokens=4, prompt_control_flow=pcf,
                         return_logits=True)
  seq = np.concatenate([prompt, np.asarray(new)], axis=1)
  cf = np.concatenate([pcf, np.full((2, 4), 2, np.int32)], axis=1)
  ref = np.asarray(forward(params, cfg, seq, mode="exact", control_flow=cf))[:, 6:-1]
  np.testing.assert_allclose(np.asarray(logits), ref, atol=1e-4)
  # all 2s as an array is the scalar 2
  np.testing.assert_array_equal(
      generate(params, cfg, prompt, max_new_tokens=4, prompt_control_flow=np.full((2, 7), 2)),
      generate(params, cfg, prompt, max_new_tokens=4, prompt_control_flow=2))
  with pytest.raises(ValueError, match="prompt_control_flow"):
    generate(params, cfg, prompt, max_new_tokens=2, prompt_control_flow=np.full((2, 6), 2))


def test_pad_id_gives_the_lengths_and_refuses_right_padding(model):
  cfg, params = model
  PAD = 0
  prompt = random_tokens(cfg, 2, 6, seed=22)
  prompt = np.where(prompt == PAD, 1, prompt)
  left = prompt.copy()
  left[1, :2] = PAD                                     # row 1: 4 real tokens
  by_pad = generate(params, cfg, left, max_new_tokens=3, pad_id=PAD)
  by_len = generate(params, cfg, left, max_new_tokens=3, prompt_lengths=[6, 4])
  np.testing.assert_array_equal(by_pad, by_len)
  right = prompt.copy()
  right[1, -2:] = PAD
  with pytest.raises(ValueError, match="left-pad"):
    generate(params, cfg, right, max_new_tokens=3, pad_id=PAD)
  with pytest.raises(ValueError, match="prompt_lengths"):
    generate(params, cfg, left, max_new_tokens=3, pad_id=PAD, prompt_lengths=[6, 6])
