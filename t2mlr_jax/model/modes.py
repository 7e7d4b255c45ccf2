"""One parameter set, several ways to run it (SPEC §3, §4, §10).

- `parallel`:    every position at once with no memory (T2MLR: the plain transformer;
                 LRT: the release's full pass, m = 0).
- `exact`:       the true recurrence, for every recurrence type through the interface
                 of `recurrence/__init__.py`. Layers below the recurrent span and
                 above it run in parallel over the sequence; only the span runs token
                 by token (`lax.scan` over time with its KV cache).
- `jacobi`:      T2MLR's training schedule. Sweep 0 and the no-gradient sweeps inside
                 a `fori_loop` (or a tolerance-stopped `while_loop`) on stop-gradient
                 inputs and parameters; the last D_b sweeps with gradient; then the
                 final pass.
- `interleaved`, `chunked`, `multi_refine`: LRT's training schedules (`interleaved.py`).
The decode mode (prefill + one token per step) lives in `decode.py`.
"""

from __future__ import annotations

import functools
from typing import NamedTuple, Optional

import chex
import jax
import jax.numpy as jnp
import numpy as np

from t2mlr_jax.config import LRTConfig, ModelConfig, T2MLRConfig
from t2mlr_jax.sharding import constrain_batch
from t2mlr_jax.model import kernels, recurrence
from t2mlr_jax.model import transformer
from t2mlr_jax.model.layers import (KV, LayerSide, Rope, attention_mask, from_cache,
                                    rope_tables, to_cache)
from t2mlr_jax.model.recurrence import t2mlr as rec
from t2mlr_jax.model.transformer import LayerCtx, embed, head, value_embed_inputs

MODES = ("parallel", "exact", "jacobi", "interleaved", "chunked", "multi_refine")
# Each recurrence type's training schedules, its default first.
TRAINING_MODES = {T2MLRConfig: ("jacobi",), LRTConfig: ("interleaved", "chunked", "multi_refine")}
# The options of each training mode (forward/loss keyword arguments; config defaults).
MODE_OPTIONS = {"jacobi": ("d_forward", "d_backward", "jacobi_tol"),
                "interleaved": ("passes", "kv_refresh"), "chunked": ("passes", "kv_refresh"),
                "multi_refine": ("refine_passes", "refine_weights", "refine_detach")}
ALL_OPTIONS = tuple(dict.fromkeys(o for opts in MODE_OPTIONS.values() for o in opts))


class ModeOut(NamedTuple):
  """What every mode returns. logits [B, T, V] fp32 ([B, 1, V] with last_only); aux: the
  mode's metrics; kvs: {segment: stacked keys/values} and state [B, D]: the recurrent
  state after the last position (the modes a prefill can use)."""
  logits: jnp.ndarray
  aux: dict
  kvs: Optional[dict] = None
  state: Optional[jnp.ndarray] = None


class SeqInputs(NamedTuple):
  """Per-token side inputs, all [B, T] int32."""
  control_flow: jnp.ndarray
  positions: jnp.ndarray
  segment_ids: Optional[jnp.ndarray]


def positions_from_segments(segment_ids_BT):
  """Position ids restarting at 0 wherever the segment id changes."""
  B, T = segment_ids_BT.shape
  t = jnp.arange(T)[None, :]
  start = jnp.concatenate(
      [jnp.ones((B, 1), bool), segment_ids_BT[:, 1:] != segment_ids_BT[:, :-1]], axis=1)
  return t - jax.lax.cummax(jnp.where(start, t, 0), axis=1)


def side_inputs(params, cfg: ModelConfig, x0, tokens, dist, memory=None) -> Optional[LayerSide]:
  """The LayerSide this config's layers read (None when they read nothing but x)."""
  mem = recurrence.uses_memory(cfg)
  if not (cfg.x0_lambdas or mem or cfg.layer_windows is not None):
    return None
  return LayerSide(x0=x0 if cfg.x0_lambdas else None, memory=memory if mem else None,
                   tokens=tokens if mem else None,
                   shared=params.get("recurrence") if mem else None,
                   dist=dist if cfg.layer_windows is not None else None)


def _context(params, cfg: ModelConfig, inp: SeqInputs, tokens_BT, x0_BTD) -> LayerCtx:
  """RoPE tables, the [B,T,T] attention mask and the side inputs shared by every layer
  (LRT's memory: zero, the parallel full pass)."""
  B, T = tokens_BT.shape
  q_slot = jnp.broadcast_to(jnp.arange(T)[None], (B, T))
  mask = attention_mask(q_slot, inp.control_flow != recurrence.CF_PAD,
                        inp.segment_ids, inp.segment_ids)
  dist = jnp.arange(T)[:, None] - jnp.arange(T)[None, :]
  zero = jnp.zeros((B, T, cfg.d_model), jnp.float32) if recurrence.uses_memory(cfg) else None
  side = side_inputs(params, cfg, x0_BTD, tokens_BT, dist[None], zero)
  segments = None
  if kernels.resolve(cfg.attention, cfg.dtype) != "xla":
    segments = kernels.segments_for(inp.control_flow, inp.segment_ids)
  return LayerCtx(rope_tables(cfg, inp.positions), mask, side,
                  value_embed_inputs(params, cfg, tokens_BT), segments=segments)


def _segments(params, cfg, unrolled=()) -> dict:
  """{name: (first layer, layers)} over cfg.segments: stacked trees, or per-layer tuples
  for the names in `unrolled` (`transformer.split_segments`)."""
  parts = tuple((lo, hi, name in unrolled) for name, lo, hi in cfg.segments)
  segs = transformer.split_segments(params["layers"], parts)
  return {name: (lo, seg) for (name, lo, _), seg in zip(cfg.segments, segs)}


def _layers(seg, cfg, x, ctx: LayerCtx):
  """A segment (first layer, layers) over the whole sequence."""
  first, layers = seg
  return transformer.run_layers(layers, cfg, x, ctx, first)


def _run(segs, cfg, name, x, ctx: LayerCtx):
  """Run one named segment in parallel over the sequence; identity if it is empty."""
  seg = segs.get(name)
  return (x, None) if seg is None else _layers(seg, cfg, x, ctx)


def stacked(kvs):
  """Per-layer keys/values as one stacked pytree (unrolled runs return a tuple)."""
  if isinstance(kvs, tuple) and kvs and not isinstance(kvs, KV):
    return jax.tree.map(lambda *a: jnp.stack(a), *kvs)
  return kvs


# ---------------------------------------------------------------------- parallel


def _logits(params, cfg: ModelConfig, y_BTD, last_only: bool, hidden: bool = False):
  """The LM head over every position, or only the last (prefill: [B, 1, V]); with
  `hidden`, the last layer's output itself (a chunked loss applies the head piecewise)."""
  if hidden:
    return y_BTD
  return head(params, cfg, y_BTD[:, -1:] if last_only else y_BTD)


def parallel(params, cfg: ModelConfig, tokens_BT, inp: SeqInputs, last_only: bool = False,
             hidden: bool = False):
  """Every position at once with no memory; also the per-segment KVs and the state the
  last position leaves (for a non-recurrent prompt's prefill). `last_only`: logits of
  the last position only (what prefill needs)."""
  x = embed(params, cfg, tokens_BT)
  ctx = _context(params, cfg, inp, tokens_BT, x)
  if cfg.recurrence is None:
    segs, kvs = _segments(params, cfg), {}
    for name, _, _ in cfg.segments:
      x, kvs[name] = _run(segs, cfg, name, x, ctx)
    return ModeOut(_logits(params, cfg, x, last_only, hidden), {}, kvs, None)
  # Every layer in one run over the stacked weights (cutting them into segments would
  # copy them: +100-300 ms per call at 135M, most of a short prompt's prefill); the
  # recurrent span's last layer is tapped at the last position for the state it leaves.
  x, (kv_all, last) = transformer.run_layers(params["layers"], cfg, x, ctx, 0,
                                             keep_last=True)
  kv_all, last = stacked(kv_all), stacked(last)
  kvs = {name: jax.tree.map(lambda a, lo=lo, hi=hi: a[lo:hi], kv_all)
         for name, lo, hi in cfg.segments}
  _, _, span_end = next(s for s in cfg.segments if s[0] == "middle")
  B = tokens_BT.shape[0]
  state = recurrence.of(cfg).carry(params, cfg, last[span_end - 1],
                                   recurrence.zero_state(cfg, B)[:, None],
                                   inp.control_flow[:, -1:])[:, 0]
  return ModeOut(_logits(params, cfg, x, last_only, hidden), {}, kvs, state)


# ------------------------------------------------------------------------- exact


def exact(params, cfg: ModelConfig, tokens_BT, inp: SeqInputs, last_only: bool = False,
          hidden: bool = False):
  """The true recurrence (all outputs of ModeOut).

  A prefix where every row is non-recurrent (cf <= 1: SFT and chat prompts, left
  padding) reads no memory, so its recurrent-block outputs and keys/values are those of
  one parallel pass (SPEC §3): the token-by-token loop takes them instead of running the
  block there (`lax.cond` per step; the parallel pass runs only when such a prefix
  exists). The state each prefix position leaves is computed as usual."""
  B, T = tokens_BT.shape
  kind = recurrence.of(cfg)
  x0 = embed(params, cfg, tokens_BT)
  ctx = _context(params, cfg, inp, tokens_BT, x0)
  rope, mask = ctx.rope, ctx.mask
  cf, pos = inp.control_flow, inp.positions
  segs = _segments(params, cfg, unrolled=("middle",))
  h_lo, kv_lo = _run(segs, cfg, "lower", x0, ctx)
  first, layers = segs["middle"]
  layers = jax.lax.optimization_barrier(layers)     # no weight slicing per token
  empty = jnp.zeros((B, 0, cfg.n_kv_heads, cfg.head_dim), h_lo.dtype)
  caches = tuple(to_cache(KV(empty, empty), T) for _ in layers)
  dist = jnp.arange(T)
  skip_T = jnp.all(jnp.cumprod(cf <= recurrence.CF_PLAIN, axis=1), axis=0).astype(bool)

  def prefix_pass():
    o, kv = transformer.run_layers(layers, cfg, h_lo, ctx, first)
    cache = tuple(to_cache(k, T) for k in kv)
    return o, tuple(KV(jnp.moveaxis(c.k, 1, 0), jnp.moveaxis(c.v, 1, 0)) for c in cache)

  shapes = jax.eval_shape(prefix_pass)
  o_pre, kv_pre = jax.lax.cond(
      skip_T[0], prefix_pass, lambda: jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype),
                                                   shapes))

  def step(carry, xs):
    S_BD, caches = carry
    h_B1D, cf_B1, pos_B1, rope_t, mask_B1S, t, x0_B1D, tok_B1, skip, o_pre_B1D, kv_pre_t = xs
    S_read = kind.read(cfg, S_BD[:, None, :], pos_B1, jnp.broadcast_to(t, pos_B1.shape))
    x, stats = kind.enter(params, cfg, h_B1D, S_read, cf_B1)
    mem = kind.memory(cfg, S_read, cf_B1)
    side = side_inputs(params, cfg, x0_B1D, tok_B1, (t - dist)[None, None], mem)
    ctx_t = LayerCtx(rope_t, mask_B1S, side, value_embed_inputs(params, cfg, tok_B1))

    def run(caches):
      return transformer.run_layers(layers, cfg, x, ctx_t, first, caches, t)

    def take(caches):         # the prefix pass's output and keys/values at slot t
      write = lambda c, new: jax.lax.dynamic_update_slice_in_dim(c, new[:, None], t, axis=1)
      return o_pre_B1D.astype(x.dtype), tuple(
          KV(write(c.k, n.k), write(c.v, n.v)) for c, n in zip(caches, kv_pre_t))

    o, caches = jax.lax.cond(skip, take, run, caches)
    S_new = kind.carry(params, cfg, o, S_read, cf_B1)[:, 0]
    return (S_new, caches), (o[:, 0], stats, None if mem is None else mem[:, 0])

  time_major = lambda a: None if a is None else jnp.swapaxes(a, 0, 1)[:, :, None]
  rope_t = None if rope is None else Rope(time_major(rope.cos_BTK), time_major(rope.sin_BTK))
  xs = (time_major(h_lo), time_major(cf), time_major(pos), rope_t, time_major(mask),
        jnp.arange(T), time_major(x0) if cfg.x0_lambdas else None,
        time_major(tokens_BT) if recurrence.uses_memory(cfg) or cfg.value_embeds else None,
        skip_T, time_major(o_pre), kv_pre)
  (S_final, caches), (o_TBD, stats, mem_TBD) = jax.lax.scan(
      step, (kind.zero_state(cfg, B), caches), xs)
  kv_mid = jax.tree.map(lambda *a: jnp.stack(a), *(from_cache(c, B) for c in caches))
  if mem_TBD is not None:
    ctx = ctx._replace(side=ctx.side._replace(memory=jnp.swapaxes(mem_TBD, 0, 1)))
  y, kv_up = _run(segs, cfg, "upper", jnp.swapaxes(o_TBD, 0, 1), ctx)
  stats = jax.tree.map(lambda a: jnp.swapaxes(a[:, :, 0], 0, 1), stats)
  kvs = {"lower": kv_lo, "middle": kv_mid, "upper": kv_up}
  kvs = {k: v for k, v in kvs.items() if v is not None}
  return ModeOut(_logits(params, cfg, y, last_only, hidden), kind.stats(stats, cf), kvs,
                 S_final)


# ------------------------------------------------------------------------ jacobi


def _max_abs(a):
  return jnp.max(jnp.abs(a))


def _sweep(cfg, first, p_mid, p_rec, h_lo, R, ctx, inp: SeqInputs):
  """One middle pass with the mixer on; returns the next shifted cache."""
  x, _ = rec.inject(p_rec, cfg, h_lo, R, inp.control_flow)
  o, _ = _layers((first, p_mid), cfg, x, ctx)
  return constrain_batch(rec.shift_right(rec.write(p_rec, cfg, o, R, inp.control_flow),
                                         inp.positions))


def _sweep0(cfg, first, p_mid, h_lo, ctx, inp: SeqInputs):
  """Sweep 0: the plain middle block; its raw output, shifted, is the first cache."""
  c, _ = _layers((first, p_mid), cfg, h_lo, ctx)
  c = jnp.where((inp.control_flow == recurrence.CF_PAD)[..., None], 0.0, c.astype(jnp.float32))
  return constrain_batch(rec.shift_right(c, inp.positions))


def _iterate(sweep, R, delta, max_sweeps, tol):
  """Up to `max_sweeps` sweeps (a fori_loop), or, with tol, at least one and fewer once
  max|R_k - R_{k-1}| < tol (a while_loop). Returns (R, delta of the last sweep, sweeps
  run)."""
  if tol is None:
    def body(_, carry):
      R, _ = carry
      R_new = sweep(R)
      return R_new, _max_abs(R_new - R)
    R, delta = jax.lax.fori_loop(0, max_sweeps, body, (R, delta))
    return R, delta, jnp.asarray(max_sweeps, jnp.int32)

  def cond(carry):
    i, _, delta = carry
    return (i < max_sweeps) & (delta >= tol)

  def wbody(carry):
    i, R, _ = carry
    R_new = sweep(R)
    return i + 1, R_new, _max_abs(R_new - R)
  # The first sweep always runs: max|R_0| (sweep 0's cache against a zero one) says
  # nothing about convergence, and stopping on it skipped every sweep for a loose tol.
  n_run, R, delta = jax.lax.while_loop(
      cond, wbody, (jnp.int32(0), R, jnp.full_like(delta, jnp.inf)))
  return R, delta, n_run


def jacobi(params, cfg: ModelConfig, tokens_BT, inp: SeqInputs, d_forward: int,
           d_backward: int, tol: Optional[float], hidden: bool = False):
  """Jacobi fixed-point training forward (logits and aux of ModeOut)."""
  sg = jax.lax.stop_gradient
  # Unrolled over per-layer weights, the sweeps do not re-slice them; with a remat policy
  # the scanned block keeps XLA's peak memory 1.4-2x lower (S5 shape, remat="full").
  segs = _segments(params, cfg, unrolled=("middle",) if cfg.remat == "none" else ())
  x0 = embed(params, cfg, tokens_BT)
  ctx = _context(params, cfg, inp, tokens_BT, x0)
  h_lo, _ = _run(segs, cfg, "lower", x0, ctx)
  (first, p_mid), p_rec = segs["middle"], params["recurrence"]
  # the no-gradient sweeps see the side inputs under stop_gradient too
  ctx_sg = ctx._replace(per_layer=jax.tree.map(sg, ctx.per_layer))
  if ctx.side is not None:
    ctx_sg = ctx_sg._replace(side=ctx.side._replace(
        x0=None if ctx.side.x0 is None else sg(ctx.side.x0)))
  n_grad = min(d_backward, d_forward - 1)      # middle sweeps with gradient
  n_free = d_forward - 1 - n_grad              # middle sweeps without

  if d_backward == d_forward:                  # every sweep, sweep 0 included, has gradient
    R = _sweep0(cfg, first, p_mid, h_lo, ctx, inp)
  else:
    R = sg(_sweep0(cfg, first, sg(p_mid), sg(h_lo), ctx_sg, inp))
  delta = _max_abs(R)

  # No-gradient sweeps: stop-gradient inputs and parameters keep no activations.
  n_run = jnp.asarray(0, jnp.int32)
  if n_free:
    frozen = (sg(p_mid), sg(p_rec), sg(h_lo))
    free = lambda R: _sweep(cfg, first, *frozen, R, ctx_sg, inp)
    R, delta, n_run = _iterate(free, R, delta, n_free, tol)
    R = sg(R)

  # The last D_b sweeps carry gradient.
  if n_grad:
    def gbody(R, _):
      R_new = _sweep(cfg, first, p_mid, p_rec, h_lo, R, ctx, inp)
      return R_new, _max_abs(R_new - R)
    R, deltas = jax.lax.scan(gbody, R, None, length=n_grad)
    delta = deltas[-1]

  # Final pass through the mixed middle block and the layers above.
  x, gates = rec.inject(p_rec, cfg, h_lo, R, inp.control_flow)
  o, _ = _run(segs, cfg, "middle", x, ctx)
  y, _ = _run(segs, cfg, "upper", o, ctx)
  aux = {"jacobi_residual": sg(delta),
         "jacobi_sweeps": 1 + n_run + n_grad,
         **jax.tree.map(sg, rec.gate_means(gates, inp.control_flow))}
  return ModeOut(_logits(params, cfg, y, False, hidden), aux)


def jacobi_prefill(params, cfg: ModelConfig, tokens_BT, inp: SeqInputs, tol: Optional[float],
                   last_only: bool = False):
  """Exact parallel prefill [ours]: Jacobi sweeps until max|ΔR| < tol, capped at T
  sweeps (exact by construction then). Same outputs as `exact`; aux: sweeps, residual."""
  T = tokens_BT.shape[1]
  segs = _segments(params, cfg, unrolled=("middle",))
  x0 = embed(params, cfg, tokens_BT)
  ctx = _context(params, cfg, inp, tokens_BT, x0)
  h_lo, kv_lo = _run(segs, cfg, "lower", x0, ctx)
  (first, p_mid), p_rec = segs["middle"], params["recurrence"]
  R = _sweep0(cfg, first, p_mid, h_lo, ctx, inp)
  sweep = lambda R: _sweep(cfg, first, p_mid, p_rec, h_lo, R, ctx, inp)
  R, delta, n_run = _iterate(sweep, R, _max_abs(R), T - 1, tol)
  cf = inp.control_flow
  x, gates = rec.inject(p_rec, cfg, h_lo, R, cf)
  o, kv_mid = _run(segs, cfg, "middle", x, ctx)
  kv_mid = stacked(kv_mid)
  y, kv_up = _run(segs, cfg, "upper", o, ctx)
  R_final = rec.write(p_rec, cfg, o[:, -1:], R[:, -1:], cf[:, -1:])[:, 0]
  kvs = {k: v for k, v in (("lower", kv_lo), ("middle", kv_mid), ("upper", kv_up))
         if v is not None}
  aux = {"jacobi_residual": delta, "jacobi_sweeps": 1 + n_run, **rec.gate_means(gates, cf)}
  return ModeOut(_logits(params, cfg, y, last_only), aux, kvs, R_final)


# ----------------------------------------------------------------- public entry


def _is_concrete(x) -> bool:
  return x is not None and not isinstance(x, jax.core.Tracer)


def check_tokens(cfg: ModelConfig, tokens, name="tokens"):
  """Shape/dtype checks always; value-range checks on concrete (host) inputs."""
  if getattr(tokens, "ndim", None) != 2:
    raise ValueError(f"{name} must be a [batch, time] integer array, got shape "
                     f"{getattr(tokens, 'shape', None)}")
  if not jnp.issubdtype(tokens.dtype, jnp.integer):
    raise ValueError(f"{name} must have an integer dtype, got {tokens.dtype}")
  T = tokens.shape[1]
  if T > cfg.max_seq_len:
    raise ValueError(f"{name} has T={T} positions but max_seq_len={cfg.max_seq_len}: "
                     f"allowed 1 <= T <= {cfg.max_seq_len}")
  if T < 1:
    raise ValueError(f"{name} has T=0 positions: allowed 1 <= T <= {cfg.max_seq_len}")
  if _is_concrete(tokens):
    arr = np.asarray(tokens)
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0 or hi >= cfg.vocab_size:
      raise ValueError(f"{name} holds ids in [{lo}, {hi}]: allowed 0 <= id < "
                       f"vocab_size={cfg.vocab_size}")


def _check_side(name, value, shape, allowed=None):
  if value is None:
    return
  if tuple(value.shape) != tuple(shape):
    raise ValueError(f"{name} must have the tokens' shape {tuple(shape)}, got {tuple(value.shape)}")
  if allowed is not None and _is_concrete(value):
    bad = set(np.unique(np.asarray(value)).tolist()) - set(allowed)
    if bad:
      raise ValueError(f"{name} holds {sorted(bad)}: allowed values {list(allowed)} "
                       "(0 padding, 1 non-recurrent, 2 recurrent)")


def seq_inputs(tokens, control_flow=None, positions=None, segment_ids=None) -> SeqInputs:
  """Fill defaults: control flow all 2, positions from segments (or arange)."""
  B, T = tokens.shape
  if control_flow is None:
    control_flow = jnp.full((B, T), recurrence.CF_RECURRENT, jnp.int32)
  if positions is None:
    positions = (positions_from_segments(segment_ids) if segment_ids is not None
                 else jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32)[None], (B, T)))
  return SeqInputs(jnp.asarray(control_flow, jnp.int32), jnp.asarray(positions, jnp.int32),
                   None if segment_ids is None else jnp.asarray(segment_ids, jnp.int32))


def _check_segment_starts(positions, segment_ids):
  """Explicit positions with segment ids must restart at 0 where a segment starts (the
  memory resets where a position id is 0, so otherwise it would cross documents)."""
  if positions is None or segment_ids is None or not (
      _is_concrete(positions) and _is_concrete(segment_ids)):
    return
  pos, seg = np.asarray(positions), np.asarray(segment_ids)
  starts = np.ones(seg.shape, bool)
  starts[:, 1:] = seg[:, 1:] != seg[:, :-1]
  starts &= seg >= 0                       # padding (negative ids) starts nothing
  bad = np.argwhere(starts & (pos != 0))
  if bad.size:
    b, t = bad[0]
    raise ValueError(f"positions[{b}, {t}]={int(pos[b, t])} where segment_ids starts a new "
                     "segment: allowed 0 (positions must restart at every segment start; "
                     "or pass positions=None to derive them from segment_ids)")


HIDDEN_MODES = ("parallel", "exact", "jacobi")     # modes that can return hidden states


@functools.partial(jax.jit, static_argnames=("cfg", "mode", "options", "hidden"))
def _forward(params, cfg, tokens, inp, mode, options, hidden=False):
  o = dict(options)
  if cfg.recurrence is None or mode == "parallel":
    out = parallel(params, cfg, tokens, inp, hidden=hidden)
  elif mode == "exact":
    out = exact(params, cfg, tokens, inp, hidden=hidden)
  elif mode == "jacobi":
    out = jacobi(params, cfg, tokens, inp, o["d_forward"], o["d_backward"], o["jacobi_tol"],
                 hidden)
  elif hidden:
    raise ValueError(f"mode={mode!r} computes its passes' logits itself: hidden states "
                     f"(a chunked loss) are available in {HIDDEN_MODES}")
  else:
    from t2mlr_jax.model import interleaved as schedules
    if mode == "multi_refine":
      out = schedules.multi_refine(params, cfg, tokens, inp, o["refine_passes"],
                                   o["refine_detach"])
    else:
      out = getattr(schedules, mode)(params, cfg, tokens, inp, o["passes"], o["kv_refresh"])
  return out.logits, out.aux


def mode_options(cfg: ModelConfig, mode: str, T: int, **given) -> dict:
  """Validate `mode` for cfg's recurrence type and resolve its options against the config
  (explicit arguments win): {option: value} of MODE_OPTIONS[mode] ({} for the others)."""
  rcfg = cfg.recurrence
  if mode not in MODES:
    raise ValueError(f"mode={mode!r} is invalid: allowed one of {MODES} "
                     "(use t2mlr_jax.generate for decoding)")
  unknown = sorted(set(given) - set(ALL_OPTIONS))
  if unknown:
    per_mode = "; ".join(f"{m}: {', '.join(o)}" for m, o in MODE_OPTIONS.items())
    raise ValueError(f"unknown option(s) {unknown}: allowed {', '.join(ALL_OPTIONS)} "
                     f"({per_mode})")
  given = {k: v for k, v in given.items() if v is not None}
  if rcfg is None:
    return {}
  own = TRAINING_MODES[type(rcfg)]
  if mode in MODE_OPTIONS and mode not in own:
    raise ValueError(f"mode={mode!r} is invalid for a {rcfg.type} model: allowed parallel, "
                     f"exact or {' / '.join(repr(m) for m in own)} ({mode} is the training "
                     "mode of another recurrence type)")
  mine = {o for m in own for o in MODE_OPTIONS[m]}
  foreign = sorted(set(given) - mine)
  if foreign:
    raise ValueError(f"{foreign[0]} is not an option of a {rcfg.type} model: its training "
                     f"modes are {own} with options {sorted(mine)}")
  if mode not in MODE_OPTIONS:
    return {}
  names = MODE_OPTIONS[mode]
  other = sorted(set(given) - set(names))
  if other:
    raise ValueError(f"{other[0]} is not an option of mode={mode!r}: allowed {names}")
  if mode == "jacobi" and ("d_forward" in given or "d_backward" in given):
    # each depth is checked on its own; D_b is clamped to D_f (whichever side gave it)
    d_f = given.get("d_forward", rcfg.d_forward)
    d_b = given.get("d_backward", rcfg.d_backward)
    for name, v in (("d_forward", d_f), ("d_backward", d_b)):
      if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
        raise ValueError(f"{name}={v!r} is invalid: allowed an integer >= 1")
    given = {**given, "d_forward": int(d_f), "d_backward": int(min(d_b, d_f))}
  r = rcfg.replace(**given)
  opts = {k: getattr(r, k) for k in names}
  if "passes" in opts and opts["passes"] > T:
    raise ValueError(f"passes={opts['passes']} is invalid: allowed 1 <= passes <= T={T} "
                     "(the sequence length)")
  if "kv_refresh" in opts:
    opts["kv_refresh"] = bool(opts["kv_refresh"])
  return opts


def forward(params, cfg: ModelConfig, tokens, *, mode: str, control_flow=None,
            positions=None, segment_ids=None, return_aux: bool = False, **mode_opts):
  """Logits [B, T, V] (fp32) of `tokens` [B, T] under one execution mode.

  mode: "parallel" (no memory), "exact" (token-by-token recurrence), or the recurrence
  type's training modes: "jacobi" (T2MLR; options d_forward, d_backward, jacobi_tol
  override the config per call; either depth may be given alone, and D_b > D_f is
  clamped to D_f: all D_f sweeps then carry gradient); LRT: "interleaved" or "chunked" (options passes, kv_refresh),
  "multi_refine" (refine_passes, refine_detach; refine_weights is the loss's).
  control_flow [B,T]: 0 padding, 1 non-recurrent, 2 recurrent (None: all 2).
  positions [B,T]: RoPE position ids (None: restart at 0 at each segment, else arange).
  The recurrent memory (T2MLR's cache, LRT's fed-back state) resets wherever a position
  id is 0: that is how it knows a sequence or a packed segment starts.
  segment_ids [B,T]: packed documents: attention does not cross them, and the memory
  resets at each segment's first token because its position id restarts at 0 (explicit
  positions given with segment_ids must restart at 0 at every segment start; checked).
  With return_aux, also a dict: jacobi: jacobi_residual (last sweep's max|R_k - R_{k-1}|),
  jacobi_sweeps and the mean gates gate_rec/gate_cur; interleaved / chunked:
  pass_logits (pass 0 [B,T,V], then pass p's positions), h_final [B,T,D] and
  gate_means [L, 3] (local, fb, ve); multi_refine: pass_logits [K+1,B,T,V], h_final,
  gate_means.
  A model without recurrence computes the same logits in every mode.
  """
  logits, aux = _checked_forward(params, cfg, tokens, mode, control_flow, positions,
                                 segment_ids, mode_opts, hidden=False)
  chex.assert_shape(logits, (*tokens.shape, cfg.vocab_size))
  return (logits, aux) if return_aux else logits


def hidden_states(params, cfg: ModelConfig, tokens, *, mode: str, control_flow=None,
                  positions=None, segment_ids=None, **mode_opts):
  """(y [B, T, D], aux): `forward` without the final norm and LM head (`transformer.head`
  maps y to the logits), so a loss can apply the head a chunk at a time. Modes parallel,
  exact and jacobi."""
  y, aux = _checked_forward(params, cfg, tokens, mode, control_flow, positions, segment_ids,
                            mode_opts, hidden=True)
  chex.assert_shape(y, (*jnp.shape(tokens), cfg.d_model))
  return y, aux


def _checked_forward(params, cfg, tokens, mode, control_flow, positions, segment_ids,
                     mode_opts, hidden):
  check_tokens(cfg, tokens)
  tokens = jnp.asarray(tokens, jnp.int32)
  _check_side("control_flow", control_flow, tokens.shape, (0, 1, 2))
  _check_side("positions", positions, tokens.shape)
  _check_side("segment_ids", segment_ids, tokens.shape)
  _check_segment_starts(positions, segment_ids)
  options = mode_options(cfg, mode, tokens.shape[1], **mode_opts)
  options.pop("refine_weights", None)          # the loss's, not the forward's
  inp = seq_inputs(tokens, control_flow, positions, segment_ids)
  return _forward(params, cfg, tokens, inp, mode, tuple(sorted(options.items())), hidden)
