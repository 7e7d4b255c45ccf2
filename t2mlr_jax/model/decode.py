"""Decoding: exact prefill, then one token per step with a preallocated KV cache.

The decode state is a pytree: per-layer KV caches, the recurrent state of each sequence
(what the recurrence type carries, shaped as its `zero_state`: T2MLR's R_t, LRT's
fed-back output, one D-vector each, `recurrence/__init__.py`), which cache slots hold real
tokens, the next slot and each row's next position id. Prompts are left-padded (real tokens
right-aligned, as Hugging Face does with padding_side="left"), so every row
writes the same cache slot at every step. Generation runs under one jit as a
`lax.while_loop` that stops early once every row has emitted EOS.
"""

from __future__ import annotations

import functools
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from t2mlr_jax.config import ModelConfig
from t2mlr_jax.model import recurrence
from t2mlr_jax.model.control_flow import CF_PAD, CF_RECURRENT
from t2mlr_jax.model.layers import KV, attention_mask, rope_tables, to_cache
from t2mlr_jax.model.modes import SeqInputs, check_tokens, exact, parallel
from t2mlr_jax.model.sequence import side_inputs
from t2mlr_jax.model.span import at_time, run_span, with_time
from t2mlr_jax.model.transformer import (
  LayerCtx,
  embed,
  head,
  run_layers,
  split_layers,
  value_embed_inputs,
)
from t2mlr_jax.registry import SCHEDULES


def prefill_modes() -> tuple[str, ...]:
  """How a prompt can be prefilled: "exact", and each schedule that declares a parallel
  `prefill` (jacobi: sweeps to the fixed point)."""
  return ("exact", *(s.name for s in SCHEDULES.values() if s.prefill is not None))


class DecodeState(NamedTuple):
  kv: tuple           # per layer: KV, each [B·N_kv, S, K] (layers.to_cache)
  state: object       # the recurrent state, leaves [B, ...] (the type's zero_state's shape)
  valid: jnp.ndarray  # [B, S] bool: slot holds a real (non-padding) token
  index: jnp.ndarray  # int32 scalar: the next slot to write
  positions: jnp.ndarray  # [B] int32: the next token's position id


def prefill(params, cfg: ModelConfig, tokens_BT, inp: SeqInputs, cache_len: int,
            recurrent_prompt: bool = True, mode: str = "exact", tol=None,
            last_only: bool = True, hidden: bool = False):
  """Run the prompt; returns (last-position logits [B,V], DecodeState); with
  last_only=False every position's logits [B,T,V] (a prompt's own log-probabilities);
  with `hidden` (mode "exact") the last layer's output [B,T,D] instead, before the head.

  mode "exact": token by token through the recurrent span (the default);
  "jacobi" (any recurrence type): parallel Jacobi sweeps until max|Δstate| < tol, capped
  at T sweeps (exact by construction when tol is None). With a non-recurrent prompt (all cf <= 1,
  known statically) both are the parallel pass plus the state the last position leaves.
  """
  B, T = tokens_BT.shape
  if cfg.recurrence is not None and recurrent_prompt:
    run = exact if mode == "exact" else functools.partial(SCHEDULES.get(mode).prefill,
                                                          tol=tol)
  else:
    run = parallel
  if hidden:
    if mode != "exact":
      raise ValueError(f"hidden=True needs mode='exact' (got {mode!r})")
    run, last_only = functools.partial(run, hidden=True), False
  logits, _, kvs, state_BD = run(params, cfg, tokens_BT, inp, last_only=last_only)
  if state_BD is None:
    state_BD = recurrence.zero_state(cfg, B)
  per_layer = tuple(to_cache(KV(kvs[name].k[i], kvs[name].v[i]), cache_len)
                    for name, lo, hi in cfg.segments for i in range(hi - lo))
  valid = jnp.pad(inp.control_flow != CF_PAD, ((0, 0), (0, cache_len - T)))
  dec = DecodeState(per_layer, state_BD, valid, jnp.asarray(T, jnp.int32),
                    inp.positions[:, -1] + 1)
  return (logits[:, -1] if last_only else logits), dec


def decode_step(params, cfg: ModelConfig, dec: DecodeState, token_B, layers=None,
                control_flow_B=None):
  """Feed one token per row, recurrent (cf 2) unless `control_flow_B` [B] says otherwise
  (1: the row's recurrence off); returns (logits [B,V], the new DecodeState).

  `layers`: the per-layer weights (`split_layers(params["layers"])`), split once per
  generate.
  """
  layers = split_layers(params["layers"]) if layers is None else layers
  B = token_B.shape[0]
  idx = dec.index
  valid = jax.lax.dynamic_update_slice_in_dim(dec.valid, jnp.ones((B, 1), bool), idx, axis=1)
  mask = attention_mask(jnp.full((B, 1), idx), valid)
  pos = dec.positions[:, None]
  rope = rope_tables(cfg, pos)
  cf = (jnp.full((B, 1), CF_RECURRENT, jnp.int32) if control_flow_B is None
        else control_flow_B.astype(jnp.int32)[:, None])
  tok = token_B[:, None]
  x, state_BD, kv = embed(params, cfg, tok), dec.state, []
  x0, mem = x, None
  dist = (idx - jnp.arange(dec.valid.shape[1]))[None, None]
  for name, lo, hi in cfg.segments:
    side = side_inputs(params, cfg, x0, tok, dist, mem)
    ctx = LayerCtx(rope, mask, side, value_embed_inputs(params, cfg, tok))
    if name == "middle":         # the span reads the state the previous token left
      rtype = recurrence.of(cfg)
      prev_B1D = rtype.read(cfg, with_time(state_BD), pos, jnp.broadcast_to(idx, pos.shape))
      out = run_span(params, cfg, (lo, layers[lo:hi]), x, prev_B1D, ctx, cf,
                     kvs=dec.kv[lo:hi], index=idx, kv_source="cache")
      x, caches, state_BD = out.o, out.kv, at_time(out.state, 0)
      mem = None if out.ctx.side is None else out.ctx.side.memory   # the layers above read it
    else:
      x, caches = run_layers(layers[lo:hi], cfg, x, ctx, lo, dec.kv[lo:hi], idx,
                             kv_source="cache")
    kv.extend(caches)
  logits = head(params, cfg, x)[:, 0]
  return logits, DecodeState(tuple(kv), state_BD, valid, idx + 1, dec.positions + 1)


def sample(logits_BV, key, temperature: float, top_k: Optional[int], top_p: Optional[float]):
  """Greedy when temperature == 0, else temperature / top-k / top-p sampling."""
  if temperature == 0.0:
    return jnp.argmax(logits_BV, axis=-1).astype(jnp.int32)
  logits = logits_BV.astype(jnp.float32) / temperature
  if top_k is not None:
    kth = jax.lax.top_k(logits, top_k)[0][:, -1:]
    logits = jnp.where(logits < kth, -jnp.inf, logits)
  if top_p is not None:
    sorted_logits = jnp.sort(logits, axis=-1)[:, ::-1]
    probs = jax.nn.softmax(sorted_logits, axis=-1)
    # keep the smallest prefix whose mass reaches top_p (always the top token)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    keep = mass_before < top_p
    cutoff = jnp.min(jnp.where(keep, sorted_logits, jnp.inf), axis=-1, keepdims=True)
    logits = jnp.where(logits < cutoff, -jnp.inf, logits)
  return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)


def _prefill_left_padded(params, cfg, prompt, lengths, cache_len, prompt_cf,
                         recurrent_prompt, mode, tol):
  """prefill() of left-padded prompts (row b's real tokens are its last lengths[b]);
  prompt_cf [B, P]: the real tokens' control flow (recurrent_prompt: any of it is 2)."""
  P = prompt.shape[1]
  pad = P - lengths
  t = jnp.arange(P)[None, :]
  valid = t >= pad[:, None]
  # the left padding as a document of its own: attention masks it either way, and a fused
  # kernel then takes the mask (cuDNN's mask-free form needs padding at the end)
  inp = SeqInputs(jnp.where(valid, prompt_cf, CF_PAD).astype(jnp.int32),
                  jnp.maximum(t - pad[:, None], 0).astype(jnp.int32),
                  valid.astype(jnp.int32))
  return prefill(params, cfg, prompt, inp, cache_len, recurrent_prompt=recurrent_prompt,
                 mode=mode, tol=tol)


@functools.partial(jax.jit, static_argnames=(
    "cfg", "max_new_tokens", "temperature", "top_k", "top_p", "eos_id",
    "recurrent_prompt", "return_logits", "prefill_mode", "prefill_tol", "return_logprobs"))
def _generate(params, cfg, prompt, lengths, prompt_cf, rng, max_new_tokens, temperature, top_k,
              top_p, eos_id, recurrent_prompt, return_logits, prefill_mode, prefill_tol,
              return_logprobs=False):
  B, P = prompt.shape
  N = max_new_tokens
  logits, dec = _prefill_left_padded(params, cfg, prompt, lengths, P + N, prompt_cf,
                                     recurrent_prompt, prefill_mode, prefill_tol)
  keys = jax.random.split(rng, N)
  fill = 0 if eos_id is None else eos_id
  tokens = jnp.full((B, N), fill, jnp.int32)
  if return_logits:
    step_logits = jnp.zeros((B, N, cfg.vocab_size), jnp.float32)
  elif return_logprobs:     # each drawn token's log-probability at the sampling temperature
    step_logits = jnp.zeros((B, N), jnp.float32)
  else:
    step_logits = None

  def emit(i, logits, tokens, step_logits, done):
    tok = sample(logits, keys[i], temperature, top_k, top_p)
    if eos_id is not None:
      tok = jnp.where(done, eos_id, tok)
      done = done | (tok == eos_id)
    tokens = tokens.at[:, i].set(tok)
    if return_logits:
      step_logits = step_logits.at[:, i].set(logits)
    elif return_logprobs:
      logp = jax.nn.log_softmax(logits.astype(jnp.float32) / (temperature or 1.0), axis=-1)
      step_logits = step_logits.at[:, i].set(jnp.take_along_axis(logp, tok[:, None], -1)[:, 0])
    return tok, tokens, step_logits, done

  tok, tokens, step_logits, done = emit(0, logits, tokens, step_logits, jnp.zeros((B,), bool))
  extra = return_logits or return_logprobs
  if N == 1:                 # time to first token: no decode loop, no weight split
    return (tokens, step_logits) if extra else tokens
  layers = split_layers(params["layers"])

  def cond(carry):
    i, _, _, _, _, done = carry
    return (i < N) & ~jnp.all(done)

  def body(carry):
    i, tok, dec, tokens, step_logits, done = carry
    logits, dec = decode_step(params, cfg, dec, tok, layers)
    tok, tokens, step_logits, done = emit(i, logits, tokens, step_logits, done)
    return i + 1, tok, dec, tokens, step_logits, done

  carry = jax.lax.while_loop(cond, body, (jnp.int32(1), tok, dec, tokens, step_logits, done))
  return (carry[3], carry[4]) if extra else carry[3]


def _prompt_control_flow(value, B: int, P: int):
  """(cf [B, P] int32, recurrent_prompt: static bool) of `prompt_control_flow`: 1 or 2 for
  every prompt token, or a per-token [B, P] array of 1s and 2s (padding entries ignored)."""
  if np.ndim(value) == 0:
    if value not in (1, 2):
      raise ValueError(f"prompt_control_flow={value!r} is invalid: allowed 1, 2 or a [B, P] "
                       "array of them (1 non-recurrent, 2 recurrent)")
    return jnp.full((B, P), int(value), jnp.int32), int(value) == CF_RECURRENT
  if isinstance(value, jax.core.Tracer):
    raise ValueError("prompt_control_flow must be concrete (an int or a numpy array): "
                     "whether the prompt is recurrent decides how it is prefilled")
  cf = np.asarray(value)
  if cf.shape != (B, P):
    raise ValueError(f"prompt_control_flow must be 1, 2 or an array of the prompt's shape "
                     f"({B}, {P}), got shape {cf.shape}")
  bad = sorted(set(np.unique(cf).tolist()) - {0, 1, 2})
  if bad:
    raise ValueError(f"prompt_control_flow holds {bad}: allowed 1 (non-recurrent) and 2 "
                     "(recurrent); entries at left padding are ignored")
  return jnp.asarray(cf, jnp.int32), bool((cf == CF_RECURRENT).any())


def _lengths_from_pad(prompt_tokens, pad_id: int, prompt_lengths):
  """Each row's real length from its leading pad_id tokens; right-padded rows refused."""
  if isinstance(prompt_tokens, jax.core.Tracer):
    raise ValueError("pad_id needs concrete prompt_tokens; pass prompt_lengths under jit")
  toks = np.asarray(prompt_tokens)
  is_pad = toks == pad_id
  right = np.nonzero(is_pad[:, -1])[0]
  if right.size:
    raise ValueError(f"row(s) {right.tolist()} end with pad_id={pad_id}: prompts must be "
                     "left-padded (real tokens right-aligned, as a tokenizer's "
                     "padding_side='left' gives); left-pad them")
  lengths = toks.shape[1] - np.argmin(is_pad, axis=1)
  inner = [b for b in range(toks.shape[0]) if is_pad[b, toks.shape[1] - lengths[b]:].any()]
  if inner:
    raise ValueError(f"row(s) {inner} hold pad_id={pad_id} after their first real token: "
                     "prompts must be left-padded (padding first, then the real tokens)")
  if prompt_lengths is not None and not isinstance(prompt_lengths, jax.core.Tracer) and \
      not np.array_equal(np.asarray(prompt_lengths), lengths):
    raise ValueError(f"prompt_lengths={np.asarray(prompt_lengths).tolist()} disagree with the "
                     f"left padding by pad_id={pad_id} (lengths {lengths.tolist()}): give one")
  return lengths


def _check_arguments(cfg, prompt_tokens, max_new_tokens, temperature, top_k, top_p, eos_id,
                     rng, prompt_lengths, prompt_control_flow, prefill, prefill_tol,
                     pad_id=None):
  """Validate generate()/stream() arguments; returns (lengths [B], prompt cf [B, P],
  recurrent_prompt)."""
  if prefill not in prefill_modes():
    raise ValueError(f"prefill={prefill!r} is invalid: allowed one of {prefill_modes()}")
  if prefill_tol is not None and not prefill_tol > 0:
    raise ValueError(f"prefill_tol={prefill_tol!r} is invalid: allowed None or > 0")
  check_tokens(cfg, prompt_tokens, "prompt_tokens")
  B, P = prompt_tokens.shape
  if not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 1:
    raise ValueError(f"max_new_tokens={max_new_tokens!r} is invalid: allowed an integer >= 1")
  if P + max_new_tokens > cfg.max_seq_len:
    raise ValueError(f"prompt length {P} + max_new_tokens {max_new_tokens} exceeds "
                     f"max_seq_len={cfg.max_seq_len}: allowed P + max_new_tokens <= "
                     f"{cfg.max_seq_len}")
  prompt_cf, recurrent_prompt = _prompt_control_flow(prompt_control_flow, B, P)
  if pad_id is not None:
    if not 0 <= pad_id < cfg.vocab_size:
      raise ValueError(f"pad_id={pad_id!r} is invalid: allowed None or 0..{cfg.vocab_size - 1}")
    prompt_lengths = _lengths_from_pad(prompt_tokens, pad_id, prompt_lengths)
  if temperature < 0:
    raise ValueError(f"temperature={temperature!r} is invalid: allowed >= 0 (0 = greedy)")
  if top_k is not None and not 1 <= top_k <= cfg.vocab_size:
    raise ValueError(f"top_k={top_k!r} is invalid: allowed None or 1..{cfg.vocab_size}")
  if top_p is not None and not 0.0 < top_p <= 1.0:
    raise ValueError(f"top_p={top_p!r} is invalid: allowed None or a float in (0, 1]")
  if eos_id is not None and not 0 <= eos_id < cfg.vocab_size:
    raise ValueError(f"eos_id={eos_id!r} is invalid: allowed 0..{cfg.vocab_size - 1}")
  if temperature > 0 and rng is None:
    raise ValueError("rng is required when temperature > 0 (pass a jax.random key)")
  return _checked_lengths(prompt_lengths, B, P), prompt_cf, recurrent_prompt


def _checked_lengths(prompt_lengths, B, P):
  """The prompt lengths [B] int32 (None: all P), checked to lie in 1..P when concrete."""
  if prompt_lengths is None:
    return jnp.full((B,), P, jnp.int32)
  lengths = jnp.asarray(prompt_lengths, jnp.int32)
  if lengths.shape != (B,):
    raise ValueError(f"prompt_lengths must have shape ({B},), got {lengths.shape}")
  if not isinstance(lengths, jax.core.Tracer):
    lo, hi = int(lengths.min()), int(lengths.max())
    if lo < 1 or hi > P:
      raise ValueError(f"prompt_lengths hold values in [{lo}, {hi}]: allowed 1..{P}")
  return lengths


def generate(params, cfg: ModelConfig, prompt_tokens, *, max_new_tokens: int,
             temperature: float = 0.0, top_k: Optional[int] = None,
             top_p: Optional[float] = None, eos_id: Optional[int] = None, rng=None,
             prompt_lengths=None, prompt_control_flow=2, pad_id: Optional[int] = None,
             return_logits: bool = False, prefill: str = "exact",
             prefill_tol: Optional[float] = None, return_logprobs: bool = False):
  """New tokens [B, max_new_tokens] after `prompt_tokens` [B, P] (exact recurrence).

  Prompts are left-padded: row b's real tokens are its last prompt_lengths[b]
  entries (None: all P). With pad_id, the lengths come from each row's leading pad_id
  tokens, and a right-padded row is refused ("left-pad"). Generated tokens are
  recurrent (cf 2); the prompt is cf `prompt_control_flow`: 2 (models trained with every
  token recurrent), 1 (SFT models trained with non-recurrent prompts, as the official
  generate()), or a [B, P] array of 1s and 2s per prompt token (e.g. a task's control
  flow; entries at left padding are ignored). After a row emits `eos_id`, it repeats eos_id. With
  return_logits, also the logits each token was chosen from [B, N, V]; with return_logprobs
  (and not return_logits), each drawn token's log softmax(logits / temperature) [B, N]
  (temperature 0: of the logits), without the [B, N, V] buffer.
  prefill="jacobi" prefills the prompt with parallel Jacobi sweeps until
  max|Δstate| < prefill_tol (at most P sweeps: exact when prefill_tol is None) instead
  of token by token.
  """
  lengths, prompt_cf, recurrent = _check_arguments(
      cfg, prompt_tokens, max_new_tokens, temperature, top_k, top_p, eos_id, rng,
      prompt_lengths, prompt_control_flow, prefill, prefill_tol, pad_id)
  rng = jax.random.PRNGKey(0) if rng is None else rng
  return _generate(params, cfg, jnp.asarray(prompt_tokens, jnp.int32), lengths, prompt_cf, rng,
                   int(max_new_tokens), float(temperature), top_k,
                   None if top_p is None else float(top_p), eos_id, recurrent,
                   return_logits, prefill, None if prefill_tol is None else float(prefill_tol),
                   return_logprobs)


_stream_prefill = jax.jit(_prefill_left_padded, static_argnames=(
    "cfg", "cache_len", "recurrent_prompt", "mode", "tol"))
_split_layers = jax.jit(split_layers)


@functools.partial(jax.jit, static_argnames=("cfg",), donate_argnames=("dec",))
def _stream_step(params, layers, cfg, dec, token_B):
  return decode_step(params, cfg, dec, token_B, layers)


_sample = jax.jit(sample, static_argnames=("temperature", "top_k", "top_p"))


def stream(params, cfg: ModelConfig, prompt_tokens, *, max_new_tokens: int,
           temperature: float = 0.0, top_k: Optional[int] = None,
           top_p: Optional[float] = None, eos_id: Optional[int] = None, rng=None,
           prompt_lengths=None, prompt_control_flow=2, pad_id: Optional[int] = None,
           prefill: str = "exact", prefill_tol: Optional[float] = None,
           cache_len: Optional[int] = None):
  """Yield each new token [B] (numpy) as soon as it is chosen: `generate`'s tokens, one
  compiled step at a time (for chat and streaming). Stops after max_new_tokens or once
  every row has emitted eos_id (later tokens of a finished row are eos_id). The same
  arguments as `generate`; with the same rng the same tokens. cache_len (default
  P + max_new_tokens) sizes the KV cache: a fixed value lets prompts of different
  lengths reuse one compiled step."""
  lengths, prompt_cf, recurrent = _check_arguments(
      cfg, prompt_tokens, max_new_tokens, temperature, top_k, top_p, eos_id, rng,
      prompt_lengths, prompt_control_flow, prefill, prefill_tol, pad_id)
  P = prompt_tokens.shape[1]
  cache_len = P + max_new_tokens if cache_len is None else int(cache_len)
  if not P + max_new_tokens <= cache_len <= cfg.max_seq_len:
    raise ValueError(f"cache_len={cache_len} is invalid: allowed prompt length {P} + "
                     f"max_new_tokens {max_new_tokens} <= cache_len <= max_seq_len="
                     f"{cfg.max_seq_len}")
  rng = jax.random.PRNGKey(0) if rng is None else rng
  keys = jax.random.split(rng, max_new_tokens)
  # on the device once: numpy parameters would be copied to it at every step
  params = jax.device_put(params)
  logits, dec = _stream_prefill(params, cfg, jnp.asarray(prompt_tokens, jnp.int32), lengths,
                                cache_len, prompt_cf, recurrent, prefill,
                                  None if prefill_tol is None else float(prefill_tol))
  layers = None               # split after the first token is out
  done = np.zeros(prompt_tokens.shape[0], bool)
  sampling = dict(temperature=float(temperature), top_k=top_k,
                  top_p=None if top_p is None else float(top_p))
  for i in range(max_new_tokens):
    token = np.asarray(_sample(logits, keys[i], **sampling))
    if eos_id is not None:
      token = np.where(done, eos_id, token)
      done |= token == eos_id
    yield token
    if i + 1 == max_new_tokens or done.all():
      return
    layers = _split_layers(params["layers"]) if layers is None else layers
    logits, dec = _stream_step(params, layers, cfg, dec, jnp.asarray(token, jnp.int32))
