"""The decoder stack: parameters, embedding/head, and the one way to run layers.

All L layers' parameters live in one stacked tree (leading axis L), so the
layout does not depend on where the recurrent span sits; a recurrence's per-layer
parameters (LRT) live inside it too. A forward pass cuts it into contiguous segments
(below / inside / above the recurrent span, `split_segments`). `run_layers` runs any
run of layers: a stacked tree with `lax.scan` over the same `Block` (compile time does
not grow with depth), or a tuple of per-layer trees unrolled (the recurrent span
inside loops: Jacobi sweeps, tokens, where a scan would re-slice the weights at every
step); over the sequence's own keys, a decode cache, or a full-length key buffer.
"""

from __future__ import annotations

import functools
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

from t2mlr_jax.config import ModelConfig
from t2mlr_jax.model import recurrence
from t2mlr_jax.model.block import Block
from t2mlr_jax.model.kernels import KernelInputs
from t2mlr_jax.model.layers import (
  LayerSide,
  Rope,
  compute_dtype,
  final_norm,
  rms_normalize,
  rope_tables,
)
from t2mlr_jax.sharding import constrain_batch

# Leaves of the backbone weight decay leaves alone (`train/optimizer.py`): norm scales,
# biases, nanochat's per-layer α / β; a recurrence type declares its own.
NO_DECAY = ("scale", "bias", "resid_lambda", "x0_lambda")
# The backbone's partition rows (`sharding.param_rules`): parameter path regex -> logical
# axis per dimension; a recurrence type declares its own.
PARTITION_RULES = (
    (r"embed/embedding$", ("vocab", "embed")),
    (r"lm_head/kernel$", ("embed", "vocab")),
    (r"attn/q/kernel$", ("layers", "embed", "q_heads")),
    (r"attn/(k|v)/kernel$", ("layers", "embed", "kv_heads")),
    (r"attn/q/bias$", ("layers", "q_heads")),
    (r"attn/(k|v)/bias$", ("layers", "kv_heads")),
    (r"attn/o/kernel$", ("layers", "q_heads", "embed")),
    (r"mlp/(gate|up)/kernel$", ("layers", "embed", "mlp")),
    (r"mlp/down/kernel$", ("layers", "mlp", "embed")),
    (r"value_embeds/embedding$", (None, "vocab", "embed")),   # nanochat's tables
)


@functools.partial(jax.jit, static_argnums=0)
def init_params(cfg: ModelConfig, rng) -> dict:
  """Fresh parameters: N(0, init_std) weights, unit norms, and the recurrence's own
  init (T2MLR: identity, γ = 0; LRT: `LRTConfig.init`)."""
  k_embed, k_layers, k_head, k_rec = jax.random.split(rng, 4)
  k_ve = jax.random.fold_in(k_embed, 1)
  D, T0, V = cfg.d_model, 1, cfg.padded_vocab
  dummy_x = jnp.zeros((1, T0, D), jnp.float32)
  dummy_mask = jnp.ones((1, T0, T0), bool)
  rope = rope_tables(cfg, jnp.zeros((1, T0), jnp.int32))
  side = init_side(cfg, dummy_x, jnp.zeros((1, T0), jnp.int32))
  init_block = lambda k: Block(cfg).init(k, dummy_x, rope, dummy_mask, None, None,
                                         side)["params"]
  params = {
      "embed": {"embedding": cfg.init_std * jax.random.normal(k_embed, (V, D), jnp.float32)},
      "layers": jax.vmap(init_block)(jax.random.split(k_layers, cfg.n_layers)),
  }
  if cfg.norm_scale:
    params["final_norm"] = {"scale": jnp.ones((D,), jnp.float32)}
  if cfg.value_embeds is not None:
    n, kv = len(cfg.value_embed_layers), cfg.n_kv_heads * cfg.head_dim
    params["value_embeds"] = {
        "embedding": cfg.init_std * jax.random.normal(k_ve, (n, V, kv), jnp.float32),
        "gate": jnp.zeros((n, cfg.ve_gate_channels or D, cfg.n_kv_heads), jnp.float32)}
  if not cfg.tie_embeddings:
    params["lm_head"] = {"kernel": cfg.init_std * jax.random.normal(
        k_head, (D, V), jnp.float32)}
  if cfg.recurrence is not None:
    rec_params = recurrence.init_params(cfg, k_rec)
    if rec_params is not None:
      params["recurrence"] = rec_params
  return params


def init_side(cfg: ModelConfig, x_BTD, tokens_BT) -> Optional[LayerSide]:
  """A LayerSide with every input this config's layers read (for `init_params`)."""
  uses_memory = recurrence.uses_memory(cfg)
  if not (cfg.x0_lambdas or uses_memory):
    return None
  shared = None
  if uses_memory:
    rec_params = jax.eval_shape(lambda: recurrence.init_params(cfg, jax.random.PRNGKey(0)))
    shared = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), rec_params)
  return LayerSide(x0=x_BTD, memory=x_BTD if uses_memory else None,
                   tokens=tokens_BT if uses_memory else None, shared=shared)


def embed(params, cfg: ModelConfig, tokens_BT):
  """Token embeddings (normed when `embed_norm`): x0 of the stream."""
  x = params["embed"]["embedding"][tokens_BT]
  if cfg.embed_norm:
    x = rms_normalize(x, cfg.rms_norm_eps)
  return x.astype(compute_dtype(cfg))


def head(params, cfg: ModelConfig, x_BTD):
  """Final RMSNorm and LM head; fp32 logits [B, T, V] (padded rows dropped, softcapped
  when `logit_softcap`)."""
  dt = compute_dtype(cfg)
  x = final_norm(params, cfg, x_BTD)
  # fp32 accumulation and output (a bf16 model's logits are not rounded to bf16 first)
  with jax.named_scope("lm_head"):
    if cfg.tie_embeddings:     # contract with the [V, D] table directly: no transposed copy
      logits = jnp.einsum("btd,vd->btv", x, params["embed"]["embedding"].astype(dt),
                          preferred_element_type=jnp.float32)
    else:
      logits = jnp.einsum("btd,dv->btv", x, params["lm_head"]["kernel"].astype(dt),
                          preferred_element_type=jnp.float32)
  if cfg.padded_vocab != cfg.vocab_size:
    logits = logits[..., :cfg.vocab_size]
  if cfg.logit_softcap is not None:
    c = cfg.logit_softcap
    logits = c * jnp.tanh(logits / c)
  return logits


def segment_params(params, lo: int, hi: int):
  """Layers lo..hi-1 of the stacked layer tree (static slice)."""
  return jax.tree.map(lambda a: a[lo:hi], params["layers"])


def _remat(cfg: ModelConfig, fn):
  if cfg.remat == "full":
    return jax.checkpoint(fn)
  if cfg.remat == "dots":
    return jax.checkpoint(fn, policy=jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims)
  return fn


class LayerCtx(NamedTuple):
  """What every layer of one call shares: RoPE tables, the attention mask, side inputs;
  per_layer: inputs with a leading axis over all L layers (`value_embed_inputs`);
  collect (static): `run_layers` also returns each layer's sown "intermediates"."""
  rope: Optional[Rope]
  mask: jnp.ndarray
  side: Optional[LayerSide] = None
  per_layer: Optional[tuple] = None
  collect: bool = False
  kernel_inputs: Optional[KernelInputs] = None    # what fused attention kernels mask with


def value_embed_inputs(params, cfg: ModelConfig, tokens_BT) -> Optional[tuple]:
  """Per-layer value-embedding inputs, gathered once per call (not once per layer call or
  per training pass: the gradient then meets each table in one scatter). nanochat's
  `value_embeds`: (rows [L, B, T, N_kv·K], gate kernels [L, C, N_kv]), zeros on the
  layers without a table (adding zero leaves their values as they are). LRT's
  `recurrence.value_embeds`: (rows [L, B, T, N_kv·K],). None when neither."""
  if cfg.recurrence is not None:
    rows = recurrence.of(cfg).value_embed_rows(params, cfg, tokens_BT)
    if rows is not None:
      return rows
  if cfg.value_embeds is None:
    return None
  ve = params["value_embeds"]
  idx = jnp.asarray(cfg.value_embed_layers)
  rows = ve["embedding"][:, tokens_BT]                               # [n, B, T, kv]
  L = cfg.n_layers
  rows = jnp.zeros((L, *rows.shape[1:]), rows.dtype).at[idx].set(rows)
  gates = jnp.zeros((L, *ve["gate"].shape[1:]), jnp.float32).at[idx].set(ve["gate"])
  return rows, gates


def run_layers(layers, cfg: ModelConfig, x_BTD, ctx: LayerCtx, first: int, kvs=None,
               index=None, keep_last: bool = False, kv_source: Optional[str] = None):
  """Run layers first, first+1, ... over x; returns (x, per-layer keys/values).

  `layers`: a stacked tree [n, ...] (run with `lax.scan` when cfg.scan_layers; outputs
  stacked [n, ...]) or a tuple of per-layer trees (`split_segments`, unrolled; outputs a
  tuple). `kvs`: None (each layer attends over its own keys), per-layer decode caches
  [B·N_kv, S, K] with `index` the slot to write, or per-layer key buffers [B, S, N_kv, K]
  with `index` the rows to overwrite; in the same form as `layers`. With `ctx.collect`
  each layer's output is (keys/values, its "intermediates" collection). With keep_last,
  each layer's output also holds its hidden state at the last position, (kv, [B, 1, D]):
  a tap between layers of one scan, without cutting the stacked weights (a copy).
  """
  block = Block(cfg)

  def layer(x, p, kv, window, ve=None):
    args = (x, ctx.rope, ctx.mask, kv, index, ctx.side, window, ve, ctx.kernel_inputs, kv_source)
    if not ctx.collect:
      y, out = block.apply({"params": p}, *args)
    else:
      (y, out), state = block.apply({"params": p}, *args, mutable=["intermediates"])
      out = (out, state.get("intermediates", {}))
    y = constrain_batch(y)
    return y, ((out, y[:, -1:]) if keep_last else out)

  layer = _remat(cfg, layer)
  unrolled = isinstance(layers, tuple)
  n = len(layers) if unrolled else jax.tree.leaves(layers)[0].shape[0]
  wins = None if cfg.layer_windows is None else cfg.layer_windows[first:first + n]
  ve = None if ctx.per_layer is None else jax.tree.map(lambda a: a[first:first + n],
                                                       ctx.per_layer)
  if not unrolled and cfg.scan_layers:
    if wins is not None and len(set(wins)) == 1:
      w = wins[0]
      return jax.lax.scan(lambda x, xs: layer(x, xs[0], xs[1], w, xs[2]), x_BTD,
                          (layers, kvs, ve))
    xs = (layers, kvs, None if wins is None else jnp.asarray(wins, jnp.int32), ve)
    return jax.lax.scan(lambda x, xs: layer(x, *xs), x_BTD, xs)
  outs = []
  for i in range(n):
    p = layers[i] if unrolled else jax.tree.map(lambda a: a[i], layers)
    kv = None if kvs is None else (kvs[i] if unrolled else jax.tree.map(lambda a: a[i], kvs))
    ve_i = None if ve is None else jax.tree.map(lambda a: a[i], ve)
    x_BTD, out = layer(x_BTD, p, kv, None if wins is None else wins[i], ve_i)
    outs.append(out)
  return x_BTD, (tuple(outs) if unrolled else jax.tree.map(lambda *a: jnp.stack(a), *outs))


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def split_segments(layer_params, parts: tuple) -> tuple:
  """Cut the stacked layer tree into contiguous segments.

  `parts`: ((lo, hi, unrolled), ...) covering 0..L in order. A segment is a stacked tree
  [hi-lo, ...] or, when unrolled, a tuple of per-layer trees (both for `run_layers`). The backward concatenates the segments' gradients
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


def split_layers(layer_params) -> tuple:
  """A stacked layer tree as one tree per layer, for token-by-token loops.

  Inside a loop, slicing a stacked tree copies every layer's weights at every step
  (doubling the memory traffic of a memory-bound decode). Split once before the loop
  (an optimisation barrier keeps XLA from re-slicing inside it); `run_layers` then
  runs the same Block over each layer's own buffers.
  """
  n = jax.tree.leaves(layer_params)[0].shape[0]
  return jax.lax.optimization_barrier(split_segments(layer_params, ((0, n, True),))[0])
