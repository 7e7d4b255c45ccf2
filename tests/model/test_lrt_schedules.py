"""LRT's training schedules (model/interleaved.py): chunked and multi-refine agree with
the modes they must equal, and the loss weighs their passes as documented."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from model.test_recurrence_lrt import active, lrt_cfg
from t2mlr_jax import forward, loss
from t2mlr_jax.model import modes
from t2mlr_jax.model.recurrence import lrt
from t2mlr_jax.model.schedules.interleaved import pass_positions
from t2mlr_jax.model.sequence import context
from t2mlr_jax.model.transformer import LayerCtx, embed, head, run_layers

from _util import max_abs, random_tokens

T = 8


@pytest.fixture(scope="module")
def model():
  cfg = lrt_cfg()
  return cfg, active(cfg), random_tokens(cfg, 2, T)


def test_multi_refine_K_ge_T_is_exact_and_K_0_is_parallel(model):
  cfg, params, tokens = model
  exact = forward(params, cfg, tokens, mode="exact")
  for K in (T - 1, T):        # after K passes positions 0..K are exact
    assert max_abs(forward(params, cfg, tokens, mode="multi_refine", refine_passes=K),
                   exact) <= 1e-5
  short = forward(params, cfg, tokens, mode="multi_refine", refine_passes=2)
  assert max_abs(short[:, :3], exact[:, :3]) <= 1e-5 and max_abs(short, exact) > 1e-3
  np.testing.assert_array_equal(
      forward(params, cfg, tokens, mode="multi_refine", refine_passes=0),
      forward(params, cfg, tokens, mode="parallel"))


def test_chunk_size_one_is_exact(model):
  cfg, params, tokens = model
  assert max_abs(forward(params, cfg, tokens, mode="chunked", passes=T),
                 forward(params, cfg, tokens, mode="exact")) <= 1e-5


def _by_hand_refinement(params, cfg, tokens):
  """The zero-memory pass's source state H, then one full pass fed m[t] = H[t-1]."""
  tokens = jnp.asarray(tokens)
  inp = modes.seq_inputs(tokens)
  x0 = embed(params, cfg, tokens)
  ctx = context(params, cfg, inp, tokens, x0)
  layers = params["layers"]
  x, _ = run_layers(layers, cfg, x0, ctx, 0)
  H = lrt.carry(params, cfg, x, None, inp.control_flow)           # source -1: head input
  m = jnp.pad(H, ((0, 0), (1, 0), (0, 0)))[:, :-1]                # m[0] = 0
  ctx = LayerCtx(ctx.rope, ctx.mask, ctx.side._replace(memory=m))
  y, _ = run_layers(layers, cfg, x0, ctx, 0)
  return head(params, cfg, y)


def test_one_chunk_is_parallel_plus_one_refinement(model):
  cfg, params, tokens = model
  merged, aux = forward(params, cfg, tokens, mode="chunked", passes=1, return_aux=True)
  np.testing.assert_array_equal(aux["pass_logits"][0],
                                forward(params, cfg, tokens, mode="parallel"))
  assert max_abs(merged, _by_hand_refinement(params, cfg, tokens)) <= 1e-5


def test_chunks_are_contiguous_and_cover_the_sequence():
  sets = pass_positions(10, 3, "chunked")
  assert [list(s) for s in sets] == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
  assert [list(s) for s in pass_positions(10, 3)] == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]


def test_chunked_memory_crosses_only_chunk_boundaries(model):
  """With 2 chunks, the first position of chunk 2 reads the refined state of chunk 1's
  last position; inside a chunk, positions read the zero-memory pass's states."""
  cfg, params, tokens = model
  exact = forward(params, cfg, tokens, mode="exact")
  merged = forward(params, cfg, tokens, mode="chunked", passes=2)
  one_pass = forward(params, cfg, tokens, mode="multi_refine", refine_passes=1)
  # chunk 1 (positions 0..3) is exactly one refinement of the zero-memory pass
  assert max_abs(merged[:, :4], one_pass[:, :4]) <= 1e-5
  assert max_abs(merged[:, :2], exact[:, :2]) <= 1e-5 and max_abs(merged, exact) > 1e-3


@pytest.mark.slow       # slow step
def test_multi_refine_loss_weights_and_detach(model):
  cfg, params, tokens = model
  w = (0.1, 0.3, 0.6)
  value, aux = loss(params, cfg, tokens, mode="multi_refine", refine_passes=2,
                    refine_weights=w, return_aux=True)
  per = np.asarray(aux["per_pass_losses"])
  assert per.shape == (3,)
  assert float(value) == pytest.approx(float(np.dot(w, per) / sum(w)), rel=1e-6)
  uniform = loss(params, cfg, tokens, mode="multi_refine", refine_passes=2)
  assert float(uniform) == pytest.approx(float(per.mean()), rel=1e-6)
  assert aux["gate_means"].shape == (cfg.n_layers, 3)
  grads = [jax.grad(lambda p: loss(p, cfg, tokens, mode="multi_refine", refine_passes=2,
                                   refine_detach=d))(params) for d in (False, True)]
  gamma = [g["layers"]["memory"]["gamma"] for g in grads]
  assert max_abs(*gamma) > 1e-6          # detaching the memory changes the gradient


def test_interleaved_and_chunked_losses_average_their_passes(model):
  cfg, params, tokens = model
  for mode in ("interleaved", "chunked"):
    value, aux = loss(params, cfg, tokens, mode=mode, passes=3, return_aux=True)
    per = np.asarray(aux["per_pass_losses"])
    assert per.shape == (4,) and float(value) == pytest.approx(float(per.mean()), rel=1e-6)


@pytest.mark.parametrize("kw,match", [
    (dict(mode="multi_refine", refine_passes=2, refine_weights=(1.0, 1.0)), "refine_weights"),
    (dict(mode="multi_refine", passes=2), "passes is not an option of mode='multi_refine'"),
    (dict(mode="chunked", passes=T + 1), "passes"),
    (dict(mode="chunked", d_forward=3), "d_forward is not an option of mode='chunked'"),
    (dict(mode="interleaved", refine_passes=-1), "refine_passes"),
])
def test_bad_schedule_options(model, kw, match):
  cfg, params, tokens = model
  with pytest.raises(ValueError, match=match):
    forward(params, cfg, tokens, **kw)
