"""The decoder stack: parameters, embedding/head, and segments of the layer stack.

All L layers' parameters live in one stacked tree (leading axis L), so the
layout does not depend on where the recurrent block sits. A forward pass cuts it
into contiguous segments (below / inside / above the recurrent block,
`split_segments`) and runs the outer ones with `lax.scan` over the same `Block`, so
compile time does not grow with depth. The recurrent block, which loops (Jacobi
sweeps, tokens), runs unrolled over per-layer weights split once (`run_unrolled`,
`run_cached`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from t2mlr_jax.config import ModelConfig
from t2mlr_jax.model import recurrence
from t2mlr_jax.model.layers import Block, RMSNorm, compute_dtype, rope_tables


@functools.partial(jax.jit, static_argnums=0)
def init_params(cfg: ModelConfig, rng) -> dict:
  """Fresh parameters: N(0, init_std) weights, unit norms, identity recurrence (γ = 0)."""
  k_embed, k_layers, k_head, k_rec = jax.random.split(rng, 4)
  D, T0 = cfg.d_model, 1
  dummy_x = jnp.zeros((1, T0, D), jnp.float32)
  dummy_mask = jnp.ones((1, T0, T0), bool)
  rope = rope_tables(cfg, jnp.zeros((1, T0), jnp.int32))
  init_block = lambda k: Block(cfg).init(k, dummy_x, rope, dummy_mask)["params"]
  params = {
      "embed": {"embedding": cfg.init_std * jax.random.normal(
          k_embed, (cfg.vocab_size, D), jnp.float32)},
      "layers": jax.vmap(init_block)(jax.random.split(k_layers, cfg.n_layers)),
      "final_norm": {"scale": jnp.ones((D,), jnp.float32)},
  }
  if not cfg.tie_embeddings:
    params["lm_head"] = {"kernel": cfg.init_std * jax.random.normal(
        k_head, (D, cfg.vocab_size), jnp.float32)}
  if cfg.recurrence is not None:
    params["recurrence"] = recurrence.init_params(cfg, k_rec)
  return params


def embed(params, cfg: ModelConfig, tokens_BT):
  return params["embed"]["embedding"][tokens_BT].astype(compute_dtype(cfg))


def head(params, cfg: ModelConfig, x_BTD):
  """Final RMSNorm and LM head; fp32 logits [B, T, V]."""
  dt = compute_dtype(cfg)
  x = RMSNorm(cfg.rms_norm_eps, dt).apply({"params": params["final_norm"]}, x_BTD)
  if cfg.tie_embeddings:     # contract with the [V, D] table directly: no transposed copy
    return jnp.einsum("btd,vd->btv", x, params["embed"]["embedding"].astype(dt)
                      ).astype(jnp.float32)
  return jnp.einsum("btd,dv->btv", x, params["lm_head"]["kernel"].astype(dt)
                    ).astype(jnp.float32)


def segment_params(params, lo: int, hi: int):
  """Layers lo..hi-1 of the stacked layer tree (static slice)."""
  return jax.tree.map(lambda a: a[lo:hi], params["layers"])


def _remat(cfg: ModelConfig, fn):
  if cfg.remat == "full":
    return jax.checkpoint(fn)
  if cfg.remat == "dots":
    return jax.checkpoint(fn, policy=jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims)
  return fn


def run_segment(layer_params, cfg: ModelConfig, x_BTD, rope, mask_BTS):
  """Run a stacked slice of layers over a full sequence with `lax.scan`; returns
  (x, the layers' keys/values [n, B, T, N_kv, K])."""
  block = Block(cfg)

  def layer(x, p):
    return block.apply({"params": p}, x, rope, mask_BTS)

  layer = _remat(cfg, layer)
  n = jax.tree.leaves(layer_params)[0].shape[0]
  if cfg.scan_layers:
    return jax.lax.scan(layer, x_BTD, layer_params)
  outs = []
  for i in range(n):
    x_BTD, out = layer(x_BTD, jax.tree.map(lambda a: a[i], layer_params))
    outs.append(out)
  return x_BTD, jax.tree.map(lambda *a: jnp.stack(a), *outs)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def split_segments(layer_params, parts: tuple) -> tuple:
  """Cut the stacked layer tree into contiguous segments.

  `parts`: ((lo, hi, unrolled), ...) covering 0..L in order. A segment is a stacked tree
  [hi-lo, ...] (for `run_segment`) or, when unrolled, a tuple of per-layer trees (for
  `run_unrolled` / `run_cached`). The backward concatenates the segments' gradients
  once: the transpose of separate static slices is one full-size pad and add per
  segment, 6% of a 135M Jacobi training step.
  """
  out = []
  for lo, hi, unrolled in parts:
    if unrolled:
      out.append(tuple(jax.tree.map(lambda a: a[i], layer_params) for i in range(lo, hi)))
    else:
      out.append(jax.tree.map(lambda a: a[lo:hi], layer_params))
  return tuple(out)


def _split_segments_fwd(layer_params, parts):
  return split_segments(layer_params, parts), None


def _split_segments_bwd(parts, _, grads):
  pieces = [jax.tree.map(lambda *g: jnp.stack(g), *g_seg) if unrolled else g_seg
            for (_, _, unrolled), g_seg in zip(parts, grads)]
  return (jax.tree.map(lambda *g: jnp.concatenate(g), *pieces),)


split_segments.defvjp(_split_segments_fwd, _split_segments_bwd)


def run_unrolled(layers: tuple, cfg: ModelConfig, x_BTD, rope, mask_BTS):
  """A full sequence through per-layer weights (`split_segments`), unrolled; returns
  (x, keys/values [n, B, T, N_kv, K]). For the recurrent block inside Jacobi sweeps,
  where a scan would re-slice (copy) the stacked weights at every sweep."""
  block = Block(cfg)
  layer = _remat(cfg, lambda x, p: block.apply({"params": p}, x, rope, mask_BTS))
  kvs = []
  for p in layers:
    x_BTD, kv = layer(x_BTD, p)
    kvs.append(kv)
  return x_BTD, jax.tree.map(lambda *a: jnp.stack(a), *kvs)


def split_layers(layer_params) -> tuple:
  """A stacked layer tree as one tree per layer, for token-by-token loops.

  Inside a loop, slicing a stacked tree copies every layer's weights at every step
  (doubling the memory traffic of a memory-bound decode). Split once before the loop
  (an optimisation barrier keeps XLA from re-slicing inside it); `run_cached` then
  runs the same Block over each layer's own buffers.
  """
  n = jax.tree.leaves(layer_params)[0].shape[0]
  return jax.lax.optimization_barrier(split_segments(layer_params, ((0, n, True),))[0])


def run_cached(layers: tuple, cfg: ModelConfig, x_B1D, rope, mask_B1S, caches: tuple, index):
  """One token through per-layer weights (`split_layers`) and per-layer KV caches
  ([B·N_kv, S, K], `layers.to_cache`); returns (x, the caches with the token's keys
  written at slot `index`). Unrolled: each cache is updated in place in a loop carry."""
  block, out = Block(cfg), []
  layer = _remat(cfg, lambda x, p, cache: block.apply({"params": p}, x, rope, mask_B1S, cache,
                                                      index))
  for p, cache in zip(layers, caches):
    x_B1D, cache = layer(x_B1D, p, cache)
    out.append(cache)
  return x_B1D, tuple(out)
