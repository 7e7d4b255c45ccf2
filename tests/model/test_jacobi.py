"""Jacobi training: gradient truncation and memory that does not grow with D_f."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2mlr_jax import forward
from t2mlr_jax.losses import cross_entropy, next_token_labels
from t2mlr_jax.model import modes
from t2mlr_jax.model.recurrence import t2mlr as rec
from t2mlr_jax.model.sequence import context
from t2mlr_jax.model.span import previous_states
from t2mlr_jax.model.transformer import embed, head, run_layers, segment_params

from _util import active_params, random_tokens, tiny_cfg

T = 8


def reference_logits(params, deltas, cfg, tokens, d_f, d_b, truncate):
  """The Jacobi forward (docs/models.md#jacobi) unrolled by hand in Python. Sweep s uses
  middle/recurrence parameters `params + deltas[s]` (deltas are zeros), so d loss /
  d deltas[s] is sweep s's share of the gradient. With `truncate`, the cache entering
  sweep D_f - D_b is detached."""
  inp = modes.seq_inputs(tokens)
  h = embed(params, cfg, tokens)
  ctx = context(params, cfg, inp, tokens, h)
  run_segment = lambda p, x, first: run_layers(p, cfg, x, ctx, first)
  (_, lo, hi), = [s for s in cfg.segments if s[0] == "middle"]
  if lo:
    h, _ = run_segment(segment_params(params, 0, lo), h, 0)
  p_mid = segment_params(params, lo, hi)
  plus = lambda s: jax.tree.map(jnp.add, (p_mid, params["recurrence"]), deltas[s])
  pm, _ = plus(0)
  R = previous_states(cfg, run_segment(pm, h, lo)[0], inp.positions)
  for s in range(1, d_f):
    if truncate and s == d_f - d_b:
      R = jax.lax.stop_gradient(R)
    pm, pr = plus(s)
    x, _ = rec.enter({"recurrence": pr}, cfg, h, R, inp.control_flow)
    o, _ = run_segment(pm, x, lo)
    R = previous_states(cfg, rec.carry({"recurrence": pr}, cfg, o, R, inp.control_flow),
                        inp.positions)
  x, _ = rec.enter(params, cfg, h, R, inp.control_flow)
  o, _ = run_segment(p_mid, x, lo)
  if hi < cfg.n_layers:
    o, _ = run_segment(segment_params(params, hi, cfg.n_layers), o, hi)
  return head(params, cfg, o)


@pytest.fixture(scope="module")
def setup():
  cfg = tiny_cfg(l_start=1, l_end=2, n_layers=3)
  params = active_params(cfg, seed=11)
  tokens = jnp.asarray(random_tokens(cfg, 2, T, seed=3))
  return cfg, params, tokens


def _ce(logits, tokens):
  return cross_entropy(logits, next_token_labels(tokens))[0]


@pytest.mark.parametrize("d_f,d_b", [pytest.param(5, 2, marks=pytest.mark.slow), (4, 4)])
def test_gradient_matches_hand_unrolled_reference(setup, d_f, d_b):
  cfg, params, tokens = setup
  zeros = lambda: jax.tree.map(jnp.zeros_like, (segment_params(params, 1, 3), params["recurrence"]))
  deltas = [zeros() for _ in range(d_f)]
  ours = jax.grad(lambda p: _ce(forward(p, cfg, tokens, mode="jacobi", d_forward=d_f,
                                         d_backward=d_b), tokens))(params)
  ref_fn = lambda p, d, trunc: _ce(reference_logits(p, d, cfg, tokens, d_f, d_b, trunc), tokens)
  ref_grad = jax.jit(jax.grad(ref_fn, argnums=(0, 1)), static_argnums=2)
  ref, per_sweep = ref_grad(params, deltas, True)
  for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(ref)):
    np.testing.assert_allclose(a, b, atol=2e-6, rtol=1e-4)
  if d_b < d_f:
    # The probe: without truncation the early sweeps do carry gradient ...
    full, full_per_sweep = ref_grad(params, deltas, False)
    norm = lambda t: float(sum(jnp.sum(jnp.abs(x)) for x in jax.tree.leaves(t)))
    early = range(d_f - d_b)
    assert all(norm(full_per_sweep[s]) > 1e-6 for s in early)
    assert all(norm(per_sweep[s]) == 0.0 for s in early)
    assert all(norm(per_sweep[s]) > 1e-6 for s in range(d_f - d_b, d_f))
    # ... and ours is the truncated gradient, not the full one.
    w_ours = ours["recurrence"]["w_rec"]["kernel"]
    assert float(jnp.max(jnp.abs(w_ours - full["recurrence"]["w_rec"]["kernel"]))) > 1e-7


@pytest.mark.slow       # compiles four steps; slow step
def test_memory_flat_in_forward_depth(setup):
  """Peak temporary memory of the compiled train step does not grow with D_f."""
  cfg, params, _ = setup
  tokens = jnp.asarray(random_tokens(cfg, 4, 32))
  temp = {}
  for d_f, d_b in ((4, 2), (16, 2), (8, 4)):
    loss = lambda p: _ce(forward(p, cfg, tokens, mode="jacobi", d_forward=d_f, d_backward=d_b),
                         tokens)
    mem = jax.jit(jax.grad(loss)).lower(params).compile().memory_analysis()
    temp[(d_f, d_b)] = mem.temp_size_in_bytes
  assert temp[(16, 2)] <= 1.1 * temp[(4, 2)], temp
  assert temp[(8, 4)] > temp[(4, 2)], temp          # ... while D_b does cost memory
