"""Backbone layers: full-sequence attention equals a written-out reference (GQA, RoPE,
padding rows), the hand-written SwiGLU backward equals autodiff's, under every remat
policy and in bf16."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2mlr_jax import ModelConfig, forward
from t2mlr_jax.losses import cross_entropy, next_token_labels
from t2mlr_jax.model.layers import (
  KV,
  Attention,
  apply_rope,
  attend,
  attention_mask,
  from_cache,
  rope_tables,
  swiglu,
  to_cache,
)

from _util import active_params, random_tokens, tiny_cfg


def test_full_sequence_attention_matches_reference_and_padding_rows_are_zero():
  cfg = ModelConfig(vocab_size=16, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64,
                    max_seq_len=16, rope_theta=10000.0)
  B, T, N, Nk, K = 2, 7, 4, 2, 8
  x = jax.random.normal(jax.random.PRNGKey(0), (B, T, 32))
  valid = jnp.array([[False] * 3 + [True] * 4, [True] * 7])      # row 0 left-padded by 3
  positions = jnp.maximum(jnp.arange(T)[None] - jnp.array([[3], [0]]), 0)
  mask = attention_mask(jnp.broadcast_to(jnp.arange(T)[None], (B, T)), valid)
  rope = rope_tables(cfg, positions)
  attn = Attention(cfg)
  params = attn.init(jax.random.PRNGKey(1), x, rope, mask)["params"]
  y, kv = attn.apply({"params": params}, x, rope, mask)

  proj = lambda name, n: (x @ params[name]["kernel"]).reshape(B, T, n, K)
  q, k = apply_rope(proj("q", N), rope), apply_rope(proj("k", Nk), rope)
  v = proj("v", Nk)
  k_rep, v_rep = jnp.repeat(k, N // Nk, axis=2), jnp.repeat(v, N // Nk, axis=2)  # head n -> n // 2
  logits = jnp.einsum("btnk,bsnk->bnts", q, k_rep) / math.sqrt(K)
  logits = jnp.where(mask[:, None], logits, -jnp.inf)
  has_key = mask.any(-1)[:, None, :, None]
  probs = jnp.where(has_key, jax.nn.softmax(jnp.where(has_key, logits, 0.0), axis=-1), 0.0)
  ref = jnp.einsum("bnts,bsnk->btnk", probs, v_rep).reshape(B, T, N * K) @ params["o"]["kernel"]

  np.testing.assert_allclose(np.asarray(y), np.asarray(ref), atol=1e-6, rtol=1e-5)
  np.testing.assert_array_equal(np.asarray(y[0, :3]), 0.0)   # queries with no visible key
  np.testing.assert_allclose(np.asarray(kv.k), np.asarray(k), atol=1e-6)
  assert np.all(np.isfinite(np.asarray(y)))


@pytest.mark.parametrize("B", [pytest.param(1, marks=pytest.mark.slow), 2])
def test_cached_attention_token_by_token_equals_full_sequence(B):
  """The decode path (write the token's keys into a [B·N_kv, S, K] cache, attend over
  it) equals full-sequence attention row by row, padding rows included; the final
  cache holds the sequence's keys (`to_cache` / `from_cache` round trip)."""
  cfg = ModelConfig(vocab_size=16, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64,
                    max_seq_len=16, rope_theta=10000.0)
  T, S = 6, 9
  x = jax.random.normal(jax.random.PRNGKey(2), (B, T, 32))
  valid = jnp.array([[False] * 2 + [True] * 4, [True] * 6])[:B]     # row 0 left-padded by 2
  positions = jnp.maximum(jnp.arange(T)[None] - jnp.array([[2], [0]])[:B], 0)
  slots = jnp.broadcast_to(jnp.arange(T)[None], (B, T))
  rope = rope_tables(cfg, positions)
  attn = Attention(cfg)
  params = attn.init(jax.random.PRNGKey(3), x, rope, attention_mask(slots, valid))["params"]
  y_full, kv_full = attn.apply({"params": params}, x, rope, attention_mask(slots, valid))

  empty = jnp.zeros((B, 0, cfg.n_kv_heads, cfg.head_dim))
  cache = to_cache(KV(empty, empty), S)
  assert cache.k.shape == (B * cfg.n_kv_heads, S, cfg.head_dim)
  valid_S = jnp.pad(valid, ((0, 0), (0, S - T)))
  ys = []
  for t in range(T):
    mask = attention_mask(slots[:, t:t + 1], valid_S)
    rope_t = rope_tables(cfg, positions[:, t:t + 1])
    y, cache = attn.apply({"params": params}, x[:, t:t + 1], rope_t, mask, cache, t,
                          kv_source="cache")
    ys.append(y)
  np.testing.assert_allclose(np.asarray(jnp.concatenate(ys, 1)), np.asarray(y_full),
                             atol=1e-6, rtol=1e-5)
  back = from_cache(cache, B)
  np.testing.assert_allclose(np.asarray(back.k[:, :T]), np.asarray(kv_full.k), atol=1e-6)
  np.testing.assert_allclose(np.asarray(back.v[:, :T]), np.asarray(kv_full.v), atol=1e-6)
  np.testing.assert_array_equal(np.asarray(back.k[:, T:]), 0.0)
  np.testing.assert_allclose(np.asarray(to_cache(kv_full, S).k), np.asarray(cache.k), atol=1e-6)


@pytest.mark.parametrize("dtype,tol", [(jnp.float32, 1e-5), (jnp.bfloat16, 5e-2)])
def test_attend_value_and_gradients_equal_autodiff_of_jax_attention(dtype, tol):
  B, T, N, M, K = 2, 6, 6, 2, 8
  ks = jax.random.split(jax.random.PRNGKey(3), 4)
  q, k, v = (jax.random.normal(kk, (B, T, n, K)).astype(dtype)
             for kk, n in zip(ks[:3], (N, M, M)))
  probe = jax.random.normal(ks[3], (B, T, N, K))
  valid = jnp.array([[False, False] + [True] * 4, [True] * 6])
  mask = attention_mask(jnp.broadcast_to(jnp.arange(T)[None], (B, T)), valid)
  has_key = mask.any(-1)[:, :, None, None]

  def reference(q, k, v):
    out = jax.nn.dot_product_attention(q, k, v, mask=mask[:, None], implementation="xla")
    return jnp.where(has_key, out, 0)

  loss = lambda f: lambda *a: jnp.sum(f(*a, **({"mask_BTS": mask} if f is attend else {}))
                                      .astype(jnp.float32) * probe)
  y, y_ref = attend(q, k, v, mask), reference(q, k, v)
  assert y.dtype == dtype
  np.testing.assert_allclose(np.float32(y), np.float32(y_ref), atol=tol, rtol=tol)
  np.testing.assert_array_equal(np.float32(y[0, :2]), 0.0)
  g = jax.grad(loss(attend), argnums=(0, 1, 2))(q, k, v)
  g_ref = jax.grad(loss(reference), argnums=(0, 1, 2))(q, k, v)
  for a, b in zip(g, g_ref):
    assert a.dtype == b.dtype == dtype and a.shape == b.shape
    scale = float(jnp.max(jnp.abs(b.astype(jnp.float32))))
    np.testing.assert_allclose(np.float32(a), np.float32(b), atol=tol * scale, rtol=tol)


def _swiglu_autodiff(x, w_gate, w_up, w_down):
  return (jax.nn.silu(x @ w_gate) * (x @ w_up)) @ w_down


def _swiglu_args(dtype, B=2, T=5, D=8, F=12):
  ks = jax.random.split(jax.random.PRNGKey(0), 5)
  args = (jax.random.normal(ks[0], (B, T, D)), 0.3 * jax.random.normal(ks[1], (D, F)),
          0.3 * jax.random.normal(ks[2], (D, F)), 0.3 * jax.random.normal(ks[3], (F, D)))
  return tuple(a.astype(dtype) for a in args), jax.random.normal(ks[4], (B, T, D))


@pytest.mark.parametrize("dtype,tol", [(jnp.float32, 1e-5), (jnp.bfloat16, 5e-2)])
def test_swiglu_value_and_gradients_equal_autodiff(dtype, tol):
  args, probe = _swiglu_args(dtype)
  loss = lambda f: lambda *a: jnp.sum(f(*a).astype(jnp.float32) * probe)
  y_custom, y_auto = swiglu(*args), _swiglu_autodiff(*args)
  assert y_custom.dtype == y_auto.dtype == dtype
  np.testing.assert_allclose(np.float32(y_custom), np.float32(y_auto), atol=tol, rtol=tol)
  g_custom = jax.grad(loss(swiglu), argnums=(0, 1, 2, 3))(*args)
  g_auto = jax.grad(loss(_swiglu_autodiff), argnums=(0, 1, 2, 3))(*args)
  for gc, ga in zip(g_custom, g_auto):
    assert gc.dtype == ga.dtype == dtype and gc.shape == ga.shape
    scale = float(jnp.max(jnp.abs(ga.astype(jnp.float32))))
    np.testing.assert_allclose(np.float32(gc), np.float32(ga), atol=tol * scale, rtol=tol)


@pytest.mark.parametrize("remat", [pytest.param("full", marks=pytest.mark.slow),
                                   pytest.param("dots", marks=pytest.mark.slow)])
def test_remat_policies_give_the_same_jacobi_gradients(remat):
  cfg = tiny_cfg()
  params = active_params(cfg)
  tokens = random_tokens(cfg, 2, 10)

  def grads(c):
    def loss(p):
      logits = forward(p, c, tokens, mode="jacobi")
      return cross_entropy(logits, next_token_labels(tokens))[0]
    return jax.jit(jax.value_and_grad(loss))(params)

  (l0, g0), (l1, g1) = grads(cfg), grads(cfg.replace(remat=remat))
  assert abs(float(l0) - float(l1)) < 1e-6
  for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6, rtol=1e-5)
