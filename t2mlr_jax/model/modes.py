"""One parameter set, several ways to run it (docs/models.md, "Execution modes"), for
every recurrence type, all by name (`forward(..., mode=...)`):

- `parallel`:    every position at once with no memory (T2MLR: the plain transformer;
                 LRT: the release's full pass, m = 0).
- `exact`:       the true recurrence, through the interface of `recurrence/__init__.py`.
                 Layers below the recurrent span and above it run in parallel over the
                 sequence; only the span runs token by token (`lax.scan` over time with
                 its KV cache).
- the training schedules of `schedules/`: `jacobi`, `interleaved`, `chunked`,
  `multi_refine`, each for every type, its options per call or from the config.
The decode mode (prefill + one token per step) lives in `decode.py`.
"""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np

from t2mlr_jax.config import ModelConfig
from t2mlr_jax.model import recurrence, transformer
from t2mlr_jax.model.control_flow import CF_PLAIN, CF_RECURRENT
from t2mlr_jax.model.layers import KV, Rope, from_cache, to_cache
from t2mlr_jax.model.schedules import SCHEDULES
from t2mlr_jax.model.sequence import (
  ModeOut,
  SeqInputs,
  context,
  logits,
  positions_from_documents,
  run_segment,
  segments,
  side_inputs,
  stacked,
)
from t2mlr_jax.model.span import at_time, exit_span, with_time
from t2mlr_jax.model.transformer import LayerCtx, embed, value_embed_inputs

BUILTIN_MODES = ("parallel", "exact")      # every other mode is a registered schedule

__all__ = ["BUILTIN_MODES", "ModeOut", "SeqInputs", "check_tokens", "exact", "forward",
           "hidden_modes", "hidden_states", "mode_names", "mode_options", "parallel",
           "positions_from_documents", "seq_inputs"]


def mode_names() -> tuple[str, ...]:
  """Every mode `forward` takes now: parallel, exact and each registered schedule (read
  at each call: a schedule registered later is included)."""
  return (*BUILTIN_MODES, *SCHEDULES.names())


def hidden_modes() -> tuple[str, ...]:
  """The modes that can return hidden states instead of logits (a chunked loss)."""
  return (*BUILTIN_MODES, *(s.name for s in SCHEDULES.values() if s.hidden))


# ---------------------------------------------------------------------- parallel


def parallel(params, cfg: ModelConfig, tokens_BT, inp: SeqInputs, last_only: bool = False,
             hidden: bool = False):
  """Every position at once with no memory; also the per-segment KVs and the state the
  last position leaves (for a non-recurrent prompt's prefill). `last_only`: logits of
  the last position only (what prefill needs)."""
  x = embed(params, cfg, tokens_BT)
  ctx = context(params, cfg, inp, tokens_BT, x)
  if cfg.recurrence is None:
    segs, kvs = segments(params, cfg), {}
    for name, _, _ in cfg.segments:
      x, kvs[name] = run_segment(segs, cfg, name, x, ctx)
    return ModeOut(logits(params, cfg, x, last_only, hidden), {}, kvs, None)
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
  state = at_time(recurrence.of(cfg).carry(params, cfg, last[span_end - 1],
                                           with_time(recurrence.zero_state(cfg, B)),
                                           inp.control_flow[:, -1:]), 0)
  return ModeOut(logits(params, cfg, x, last_only, hidden), {}, kvs, state)


# ------------------------------------------------------------------------- exact


def exact(params, cfg: ModelConfig, tokens_BT, inp: SeqInputs, last_only: bool = False,
          hidden: bool = False):
  """The true recurrence (all outputs of ModeOut).

  A prefix where every row is non-recurrent (cf <= 1: SFT and chat prompts, left
  padding) reads no memory, so its recurrent-span outputs and keys/values are those of
  one parallel pass: the token-by-token loop takes them instead of running the
  block there (`lax.cond` per step; the parallel pass runs only when such a prefix
  exists). The state each prefix position leaves is computed as usual."""
  B, T = tokens_BT.shape
  rtype = recurrence.of(cfg)
  x0 = embed(params, cfg, tokens_BT)
  ctx = context(params, cfg, inp, tokens_BT, x0)
  rope, mask = ctx.rope, ctx.mask
  cf, pos = inp.control_flow, inp.positions
  segs = segments(params, cfg, unrolled=("middle",))
  h_lo, kv_lo = run_segment(segs, cfg, "lower", x0, ctx)
  first, layers = segs["middle"]
  layers = jax.lax.optimization_barrier(layers)     # no weight slicing per token
  empty = jnp.zeros((B, 0, cfg.n_kv_heads, cfg.head_dim), h_lo.dtype)
  caches = tuple(to_cache(KV(empty, empty), T) for _ in layers)
  dist = jnp.arange(T)
  skip_T = jnp.all(jnp.cumprod(cf <= CF_PLAIN, axis=1), axis=0).astype(bool)

  def prefix_pass():
    o, kv = transformer.run_layers(layers, cfg, h_lo, ctx, first)
    cache = tuple(to_cache(k, T) for k in kv)
    return o, tuple(KV(jnp.moveaxis(c.k, 1, 0), jnp.moveaxis(c.v, 1, 0)) for c in cache)

  shapes = jax.eval_shape(prefix_pass)
  o_pre, kv_pre = jax.lax.cond(
      skip_T[0], prefix_pass, lambda: jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype),
                                                   shapes))

  def step(carry, xs):
    state_BD, caches = carry
    h_B1D, cf_B1, pos_B1, rope_t, mask_B1S, t, x0_B1D, tok_B1, skip, o_pre_B1D, kv_pre_t = xs
    prev_B1D = rtype.read(cfg, with_time(state_BD), pos_B1, jnp.broadcast_to(t, pos_B1.shape))
    x, stats = rtype.enter(params, cfg, h_B1D, prev_B1D, cf_B1)
    mem = rtype.memory(cfg, prev_B1D, cf_B1)
    side = side_inputs(params, cfg, x0_B1D, tok_B1, (t - dist)[None, None], mem)
    ctx_t = LayerCtx(rope_t, mask_B1S, side, value_embed_inputs(params, cfg, tok_B1))

    def run(caches):
      return transformer.run_layers(layers, cfg, x, ctx_t, first, caches, t, kv_source="cache")

    def take(caches):         # the prefix pass's output and keys/values at slot t
      write = lambda c, new: jax.lax.dynamic_update_slice_in_dim(c, new[:, None], t, axis=1)
      return o_pre_B1D.astype(x.dtype), tuple(
          KV(write(c.k, n.k), write(c.v, n.v)) for c, n in zip(caches, kv_pre_t))

    o, caches = jax.lax.cond(skip, take, run, caches)
    o = exit_span(params, cfg, o, prev_B1D, cf_B1)
    state_BD = at_time(rtype.carry(params, cfg, o, prev_B1D, cf_B1), 0)
    return (state_BD, caches), (o[:, 0], stats, None if mem is None else mem[:, 0])

  time_major = lambda a: None if a is None else jnp.swapaxes(a, 0, 1)[:, :, None]
  rope_t = None if rope is None else Rope(time_major(rope.cos_BTK), time_major(rope.sin_BTK))
  xs = (time_major(h_lo), time_major(cf), time_major(pos), rope_t, time_major(mask),
        jnp.arange(T), time_major(x0) if cfg.x0_lambdas else None,
        time_major(tokens_BT) if recurrence.uses_memory(cfg) or cfg.value_embeds else None,
        skip_T, time_major(o_pre), kv_pre)
  (state_BD, caches), (o_TBD, stats, mem_TBD) = jax.lax.scan(
      step, (rtype.zero_state(cfg, B), caches), xs)
  kv_mid = jax.tree.map(lambda *a: jnp.stack(a), *(from_cache(c, B) for c in caches))
  if mem_TBD is not None:
    ctx = ctx._replace(side=ctx.side._replace(memory=jnp.swapaxes(mem_TBD, 0, 1)))
  y, kv_up = run_segment(segs, cfg, "upper", jnp.swapaxes(o_TBD, 0, 1), ctx)
  stats = jax.tree.map(lambda a: jnp.swapaxes(a[:, :, 0], 0, 1), stats)
  kvs = {"lower": kv_lo, "middle": kv_mid, "upper": kv_up}
  kvs = {k: v for k, v in kvs.items() if v is not None}
  return ModeOut(logits(params, cfg, y, last_only, hidden), rtype.stats(stats, cf), kvs,
                 state_BD)


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
  """Fill defaults: control flow all 2, positions from the packed documents (or arange);
  `segment_ids` (the public name) become `SeqInputs.document_ids`."""
  B, T = tokens.shape
  if control_flow is None:
    control_flow = jnp.full((B, T), CF_RECURRENT, jnp.int32)
  if positions is None:
    positions = (positions_from_documents(segment_ids) if segment_ids is not None
                 else jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32)[None], (B, T)))
  return SeqInputs(jnp.asarray(control_flow, jnp.int32), jnp.asarray(positions, jnp.int32),
                   None if segment_ids is None else jnp.asarray(segment_ids, jnp.int32))


def _check_document_starts(positions, segment_ids):
  """Explicit positions with segment ids must restart at 0 where a document starts (the
  state resets where a position id is 0, so otherwise it would cross documents)."""
  if positions is None or segment_ids is None or not (
      _is_concrete(positions) and _is_concrete(segment_ids)):
    return
  pos, doc = np.asarray(positions), np.asarray(segment_ids)
  starts = np.ones(doc.shape, bool)
  starts[:, 1:] = doc[:, 1:] != doc[:, :-1]
  starts &= doc >= 0                       # padding (negative ids) starts nothing
  bad = np.argwhere(starts & (pos != 0))
  if bad.size:
    b, t = bad[0]
    raise ValueError(f"positions[{b}, {t}]={int(pos[b, t])} where segment_ids starts a new "
                     "segment: allowed 0 (positions must restart at every segment start; "
                     "or pass positions=None to derive them from segment_ids)")


@functools.partial(jax.jit, static_argnames=("cfg", "mode", "options", "hidden"))
def _forward(params, cfg, tokens, inp, mode, options, hidden=False):
  if cfg.recurrence is None or mode == "parallel":
    out = parallel(params, cfg, tokens, inp, hidden=hidden)
  elif mode == "exact":
    out = exact(params, cfg, tokens, inp, hidden=hidden)
  elif hidden and not SCHEDULES.get(mode).hidden:
    raise ValueError(f"mode={mode!r} computes its passes' logits itself: hidden states "
                     f"(a chunked loss) are available in {hidden_modes()}")
  else:
    out = SCHEDULES.get(mode).run(params, cfg, tokens, inp, dict(options), hidden)
  return out.logits, out.aux


def mode_options(cfg: ModelConfig, mode: str, T: int, **given) -> dict:
  """Validate `mode` and resolve its options against the config's `schedule_options`
  (explicit arguments win): {option: value} of the schedule's options ({} for parallel
  and exact). Every schedule runs every recurrence type; the schedule checks its values
  (its options dataclass), the call's against the config's (`check_options`) and against
  the model and length T (`check_run`: S <= T, a hook the type must have)."""
  # read from the registry at each call: a schedule registered after import is known too
  modes = mode_names()
  per_mode = {s.name: tuple(s.option_defaults()) for s in SCHEDULES.values()}
  every = tuple(dict.fromkeys(o for opts in per_mode.values() for o in opts))
  if mode not in modes:
    raise ValueError(f"mode={mode!r} is invalid: allowed one of {modes} "
                     "(use t2mlr_jax.generate for decoding)")
  unknown = sorted(set(given) - set(every))
  if unknown:
    listed = "; ".join(f"{m}: {', '.join(o)}" for m, o in per_mode.items() if o)
    raise ValueError(f"unknown option(s) {unknown}: allowed {', '.join(every)} ({listed})")
  given = {k: v for k, v in given.items() if v is not None}
  if cfg.recurrence is None or mode not in per_mode:
    return {}
  schedule = SCHEDULES.get(mode)
  names = per_mode[mode]
  other = sorted(set(given) - set(names))
  if other:
    raise ValueError(f"{other[0]} is not an option of mode={mode!r}: allowed {names}")
  values = {**{k: cfg.schedule_options[k] for k in names}, **given}
  if schedule.check_options is not None:
    values = schedule.check_options(values, given)
  if schedule.options is not None:
    checked = schedule.options(**values)
    values = {k: getattr(checked, k) for k in names}
  if schedule.check_run is not None:
    schedule.check_run(cfg, values, T)
  return values


def forward(params, cfg: ModelConfig, tokens, *, mode: str, control_flow=None,
            positions=None, segment_ids=None, return_aux: bool = False, **mode_opts):
  """Logits [B, T, V] (fp32) of `tokens` [B, T] under one execution mode.

  mode: "parallel" (no memory), "exact" (token-by-token recurrence), or a training
  schedule, each for every recurrence type: "jacobi" (options d_forward, d_backward,
  jacobi_tol override the config per call; either depth may be given alone, and D_b > D_f
  is clamped to D_f: all D_f sweeps then carry gradient); "interleaved" or "chunked"
  (passes, kv_refresh: LRT only), "multi_refine" (refine_passes, refine_detach;
  refine_weights is the loss's).
  control_flow [B,T]: 0 padding, 1 non-recurrent, 2 recurrent (None: all 2).
  positions [B,T]: RoPE position ids (None: restart at 0 at each document, else arange).
  The recurrent state (T2MLR's R, LRT's fed-back output) resets wherever a position id
  is 0: that is how it knows a sequence or a packed document starts.
  segment_ids [B,T]: the packed document of each token: attention does not cross them,
  and the state resets at each document's first token because its position id restarts
  at 0 (explicit positions given with segment_ids must restart at 0 at every document
  start; checked).
  With return_aux, also a dict: jacobi: jacobi_residual (last sweep's max|state_k −
  state_{k−1}|), jacobi_sweeps; interleaved / chunked: pass_logits (pass 0 [B,T,V], then
  pass p's positions) and h_final [B,T,D] (the merged states); multi_refine: pass_logits
  [refine_passes+1,B,T,V], h_final; and the type's metrics: T2MLR's mean gates gate_rec /
  gate_cur, LRT's gate_means [L, 3] (local, fb, ve) under the refinement schedules.
  A model without recurrence computes the same logits in every mode.
  """
  logits, aux = _checked_forward(params, cfg, tokens, mode, control_flow, positions,
                                 segment_ids, mode_opts, hidden=False)
  chex.assert_shape(logits, (*tokens.shape, cfg.vocab_size))
  return (logits, aux) if return_aux else logits


def hidden_states(params, cfg: ModelConfig, tokens, *, mode: str, control_flow=None,
                  positions=None, segment_ids=None, **mode_opts):
  """(y [B, T, D], aux): `forward` without the final norm and LM head (`transformer.head`
  maps y to the logits), so a loss can apply the head a chunk at a time. Modes
  `hidden_modes()` (parallel, exact, and each schedule declaring `hidden`: jacobi)."""
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
  _check_document_starts(positions, segment_ids)
  options = mode_options(cfg, mode, tokens.shape[1], **mode_opts)
  if options:        # the options only the schedule's loss reads stay out of the forward
    loss_only = SCHEDULES.get(mode).loss_options
    options = {k: v for k, v in options.items() if k not in loss_only}
  inp = seq_inputs(tokens, control_flow, positions, segment_ids)
  return _forward(params, cfg, tokens, inp, mode, tuple(sorted(options.items())), hidden)
