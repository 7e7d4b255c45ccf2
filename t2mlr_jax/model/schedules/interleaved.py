"""The refinement-pass schedules: interleaved (docs/lrt_training.md; tests/golden/README.md
"Interleaved training", LRT's own) and chunked (the LRT paper's baseline; its semantics
are ours), for any recurrence type.

Pass 0 runs every position with every state zero and keeps, per layer, the keys (after
RoPE and QK-norm, and any mixing the type does) and values of the whole sequence. Pass
p = 1..passes runs only its positions T_p (interleaved: t ≡ p−1 (mod passes); chunked:
the p-th of `passes` contiguous chunks) through the recurrent span and the layers above,
each reading the state its predecessor left in the merged `states`; in every layer their
fresh keys/values overwrite the buffer at those rows before their queries attend over the
whole buffer, and their states overwrite `states` there. Layers below the span never see
the recurrence: pass 0's outputs and keys serve every pass. Nothing is detached. The
passes together push each position through the model once, so a step costs about twice a
plain one. passes = T is the exact recurrence.

K/V refresh (option `kv_refresh`, a hook of the type: LRT's): before each pass p >= 1 the
rows no pass has visited yet are re-projected from the memory the pass reads.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from t2mlr_jax.config import ModelConfig, invalid
from t2mlr_jax.losses import cross_entropy, supervised
from t2mlr_jax.model import recurrence
from t2mlr_jax.model.layers import rope_tables
from t2mlr_jax.model.sequence import ModeOut, SeqInputs, context, segments, side_inputs
from t2mlr_jax.model.span import at_time, previous_states, run_span, set_time, zero_states
from t2mlr_jax.model.transformer import LayerCtx, embed, head, run_layers
from t2mlr_jax.registry import SCHEDULES, Schedule
from t2mlr_jax.sharding import constrain_batch


@dataclasses.dataclass(frozen=True)
class PassOptions:
  """`passes` passes after pass 0 (interleaved: positions t ≡ p−1 mod passes in pass p;
  chunked: `passes` contiguous chunks); kv_refresh: re-project not-yet-visited positions'
  feedback between passes (a type whose memory enters keys and values, with the
  `refresh_kv` hook: LRT)."""
  passes: int = 2
  kv_refresh: bool = False

  def __post_init__(self):
    if isinstance(self.passes, bool) or not isinstance(self.passes, (int, np.integer)) \
        or self.passes < 1:
      invalid("passes", self.passes, "an integer >= 1 (and <= the sequence length)")
    if not isinstance(self.kv_refresh, (bool, np.bool_)):
      invalid("kv_refresh", self.kv_refresh, "True or False")
    object.__setattr__(self, "passes", int(self.passes))
    object.__setattr__(self, "kv_refresh", bool(self.kv_refresh))


def check_run(cfg: ModelConfig, options: dict, T: int) -> None:
  """passes <= T; kv_refresh only for a type with the `refresh_kv` hook."""
  if options["passes"] > T:
    raise ValueError(f"passes={options['passes']} is invalid: allowed 1 <= passes <= T={T} "
                     "(the sequence length)")
  if options["kv_refresh"] and recurrence.of(cfg).refresh_kv is None:
    raise ValueError(f"kv_refresh=True is invalid for a {recurrence.of(cfg).name} model: "
                     "allowed False (its memory never enters the keys or values, so there "
                     "is nothing to refresh)")


def pass_positions(T: int, passes: int, mode: str = "interleaved") -> tuple:
  """The positions of passes 1..passes: interleaved, t ≡ p−1 (mod passes) (uneven passes
  when passes ∤ T); chunked, `passes` contiguous chunks in order (sizes differ by at most
  one)."""
  if not 1 <= passes <= T:
    raise ValueError(f"passes={passes!r} is invalid: allowed 1 <= passes <= T={T} "
                     "(the sequence length)")
  if mode == "chunked":
    return tuple(np.array_split(np.arange(T), passes))
  return tuple(np.arange(p, T, passes) for p in range(passes))


def _pass_stats(rtype, cfg, span_stats, collected, cf_BT) -> dict:
  """One pass's metrics (`enter`'s and the per-layer modules'), without gradient."""
  stats = {**rtype.stats(span_stats, cf_BT), **rtype.layer_stats(collected, cfg)}
  return jax.tree.map(jax.lax.stop_gradient, stats)


def refine_in_passes(params, cfg: ModelConfig, tokens_BT, inp: SeqInputs, sets: tuple,
                     kv_refresh: bool) -> ModeOut:
  """Pass 0 over every position, then one pass per position set in `sets`. ModeOut:
  merged logits [B, T, V] (each position from the last pass that computed it); aux:
  pass_logits (pass 0 [B, T, V], pass p [B, |T_p|, V]), h_final (leaves [B, T, ...]: the
  merged states after the last pass) and the type's metrics, position-weighted over passes
  1..pos (LRT: gate_means [L, 3], local / fb / ve; T2MLR: gate_rec, gate_cur)."""
  B, T = tokens_BT.shape
  rtype = recurrence.of(cfg)
  cf = inp.control_flow
  x0 = embed(params, cfg, tokens_BT)
  ctx = context(params, cfg, inp, tokens_BT, x0)._replace(collect=True)
  if kv_refresh:
    ctx = ctx._replace(side=ctx.side._replace(keep=True))
  segs = segments(params, cfg)

  # Pass 0: every position, every state zero; keep every layer's keys/values.
  x, bufs, states, h_lo = x0, [], None, x0
  for name, lo, _ in cfg.segments:
    if name == "middle":
      h_lo = x
      # every state zero: the memory of the parallel pass (`context`), as `parallel` runs
      out = run_span(params, cfg, segs[name], x, zero_states(cfg, B, T), ctx, cf,
                     memory=None if ctx.side is None else ctx.side.memory)
      x, (kv, _) = out.o, out.kv
      states = constrain_batch(out.state)
      ctx = out.ctx
    else:
      x, (kv, _) = run_layers(segs[name][1], cfg, x, ctx, lo)
    bufs.append(kv)
  logits0 = head(params, cfg, x)
  bufs = jax.tree.map(lambda *a: jnp.concatenate(a), *bufs)
  if kv_refresh:
    buf, extras = bufs
    zero = jnp.zeros(buf.k.shape, jnp.float32)
    old = (zero, zero)
  else:
    buf = bufs
  visited = np.zeros(T, bool)

  merged, pass_logits, acc = logits0, [logits0], None
  for pos in sets:
    prev = previous_states(cfg, states, inp.positions)
    memory = rtype.memory(cfg, prev, cf)
    if kv_refresh:
      buf, extras, old = rtype.refresh_kv(params, cfg, ctx.rope, buf, extras, old, memory,
                                          ~visited)
    m_pos = None if memory is None else memory[:, pos]
    cf_pos = cf[:, pos]
    dist = (pos[:, None] - np.arange(T)[None, :])[None]
    side = side_inputs(params, cfg, x0[:, pos], tokens_BT[:, pos], dist, m_pos)
    per_layer = jax.tree.map(lambda a: a[:, :, pos], ctx.per_layer)    # [L, B, |T_p|, ...]
    pctx = LayerCtx(rope_tables(cfg, inp.positions[:, pos]), ctx.mask[:, pos], side, per_layer,
                    collect=True)
    x, new_bufs, collected = h_lo[:, pos], [], []
    for name, lo, hi in cfg.segments:
      layer_buf = jax.tree.map(lambda a: a[lo:hi], buf)
      if name == "lower":          # never sees the recurrence: pass 0's keys stand
        new_bufs.append(layer_buf)
        continue
      if name == "middle":
        out = run_span(params, cfg, segs[name], x, at_time(prev, pos), pctx, cf_pos, kvs=layer_buf,
                       index=pos, kv_source="buffer", memory=m_pos)
        x, (nb, coll), span_stats, pctx = out.o, out.kv, out.stats, out.ctx
        states = constrain_batch(set_time(states, pos, out.state))
      else:
        x, (nb, coll) = run_layers(segs[name][1], cfg, x, pctx, lo, layer_buf, pos,
                                   kv_source="buffer")
      new_bufs.append(nb)
      collected.append(coll)
    buf = jax.tree.map(lambda *a: jnp.concatenate(a), *new_bufs)
    lg = head(params, cfg, x)
    pass_logits.append(lg)
    merged = merged.at[:, pos].set(lg)
    w = len(pos) / T
    stats = _pass_stats(rtype, cfg, span_stats, collected, cf_pos)
    acc = (jax.tree.map(lambda s: 0.0 + s * w, stats) if acc is None
           else jax.tree.map(lambda a, s: a + s * w, acc, stats))
    visited[pos] = True
  return ModeOut(merged, {"pass_logits": tuple(pass_logits), "h_final": states, **acc})


def interleaved(params, cfg: ModelConfig, tokens_BT, inp: SeqInputs, passes: int,
                kv_refresh: bool) -> ModeOut:
  """The interleaved schedule (docs/lrt_training.md): pass p runs t ≡ p−1 (mod passes)."""
  sets = pass_positions(tokens_BT.shape[1], passes, "interleaved")
  return refine_in_passes(params, cfg, tokens_BT, inp, sets, kv_refresh)


def chunked(params, cfg: ModelConfig, tokens_BT, inp: SeqInputs, passes: int,
            kv_refresh: bool) -> ModeOut:
  """The chunked baseline: pass c refines the c-th of `passes` contiguous chunks, in order.

  The same passes as `interleaved` over contiguous position sets. A chunk reads the
  merged states: the refined ones of the chunks before it, and pass 0's zero-state ones
  inside itself, so the true recurrence crosses only chunk boundaries. With chunks of
  one position this is `exact`; with one chunk, pass 0 plus one full refinement pass
  fed pass 0's shifted states.
  """
  sets = pass_positions(tokens_BT.shape[1], passes, "chunked")
  return refine_in_passes(params, cfg, tokens_BT, inp, sets, kv_refresh)


def run_interleaved(params, cfg, tokens_BT, inp, options: dict, hidden: bool = False):
  return interleaved(params, cfg, tokens_BT, inp, options["passes"], options["kv_refresh"])


def run_chunked(params, cfg, tokens_BT, inp, options: dict, hidden: bool = False):
  return chunked(params, cfg, tokens_BT, inp, options["passes"], options["kv_refresh"])


def flops(costs, options: dict, sweeps=None) -> tuple[float, float]:
  """Pass 0 over every layer, then the `passes` passes whose queries cover each position once
  (attending over all T keys) from the span on; every pass keeps its gradient."""
  forward = costs.full + costs.refined
  return forward, forward


def _pass_sets(labels_BT, options: dict, mode: str):
  return pass_positions(labels_BT.shape[1], options["passes"], mode)


def pass_loss(mode: str):
  """(Σ_p mean CE of pass p over its own positions) / (passes+1): pass 0 over every position,
  each pass's mean over its supervised positions (of `totals` when given)."""
  def loss(pass_logits, labels_BT, options: dict, totals=None):
    total = lambda i: None if totals is None else totals[i]
    sets = _pass_sets(labels_BT, options, mode)
    losses = [cross_entropy(pass_logits[0], labels_BT, total=total(0))[0]]
    losses += [cross_entropy(lg, labels_BT[:, pos], total=total(i + 1))[0]
               for i, (lg, pos) in enumerate(zip(pass_logits[1:], sets))]
    per_pass = jnp.stack(losses)
    return jnp.mean(per_pass), per_pass
  return loss


def token_totals(mode: str):
  """[passes+1]: pass 0's supervised tokens over every position, then each pass's own."""
  def totals(labels_BT, options: dict):
    sets = _pass_sets(labels_BT, options, mode)
    return jnp.stack([jnp.sum(supervised(labels_BT))]
                     + [jnp.sum(supervised(labels_BT[:, pos])) for pos in sets])
  return totals


for _mode, _run in (("interleaved", run_interleaved), ("chunked", run_chunked)):
  SCHEDULES.register(Schedule(
      name=_mode, run=_run, flops=flops, options=PassOptions, check_run=check_run,
      pass_loss=pass_loss(_mode), token_totals=token_totals(_mode), source=__name__))
