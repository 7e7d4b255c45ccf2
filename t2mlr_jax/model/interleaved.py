"""LRT's training schedules: interleaved (SPEC §4; golden/README.md "Interleaved
training"), and the paper's two baselines, chunked and multi-refine (their semantics are
ours: see `chunked` and `multi_refine`).

Pass 0 runs every position with zero memory and keeps, per layer, the keys (after the
gate mix, RoPE and QK-norm) and values (after the mix) of the whole sequence. Pass
p = 1..S runs only the positions t ≡ p−1 (mod S), with m[t] = H[t−1] from the current
merged normed source state H; in every layer their fresh keys/values overwrite the
buffer at those rows before their queries attend over the whole buffer, and their
source state overwrites H there. Nothing is detached. The S passes together push each
position through the model once, so a step costs about twice a plain one.

K/V refresh (optional): before each pass p >= 1, at the positions no pass has visited
yet, V += g_fb0·Δ(W_v m′) and the pre-RoPE keys += g_fb0·Δ(W_k m′), then RoPE and the
norm again; m′ = shift(H) at that moment, Δ the change since the previous refresh,
g_fb0 the pass-0 gate.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from t2mlr_jax.config import ModelConfig
from t2mlr_jax.sharding import constrain_batch
from t2mlr_jax.model.layers import KV, apply_rope, rms_normalize, rope_tables
from t2mlr_jax.model.modes import ModeOut, SeqInputs, _context, _segments, side_inputs
from t2mlr_jax.model.recurrence import lrt
from t2mlr_jax.model.transformer import LayerCtx, embed, head, run_layers


def pass_positions(T: int, passes: int, mode: str = "interleaved") -> tuple:
  """The positions of passes 1..S: interleaved, t ≡ p−1 (mod S) (uneven passes when
  S ∤ T); chunked, S contiguous chunks in order (sizes differ by at most one)."""
  if not 1 <= passes <= T:
    raise ValueError(f"passes={passes!r} is invalid: allowed 1 <= passes <= T={T} "
                     "(the sequence length)")
  if mode == "chunked":
    return tuple(np.array_split(np.arange(T), passes))
  return tuple(np.arange(p, T, passes) for p in range(passes))


def shifted_memory(cfg: ModelConfig, H_BTD, inp: SeqInputs):
  """m[t] = H[t−1] as position t reads it (reset, control flow)."""
  B, T, _ = H_BTD.shape
  Hs = jnp.pad(H_BTD, ((0, 0), (1, 0), (0, 0)))[:, :-1]
  slots = jnp.broadcast_to(jnp.arange(T)[None], (B, T))
  return lrt.memory(cfg, lrt.read(cfg, Hs, inp.positions, slots), inp.control_flow)


def _feedback_weights(params, cfg: ModelConfig, name: str):
  """[L, D, N_kv·K] W_k or W_v of every layer (the shared pair broadcast)."""
  if cfg.recurrence.projection == "shared":
    w = params["recurrence"][name]
    return jnp.broadcast_to(w, (cfg.n_layers, *w.shape))
  return params["layers"]["memory"][name]


def _refresh(params, cfg, inp, rope, buf: KV, k_pre, g_fb, old, H, unvisited):
  """One K/V refresh of the unvisited rows; returns (buffer, k_pre, (k_old, v_old))."""
  rcfg = cfg.recurrence
  L, B, T, M, K = buf.k.shape
  m = shifted_memory(cfg, H, inp)
  u = jnp.asarray(unvisited)[None, None, :, None, None]
  g = g_fb[..., None]                                              # [L, B, T, M, 1]
  project = lambda name: jnp.einsum("btd,lde->lbte", m, _feedback_weights(params, cfg, name)
                                   ).reshape(L, B, T, M, K)
  k_new = project("w_k") if rcfg.key else None
  v_new = project("w_v") if rcfg.value else None
  k_old, v_old = old
  keys, values = buf.k, buf.v
  if v_new is not None:
    values = values + (g * (v_new - v_old) * u).astype(values.dtype)
  if k_new is not None:
    k_pre = k_pre + (g * (k_new - k_old) * u).astype(k_pre.dtype)
    k_rot = jax.vmap(lambda k: apply_rope(k, rope))(k_pre)
    if cfg.qk_norm:
      k_rot = rms_normalize(k_rot, cfg.rms_norm_eps).astype(k_pre.dtype)
    keys = jnp.where(u, k_rot.astype(keys.dtype), keys)
  return KV(keys, values), k_pre, (k_new, v_new)


def _gate_means(inter, layers: int):
  """[L, 3] mean (local, fb, ve) gates from the per-segment collections of one pass."""
  parts = [jnp.reshape(i["memory"]["gates"][0], (-1, 3)) for i in inter]
  out = jnp.concatenate(parts)
  assert out.shape[0] == layers
  return jax.lax.stop_gradient(out)


def refine_in_passes(params, cfg: ModelConfig, tokens_BT, inp: SeqInputs, sets: tuple,
                     kv_refresh: bool):
  """Pass 0 over every position, then one pass per position set in `sets` (the
  interleaved and chunked schedules). ModeOut: merged logits [B, T, V] (each position
  from the last pass that computed it); aux: pass_logits (pass 0 [B, T, V], pass p
  [B, |P_p|, V]), h_final [B, T, D] (the merged memory source after the last pass) and
  gate_means [L, 3] (local, fb, ve; the refined passes' gates, position-weighted)."""
  B, T = tokens_BT.shape
  x0 = embed(params, cfg, tokens_BT)
  ctx = _context(params, cfg, inp, tokens_BT, x0)._replace(collect=True)
  if kv_refresh:
    ctx = ctx._replace(side=ctx.side._replace(keep=True))
  segs = _segments(params, cfg)
  span_end = cfg.recurrent_block[1]

  # Pass 0: every position, zero memory; keep every layer's keys/values.
  x, bufs, H = x0, [], None
  for name, lo, hi in cfg.segments:
    x, (out, _) = run_layers(segs[name][1], cfg, x, ctx, lo)
    bufs.append(out)
    if lo <= span_end < hi:
      H = constrain_batch(lrt.carry(params, cfg, x, None, inp.control_flow))
  logits0 = head(params, cfg, x)
  bufs = jax.tree.map(lambda *a: jnp.concatenate(a), *bufs)
  if kv_refresh:
    buf, (k_pre, g_fb) = bufs
    zero = jnp.zeros(buf.k.shape, jnp.float32)
    old = (zero, zero)
  else:
    buf = bufs
  visited = np.zeros(T, bool)

  merged, pass_logits, gates = logits0, [logits0], 0.0
  for P in sets:
    if kv_refresh:
      buf, k_pre, old = _refresh(params, cfg, inp, ctx.rope, buf, k_pre, g_fb, old, H,
                                 ~visited)
    m = shifted_memory(cfg, H, inp)[:, P]
    pos_P = inp.positions[:, P]
    dist = (P[:, None] - np.arange(T)[None, :])[None]
    side = side_inputs(params, cfg, x0[:, P], tokens_BT[:, P], dist, m)
    per_layer = jax.tree.map(lambda a: a[:, :, P], ctx.per_layer)    # [L, B, |P|, ...]
    pctx = LayerCtx(rope_tables(cfg, pos_P), ctx.mask[:, P], side, per_layer, collect=True)
    x, new_bufs, inter = x0[:, P], [], []
    for name, lo, hi in cfg.segments:
      layer_buf = jax.tree.map(lambda a: a[lo:hi], buf)
      x, (nb, collected) = run_layers(segs[name][1], cfg, x, pctx, lo, layer_buf, P)
      new_bufs.append(nb)
      inter.append(collected)
      if lo <= span_end < hi:
        H = constrain_batch(H.at[:, P].set(lrt.carry(params, cfg, x, None,
                                                     inp.control_flow[:, P])))
    buf = jax.tree.map(lambda *a: jnp.concatenate(a), *new_bufs)
    logits = head(params, cfg, x)
    pass_logits.append(logits)
    merged = merged.at[:, P].set(logits)
    gates = gates + _gate_means(inter, cfg.n_layers) * (len(P) / T)
    visited[P] = True
  return ModeOut(merged, {"pass_logits": tuple(pass_logits), "h_final": H,
                          "gate_means": gates})


def interleaved(params, cfg: ModelConfig, tokens_BT, inp: SeqInputs, passes: int,
                kv_refresh: bool):
  """LRT's interleaved schedule (SPEC §4): pass p runs t ≡ p−1 (mod S)."""
  sets = pass_positions(tokens_BT.shape[1], passes, "interleaved")
  return refine_in_passes(params, cfg, tokens_BT, inp, sets, kv_refresh)


def chunked(params, cfg: ModelConfig, tokens_BT, inp: SeqInputs, passes: int,
            kv_refresh: bool):
  """The chunked baseline: pass c refines the c-th of S contiguous chunks, in order.

  The same passes as `interleaved` over contiguous position sets. A chunk reads the
  merged memory: the refined state of the chunks before it, and pass 0's zero-memory
  state inside itself, so the true recurrence crosses only chunk boundaries. With
  chunks of one position this is `exact`; with one chunk, `parallel` plus one full
  refinement pass fed the shifted pass-0 state.
  """
  sets = pass_positions(tokens_BT.shape[1], passes, "chunked")
  return refine_in_passes(params, cfg, tokens_BT, inp, sets, kv_refresh)


def multi_refine(params, cfg: ModelConfig, tokens_BT, inp: SeqInputs, refine_passes: int,
                 refine_detach: bool):
  """Multi-refine: pass 0 with zero memory, then K full passes, pass k fed m = shift(H)
  of pass k−1 (with refine_detach, under stop_gradient). After K passes positions
  0..K are exact; K >= T−1 is `exact`, K = 0 is `parallel`. The K passes run in one
  `lax.scan`, so compile time does not grow with K. ModeOut: the last pass's logits;
  aux: pass_logits [K+1, B, T, V], h_final [B, T, D], gate_means [L, 3] (last pass)."""
  x0 = embed(params, cfg, tokens_BT)
  ctx = _context(params, cfg, inp, tokens_BT, x0)._replace(collect=True)
  segs = _segments(params, cfg)
  span_end = cfg.recurrent_block[1]

  def full_pass(memory):
    c = ctx._replace(side=ctx.side._replace(memory=memory))
    x, H, inter = x0, None, []
    for name, lo, hi in cfg.segments:
      x, (_, collected) = run_layers(segs[name][1], cfg, x, c, lo)
      inter.append(collected)
      if lo <= span_end < hi:
        H = constrain_batch(lrt.carry(params, cfg, x, None, inp.control_flow))
    return head(params, cfg, x), H, _gate_means(inter, cfg.n_layers)

  logits0, H, gates = full_pass(ctx.side.memory)

  def refine(carry, _):
    H, _ = carry
    src = jax.lax.stop_gradient(H) if refine_detach else H
    logits, H, gates = full_pass(shifted_memory(cfg, src, inp))
    return (H, gates), logits

  if refine_passes:
    (H, gates), logits = jax.lax.scan(refine, (H, gates), None, length=refine_passes)
    pass_logits = jnp.concatenate([logits0[None], logits])
  else:
    pass_logits = logits0[None]
  return ModeOut(pass_logits[-1], {"pass_logits": pass_logits, "h_final": H,
                                   "gate_means": gates})
