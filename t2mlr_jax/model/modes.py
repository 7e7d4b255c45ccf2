"""One parameter set, several ways to run it (SPEC §3, §10).

- `parallel`: the plain transformer, recurrence off.
- `exact`:    the true recurrence. Layers below l_start and above l_end run in
              parallel over the sequence; only the recurrent block runs token
              by token (`lax.scan` over time with its KV cache).
- `jacobi`:   training. Sweep 0 and the no-gradient sweeps inside a
              `fori_loop` (or a tolerance-stopped `while_loop`) on
              stop-gradient inputs and parameters; the last D_b sweeps with
              gradient; then the final pass.
The decode mode (prefill + one token per step) lives in `decode.py`.
"""

from __future__ import annotations

import functools
from typing import NamedTuple, Optional

import chex
import jax
import jax.numpy as jnp
import numpy as np

from t2mlr_jax.config import ModelConfig
from t2mlr_jax.model import recurrence as rec
from t2mlr_jax.model.layers import KV, Rope, attention_mask, from_cache, rope_tables, to_cache
from t2mlr_jax.model import transformer
from t2mlr_jax.model.transformer import embed, head

MODES = ("parallel", "exact", "jacobi")


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


def _context(cfg: ModelConfig, inp: SeqInputs, T: int):
  """RoPE tables and the [B,T,T] attention mask shared by every layer."""
  B = inp.control_flow.shape[0]
  q_slot = jnp.broadcast_to(jnp.arange(T)[None], (B, T))
  mask = attention_mask(q_slot, inp.control_flow != rec.CF_PAD,
                        inp.segment_ids, inp.segment_ids)
  return rope_tables(cfg, inp.positions), mask


def _segments(params, cfg, unrolled=()) -> dict:
  """{name: layers} over cfg.segments: stacked trees, or per-layer tuples for the names
  in `unrolled` (`transformer.split_segments`)."""
  parts = tuple((lo, hi, name in unrolled) for name, lo, hi in cfg.segments)
  segs = transformer.split_segments(params["layers"], parts)
  return {name: seg for (name, _, _), seg in zip(cfg.segments, segs)}


def _layers(p, cfg, x, rope, mask):
  """Layers over the whole sequence: a stacked tree (scanned) or a per-layer tuple."""
  if isinstance(p, tuple):
    return transformer.run_unrolled(p, cfg, x, rope, mask)
  return transformer.run_segment(p, cfg, x, rope, mask)


def _run(segs, cfg, name, x, rope, mask):
  """Run one named segment in parallel over the sequence; identity if it is empty."""
  p = segs.get(name)
  return (x, None) if p is None else _layers(p, cfg, x, rope, mask)


# ---------------------------------------------------------------------- parallel


def _logits(params, cfg: ModelConfig, y_BTD, last_only: bool):
  """The LM head over every position, or only the last (prefill: [B, 1, V])."""
  return head(params, cfg, y_BTD[:, -1:] if last_only else y_BTD)


def parallel(params, cfg: ModelConfig, tokens_BT, inp: SeqInputs, last_only: bool = False):
  """Plain transformer logits; also the per-segment KVs and outputs (for prefill).
  `last_only`: logits of the last position only (what prefill needs)."""
  T = tokens_BT.shape[1]
  rope, mask = _context(cfg, inp, T)
  x = embed(params, cfg, tokens_BT)
  segs, kvs, outs = _segments(params, cfg), {}, {}
  for name, _, _ in cfg.segments:
    x, kvs[name] = _run(segs, cfg, name, x, rope, mask)
    outs[name] = x
  return _logits(params, cfg, x, last_only), kvs, outs


# ------------------------------------------------------------------------- exact


def exact(params, cfg: ModelConfig, tokens_BT, inp: SeqInputs, last_only: bool = False):
  """The true recurrence. Returns (logits, aux, (kvs, R_final))."""
  B, T = tokens_BT.shape
  rope, mask = _context(cfg, inp, T)
  cf, pos = inp.control_flow, inp.positions
  segs = _segments(params, cfg, unrolled=("middle",))
  h_lo, kv_lo = _run(segs, cfg, "lower", embed(params, cfg, tokens_BT), rope, mask)
  p_rec = params["recurrence"]
  layers = jax.lax.optimization_barrier(segs["middle"])     # no weight slicing per token
  empty = jnp.zeros((B, 0, cfg.n_kv_heads, cfg.head_dim), h_lo.dtype)
  caches = tuple(to_cache(KV(empty, empty), T) for _ in layers)

  def step(carry, xs):
    R_BD, caches = carry
    h_B1D, cf_B1, pos_B1, rope_t, mask_B1S, t = xs
    R_read = jnp.where((pos_B1 == 0)[..., None], 0.0, R_BD[:, None, :])
    x, gates = rec.inject(p_rec, cfg, h_B1D, R_read, cf_B1)
    o, caches = transformer.run_cached(layers, cfg, x, rope_t, mask_B1S, caches, t)
    R_new = rec.write(p_rec, cfg, o, R_read, cf_B1)[:, 0]
    return (R_new, caches), (o[:, 0], gates)

  time_major = lambda a: None if a is None else jnp.swapaxes(a, 0, 1)[:, :, None]
  rope_t = None if rope is None else Rope(time_major(rope.cos_BTK), time_major(rope.sin_BTK))
  xs = (time_major(h_lo), time_major(cf), time_major(pos), rope_t, time_major(mask),
        jnp.arange(T))
  (R_final, caches), (o_TBD, gates) = jax.lax.scan(
      step, (rec.zero_state(cfg, B), caches), xs)
  kv_mid = jax.tree.map(lambda *a: jnp.stack(a), *(from_cache(c, B) for c in caches))
  y, kv_up = _run(segs, cfg, "upper", jnp.swapaxes(o_TBD, 0, 1), rope, mask)
  gates = jax.tree.map(lambda a: jnp.swapaxes(a[:, :, 0], 0, 1), gates)
  kvs = {"lower": kv_lo, "middle": kv_mid, "upper": kv_up}
  kvs = {k: v for k, v in kvs.items() if v is not None}
  return _logits(params, cfg, y, last_only), rec.gate_means(gates, cf), (kvs, R_final)


# ------------------------------------------------------------------------ jacobi


def _max_abs(a):
  return jnp.max(jnp.abs(a))


def _sweep(cfg, p_mid, p_rec, h_lo, R, rope, mask, inp: SeqInputs):
  """One middle pass with the mixer on; returns the next shifted cache."""
  x, _ = rec.inject(p_rec, cfg, h_lo, R, inp.control_flow)
  o, _ = _layers(p_mid, cfg, x, rope, mask)
  return rec.shift_right(rec.write(p_rec, cfg, o, R, inp.control_flow), inp.positions)


def _sweep0(cfg, p_mid, h_lo, rope, mask, inp: SeqInputs):
  """Sweep 0: the plain middle block; its raw output, shifted, is the first cache."""
  c, _ = _layers(p_mid, cfg, h_lo, rope, mask)
  c = jnp.where((inp.control_flow == rec.CF_PAD)[..., None], 0.0, c.astype(jnp.float32))
  return rec.shift_right(c, inp.positions)


def _iterate(sweep, R, delta, max_sweeps, tol):
  """Up to `max_sweeps` sweeps (a fori_loop), or fewer once max|R_k - R_{k-1}| < tol
  (a while_loop). Returns (R, delta of the last sweep, sweeps run)."""
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
  n_run, R, delta = jax.lax.while_loop(cond, wbody, (jnp.int32(0), R, delta))
  return R, delta, n_run


def jacobi(params, cfg: ModelConfig, tokens_BT, inp: SeqInputs, d_forward: int,
           d_backward: int, tol: Optional[float]):
  """Jacobi fixed-point training forward. Returns (logits, aux)."""
  T = tokens_BT.shape[1]
  rope, mask = _context(cfg, inp, T)
  sg = jax.lax.stop_gradient
  # Unrolled over per-layer weights, the sweeps do not re-slice them; with a remat policy
  # the scanned block keeps XLA's peak memory 1.4-2x lower (S5 shape, remat="full").
  segs = _segments(params, cfg, unrolled=("middle",) if cfg.remat == "none" else ())
  h_lo, _ = _run(segs, cfg, "lower", embed(params, cfg, tokens_BT), rope, mask)
  p_mid, p_rec = segs["middle"], params["recurrence"]
  n_grad = min(d_backward, d_forward - 1)      # middle sweeps with gradient
  n_free = d_forward - 1 - n_grad              # middle sweeps without

  if d_backward == d_forward:                  # every sweep, sweep 0 included, has gradient
    R = _sweep0(cfg, p_mid, h_lo, rope, mask, inp)
  else:
    R = sg(_sweep0(cfg, sg(p_mid), sg(h_lo), rope, mask, inp))
  delta = _max_abs(R)

  # No-gradient sweeps: stop-gradient inputs and parameters keep no activations.
  n_run = jnp.asarray(0, jnp.int32)
  if n_free:
    frozen = (sg(p_mid), sg(p_rec), sg(h_lo))
    free = lambda R: _sweep(cfg, *frozen, R, rope, mask, inp)
    R, delta, n_run = _iterate(free, R, delta, n_free, tol)
    R = sg(R)

  # The last D_b sweeps carry gradient.
  if n_grad:
    def gbody(R, _):
      R_new = _sweep(cfg, p_mid, p_rec, h_lo, R, rope, mask, inp)
      return R_new, _max_abs(R_new - R)
    R, deltas = jax.lax.scan(gbody, R, None, length=n_grad)
    delta = deltas[-1]

  # Final pass through the mixed middle block and the layers above.
  x, gates = rec.inject(p_rec, cfg, h_lo, R, inp.control_flow)
  o, _ = _run(segs, cfg, "middle", x, rope, mask)
  y, _ = _run(segs, cfg, "upper", o, rope, mask)
  aux = {"jacobi_residual": sg(delta),
         "jacobi_sweeps": 1 + n_run + n_grad,
         **jax.tree.map(sg, rec.gate_means(gates, inp.control_flow))}
  return head(params, cfg, y), aux


def jacobi_prefill(params, cfg: ModelConfig, tokens_BT, inp: SeqInputs, tol: Optional[float],
                   last_only: bool = False):
  """Exact parallel prefill [ours]: Jacobi sweeps until max|ΔR| < tol, capped at T
  sweeps (exact by construction then). Same outputs as `exact`, plus (sweeps, residual):
  (logits, aux, (kvs, R_final))."""
  T = tokens_BT.shape[1]
  rope, mask = _context(cfg, inp, T)
  segs = _segments(params, cfg, unrolled=("middle",))
  h_lo, kv_lo = _run(segs, cfg, "lower", embed(params, cfg, tokens_BT), rope, mask)
  p_mid, p_rec = segs["middle"], params["recurrence"]
  R = _sweep0(cfg, p_mid, h_lo, rope, mask, inp)
  sweep = lambda R: _sweep(cfg, p_mid, p_rec, h_lo, R, rope, mask, inp)
  R, delta, n_run = _iterate(sweep, R, _max_abs(R), T - 1, tol)
  cf = inp.control_flow
  x, gates = rec.inject(p_rec, cfg, h_lo, R, cf)
  o, kv_mid = _run(segs, cfg, "middle", x, rope, mask)
  y, kv_up = _run(segs, cfg, "upper", o, rope, mask)
  R_final = rec.write(p_rec, cfg, o[:, -1:], R[:, -1:], cf[:, -1:])[:, 0]
  kvs = {k: v for k, v in (("lower", kv_lo), ("middle", kv_mid), ("upper", kv_up))
         if v is not None}
  aux = {"jacobi_residual": delta, "jacobi_sweeps": 1 + n_run, **rec.gate_means(gates, cf)}
  return _logits(params, cfg, y, last_only), aux, (kvs, R_final)


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
    control_flow = jnp.full((B, T), rec.CF_RECURRENT, jnp.int32)
  if positions is None:
    positions = (positions_from_segments(segment_ids) if segment_ids is not None
                 else jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32)[None], (B, T)))
  return SeqInputs(jnp.asarray(control_flow, jnp.int32), jnp.asarray(positions, jnp.int32),
                   None if segment_ids is None else jnp.asarray(segment_ids, jnp.int32))


@functools.partial(jax.jit, static_argnames=("cfg", "mode", "d_forward", "d_backward", "tol"))
def _forward(params, cfg, tokens, inp, mode, d_forward, d_backward, tol):
  if cfg.recurrence is None or mode == "parallel":
    return parallel(params, cfg, tokens, inp)[0], {}
  if mode == "exact":
    logits, aux, _ = exact(params, cfg, tokens, inp)
    return logits, aux
  return jacobi(params, cfg, tokens, inp, d_forward, d_backward, tol)


def forward(params, cfg: ModelConfig, tokens, *, mode: str, control_flow=None,
            positions=None, segment_ids=None, d_forward: Optional[int] = None,
            d_backward: Optional[int] = None, return_aux: bool = False):
  """Logits [B, T, V] (fp32) of `tokens` [B, T] under one execution mode.

  mode: "parallel" (recurrence off), "exact" (token-by-token recurrence) or
  "jacobi" (training approximation; d_forward/d_backward override the config).
  control_flow [B,T]: 0 padding, 1 non-recurrent, 2 recurrent (None: all 2).
  positions [B,T]: RoPE position ids (None: restart at each segment, else arange).
  segment_ids [B,T]: packed documents; attention and the cache do not cross them.
  With return_aux, also a dict: jacobi_residual (last sweep's max|R_k - R_{k-1}|),
  jacobi_sweeps and the mean gates gate_rec/gate_cur (the keys the mode has).
  A model without recurrence computes the same logits in every mode.
  """
  if mode not in MODES:
    raise ValueError(f"mode={mode!r} is invalid: allowed one of {MODES} "
                     "(use t2mlr_jax.generate for decoding)")
  check_tokens(cfg, tokens)
  tokens = jnp.asarray(tokens, jnp.int32)
  _check_side("control_flow", control_flow, tokens.shape, (0, 1, 2))
  _check_side("positions", positions, tokens.shape)
  _check_side("segment_ids", segment_ids, tokens.shape)
  d_f = d_b = tol = None
  if mode == "jacobi" and cfg.recurrence is not None:
    rcfg = cfg.recurrence.replace(
        d_forward=cfg.recurrence.d_forward if d_forward is None else d_forward,
        d_backward=cfg.recurrence.d_backward if d_backward is None else d_backward)
    d_f, d_b, tol = rcfg.d_forward, rcfg.d_backward, rcfg.jacobi_tol
  inp = seq_inputs(tokens, control_flow, positions, segment_ids)
  logits, aux = _forward(params, cfg, tokens, inp, mode, d_f, d_b, tol)
  chex.assert_shape(logits, (*tokens.shape, cfg.vocab_size))
  return (logits, aux) if return_aux else logits
