"""The serving engine: decode slots that requests join and leave between steps
(continuous batching, JetStream's prefill / insert / generate). Each slot is one row of a
batched decode state with its own KV rows, recurrent state, position, control flow,
sampling settings and random key.

All rows share one cache index, the slot the next token is written to
(`decode.DecodeState.index`); a prompt is inserted so that it ends at that index, so
each row's tokens are contiguous in its cache and slot distance is position distance
(RoPE reads position ids, masks and windows read slots). When the index reaches the
cache's end the rows roll left by the room before the oldest row; when a prompt needs
more room before the index they roll right. Batch sizes and cache lengths come in
buckets: the state moves to a bigger bucket when a request needs it and back once rows
leave, between steps, by host copies that compile nothing. What compiles is one model
decode step and one insert per (batch, cache) bucket, one token choice per batch bucket
and one first-token draw (sampling compiles once per batch, not per bucket pair), one
prefill per (prompt bucket, prompt control flow) in use and, for echo, one scoring of its
last-layer output per prompt bucket, a prompt's cache widened to each cache bucket by one
small program per (prompt bucket, cache bucket): `warmup` compiles them all ahead.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import os
from typing import NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from t2mlr_jax.model import recurrence
from t2mlr_jax.model.control_flow import CF_PAD, CF_PLAIN, CF_RECURRENT
from t2mlr_jax.model.decode import DecodeState, decode_step, prefill
from t2mlr_jax.model.layers import KV
from t2mlr_jax.model.sequence import SeqInputs
from t2mlr_jax.model.transformer import head, split_layers
from t2mlr_jax.registry import family_of

MIN_PROMPT_BUCKET = 16
MIN_CACHE_BUCKET = 256     # a 128-slot bucket: 11 programs more at start (docs/serving.md)
SERVING_MAX_LEN = 2048    # the default max_len: min(the model's context, this); docs/serving.md
CACHE_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
TOP_LOGPROBS = 5          # top alternatives kept per token (OpenAI's completions cap)


def _buckets(smallest: int, largest: int) -> tuple[int, ...]:
  """Powers of two from `smallest` below `largest`, then `largest`."""
  out, b = [], smallest
  while b < largest:
    out.append(b)
    b *= 2
  return tuple(out) + (largest,)


def _bucket(n: int, buckets: Sequence[int]) -> int:
  return next(b for b in buckets if b >= n)


@dataclasses.dataclass(frozen=True)
class Sampling:
  """One request's sampling: temperature 0 is greedy; top_k 0 and top_p 1 are off; the
  seed makes its draws its own (the same seed, the same tokens, whatever else runs)."""
  temperature: float = 0.0
  top_k: int = 0
  top_p: float = 1.0
  seed: int = 0

  def __post_init__(self):
    if not self.temperature >= 0:
      raise ValueError(f"temperature={self.temperature!r} is invalid: allowed >= 0")
    if not isinstance(self.top_k, int) or self.top_k < 0:
      raise ValueError(f"top_k={self.top_k!r} is invalid: allowed an integer >= 0 (0: off)")
    if not 0.0 < self.top_p <= 1.0:
      raise ValueError(f"top_p={self.top_p!r} is invalid: allowed a float in (0, 1]")


class Slots(NamedTuple):
  """The engine's device state: B rows, each a request or free."""
  decode: DecodeState
  token: jnp.ndarray        # [B] int32: the last token chosen (the next step feeds it)
  cf: jnp.ndarray           # [B] int32: control flow of the generated tokens (2, or 1: off)
  temperature: jnp.ndarray  # [B] f32
  top_k: jnp.ndarray        # [B] int32 (0: off)
  top_p: jnp.ndarray        # [B] f32
  key: jnp.ndarray          # [B, 2] uint32: each row's own key
  step: jnp.ndarray         # [B] int32: draws made, folded into the key
  logprobs: jnp.ndarray     # [B] bool: the row wants log-probabilities


class Prefilled(NamedTuple):
  """One prompt run through the model, its cache at the engine's cache length."""
  kv: tuple                 # per layer KV, each [N_kv, S, K]; the prompt in slots [0, P)
  valid: jnp.ndarray        # [S] bool (the left padding of its bucket: False)
  state: object             # the recurrent state the prompt leaves (the type's, unbatched)
  position: jnp.ndarray     # int32: the next token's position id
  logits: jnp.ndarray       # [V] the last position's
  length: int               # L real tokens, the last L of the bucket
  prompt_bucket: int        # P
  cache_len: int            # S


class TokenOut(NamedTuple):
  """What a row chose at one step (host values)."""
  token: int
  logprob: float                  # log p(token) under the model (before sampling's changes)
  top_ids: np.ndarray             # [TOP_LOGPROBS] the most likely tokens
  top_logprobs: np.ndarray        # [TOP_LOGPROBS] their log-probabilities


class PromptScores(NamedTuple):
  """Each prompt token's log-probability given the tokens before it (echo)."""
  logprobs: np.ndarray            # [L - 1]: tokens 1..L-1
  top_ids: np.ndarray             # [L - 1, TOP_LOGPROBS]
  top_logprobs: np.ndarray        # [L - 1, TOP_LOGPROBS]


def sample_rows(logits_BV, keys_B2, temperature_B, top_k_B, top_p_B):
  """One token per row, each with its own settings (traced: a new setting compiles
  nothing) and its own key: greedy where temperature is 0, else temperature, top-k
  (0: off) and top-p (1: off) sampling, as `decode.sample` does for one setting. When
  every row is greedy the sort and the draws are skipped (`lax.cond`)."""
  logits = logits_BV.astype(jnp.float32)
  greedy = jnp.argmax(logits, axis=-1).astype(jnp.int32)
  return jax.lax.cond(jnp.any(temperature_B > 0),
                      lambda: _drawn(logits, greedy, keys_B2, temperature_B, top_k_B, top_p_B),
                      lambda: greedy)


def _drawn(logits, greedy, keys_B2, temperature_B, top_k_B, top_p_B):
  V = logits.shape[-1]
  scaled = logits / jnp.maximum(temperature_B, 1e-6)[:, None]
  ordered = -jnp.sort(-scaled, axis=-1)                      # descending
  k = jnp.where(top_k_B > 0, jnp.minimum(top_k_B, V), V)
  kth = jnp.take_along_axis(ordered, (k - 1)[:, None], axis=-1)
  scaled = jnp.where(scaled < kth, -jnp.inf, scaled)
  ordered = jnp.where(jnp.arange(V)[None] < k[:, None], ordered, -jnp.inf)
  probs = jax.nn.softmax(ordered, axis=-1)
  mass_before = jnp.cumsum(probs, axis=-1) - probs
  keep = mass_before < top_p_B[:, None]
  cutoff = jnp.min(jnp.where(keep, ordered, jnp.inf), axis=-1, keepdims=True)
  scaled = jnp.where(scaled < cutoff, -jnp.inf, scaled)
  drawn = jax.vmap(lambda key, l: jax.random.categorical(key, l))(keys_B2, scaled)
  return jnp.where(temperature_B > 0, drawn.astype(jnp.int32), greedy)


def _logprobs(logits_BV, token_B):
  """(log p(token) [B], top ids [B, n], top log-probabilities [B, n])."""
  logp = jax.nn.log_softmax(logits_BV.astype(jnp.float32), axis=-1)
  picked = jnp.take_along_axis(logp, token_B[:, None], axis=-1)[:, 0]
  top_logp, top_ids = jax.lax.top_k(logp, TOP_LOGPROBS)
  return picked, top_ids.astype(jnp.int32), top_logp


def _logprobs_if_wanted(logits_BV, token_B, wanted_B):
  """`_logprobs` when a row wants them (`lax.cond`), else zeros: the softmax and top-k
  over the vocabulary cost a greedy stream a few percent."""
  B = token_B.shape[0]
  nothing = lambda: (jnp.zeros((B,), jnp.float32), jnp.zeros((B, TOP_LOGPROBS), jnp.int32),
                     jnp.zeros((B, TOP_LOGPROBS), jnp.float32))
  return jax.lax.cond(jnp.any(wanted_B), lambda: _logprobs(logits_BV, token_B), nothing)


def _draw_keys(slots: Slots):
  return jax.vmap(jax.random.fold_in)(slots.key, slots.step)


@functools.partial(jax.jit, static_argnames=("cfg", "recurrent"))
def _prefill(params, cfg, tokens_1P, length, cf_1P, recurrent: bool):
  """A left-padded prompt (its last `length` tokens real), its cache P slots long, and
  the last layer's output at every position (what `_score` needs for echo)."""
  P = tokens_1P.shape[1]
  t = jnp.arange(P)[None]
  pad = P - length
  real = t >= pad
  inp = SeqInputs(jnp.where(real, cf_1P, CF_PAD).astype(jnp.int32),
                  jnp.maximum(t - pad, 0).astype(jnp.int32), real.astype(jnp.int32))
  y_1PD, dec = prefill(params, cfg, tokens_1P, inp, P, recurrent_prompt=recurrent,
                       hidden=True)
  kv = tuple(KV(c.k, c.v) for c in dec.kv)
  last = head(params, cfg, y_1PD[:, -1:])[0, 0]
  return (kv, dec.valid[0], jax.tree.map(lambda a: a[0], dec.state), dec.positions[0],
          last), y_1PD[0]


@functools.partial(jax.jit, static_argnames=("cfg",))
def _score(params, cfg, y_PD, tokens_1P):
  """Echo: each prompt token's log-probability and top alternatives (position t predicts
  token t + 1), from the prefill's last-layer output: one small program per prompt
  bucket, not a second prefill."""
  logits = head(params, cfg, y_PD[None])[0]
  return _logprobs(logits[:-1], tokens_1P[0, 1:])


@functools.partial(jax.jit, static_argnames=("cache_len",))
def _widen(kv, valid_P, cache_len: int):
  """A prefill's cache and valid slots [.., P, ..] zero-padded to S = cache_len slots."""
  def pad(a):
    return jnp.pad(a, [(0, 0), (0, cache_len - a.shape[1])] + [(0, 0)] * (a.ndim - 2))
  return tuple(KV(pad(c.k), pad(c.v)) for c in kv), pad(valid_P[None])[0]


@jax.jit
def _first_token(logits_V, temperature, top_k, top_p, key):
  """A prefilled prompt's first token and its log-probabilities, drawn with the request's
  settings: one program for every bucket (sampling compiles once, not per bucket)."""
  first = sample_rows(logits_V[None], jax.random.fold_in(key, 0)[None], temperature[None],
                      top_k[None], top_p[None])
  out = _logprobs(logits_V[None], first)
  return tuple(x[0] for x in (first, *out))


@functools.partial(jax.jit, donate_argnames=("slots",))
def _insert(slots: Slots, kv, valid_S, state_D, position, prompt_bucket, row, cf,
            temperature, top_k, top_p, key, logprobs, first):
  """Place a prefilled prompt in row `row` so that it ends at the shared index (its left
  padding, invalid, may wrap round to the row's end), its first token `first` drawn."""
  dec = slots.decode
  shift = dec.index - prompt_bucket
  N = kv[0].k.shape[0]

  def put(cache, new):
    return jax.lax.dynamic_update_slice_in_dim(cache, jnp.roll(new, shift, axis=1).astype(
        cache.dtype), row * N, axis=0)
  caches = tuple(KV(put(c.k, n.k), put(c.v, n.v)) for c, n in zip(dec.kv, kv))
  valid = dec.valid.at[row].set(jnp.roll(valid_S, shift))
  state = jax.tree.map(lambda a, n: a.at[row].set(n.astype(a.dtype)), dec.state, state_D)
  dec = DecodeState(caches, state, valid, dec.index, dec.positions.at[row].set(position))
  return Slots(dec, slots.token.at[row].set(first), slots.cf.at[row].set(cf),
               slots.temperature.at[row].set(temperature), slots.top_k.at[row].set(top_k),
               slots.top_p.at[row].set(top_p), slots.key.at[row].set(key),
               slots.step.at[row].set(1), slots.logprobs.at[row].set(logprobs))


@functools.partial(jax.jit, static_argnames=("cfg",), donate_argnames=("decode",))
def _advance(params, layers, cfg, decode: DecodeState, token_B, cf_B):
  """The model's decode step for every row: (logits [B, V] in fp32, the next decode state)."""
  logits, decode = decode_step(params, cfg, decode, token_B, layers, control_flow_B=cf_B)
  return logits.astype(jnp.float32), decode


@functools.partial(jax.jit, donate_argnames=("rows",))
def _choose(rows: Slots, logits_BV):
  """Each row's next token from its logits (`rows` without its decode state: one program
  per batch bucket, whatever the cache length)."""
  token = sample_rows(logits_BV, _draw_keys(rows), rows.temperature, rows.top_k, rows.top_p)
  out = (token, *_logprobs_if_wanted(logits_BV, token, rows.logprobs))
  return rows._replace(token=token, step=rows.step + 1), out


_split_layers = jax.jit(split_layers)


@functools.lru_cache(maxsize=None)
def _state_shapes(cfg, batch: int):
  """The recurrent state of `batch` rows as its type declares it (traced once per batch
  bucket, not at every bucket move)."""
  return jax.eval_shape(lambda: recurrence.zero_state(cfg, batch))


def _empty_slots(cfg, batch: int, cache_len: int, dtype) -> Slots:
  """Host slots of `batch` free rows and `cache_len` cache slots (zeros), the KV cache in
  `dtype`."""
  zeros = np.zeros((batch * cfg.n_kv_heads, cache_len, cfg.head_dim), dtype)
  caches = tuple(KV(zeros, zeros) for _ in range(cfg.n_layers))
  state = jax.tree.map(lambda a: np.zeros(a.shape, a.dtype), _state_shapes(cfg, batch))
  dec = DecodeState(caches, state,
                    np.zeros((batch, cache_len), bool), np.int32(0),
                    np.zeros((batch,), np.int32))
  return Slots(dec, np.zeros(batch, np.int32), np.full(batch, CF_RECURRENT, np.int32),
               np.zeros(batch, np.float32), np.zeros(batch, np.int32),
               np.ones(batch, np.float32), np.zeros((batch, 2), np.uint32),
               np.zeros(batch, np.int32), np.zeros(batch, bool))


def _moved_slots(old: Slots, new: Slots, order: Sequence[int], longest: int,
                 n_kv_heads: int) -> Slots:
  """Host slots `new` holding rows `order` of `old`, with the last `longest` tokens before
  old's index right-aligned to the new index."""
  cache_len = new.decode.valid.shape[1]
  index = int(old.decode.index)
  new_index = max(longest, min(index, cache_len))
  lo, keep = index - longest, longest
  N = n_kv_heads

  def rows_of(a, per=1):
    return np.concatenate([a[r * per:(r + 1) * per] for r in order]) if order else a[:0]

  def move(a_old, a_new, per):
    src = rows_of(a_old, per)[:, lo:lo + keep]
    a_new[:src.shape[0], new_index - keep:new_index] = src
    return a_new
  caches = tuple(KV(move(c.k, n.k.copy(), N), move(c.v, n.v.copy(), N))
                 for c, n in zip(old.decode.kv, new.decode.kv))
  valid = move(old.decode.valid, new.decode.valid.copy(), 1)
  n = len(order)

  def pick(a_old, a_new):
    a_new = a_new.copy()
    a_new[:n] = rows_of(a_old)
    return a_new
  state = jax.tree.map(pick, old.decode.state, new.decode.state)
  dec = DecodeState(caches, state, valid, np.int32(new_index),
                    pick(old.decode.positions, new.decode.positions))
  fields = [pick(getattr(old, f), getattr(new, f)) for f in Slots._fields[1:]]
  return Slots(dec, *fields)


class Engine:
  """Decode slots over one model. `prefill` runs a prompt, `insert` puts it in a free
  slot and draws its first token, `step` draws the next token of every slot, `release`
  frees a slot. Not thread-safe: one thread drives it (the server's)."""

  def __init__(self, cfg, params, *, max_batch: int = 8, max_len: Optional[int] = None,
               cache_dtype: Optional[str] = None):
    family = family_of(cfg)
    if not family.decodes:
      raise ValueError(f"a {family.name} model has no decode step: the engine serves models "
                       "that decode token by token (model.arch of a decoding family)")
    if not isinstance(max_batch, int) or max_batch < 1:
      raise ValueError(f"max_batch={max_batch!r} is invalid: allowed an integer >= 1")
    limit = cfg.max_seq_len
    max_len = min(limit, SERVING_MAX_LEN) if max_len is None else max_len
    if not isinstance(max_len, int) or not 2 <= max_len <= limit:
      raise ValueError(f"max_len={max_len!r} is invalid: allowed 2..{limit} (the model's "
                       "context)")
    cache_dtype = cfg.dtype if cache_dtype is None else cache_dtype
    if cache_dtype not in CACHE_DTYPES:
      raise ValueError(f"cache_dtype={cache_dtype!r} is invalid: allowed "
                       f"{' or '.join(CACHE_DTYPES)}")
    # on the device once (numpy weights would be copied at every step), committed as
    # Orbax's are: JAX compiles again for committed arguments (docs/serving.md)
    self.device = jax.devices()[0]
    params = jax.device_put(params, self.device)
    self.cfg, self.params = cfg, params
    self.max_batch, self.max_len = max_batch, max_len
    self.cache_dtype = CACHE_DTYPES[cache_dtype]
    self.batch_buckets = _buckets(1, max_batch)
    self.cache_buckets = _buckets(min(MIN_CACHE_BUCKET, max_len), max_len)
    self.prompt_buckets = _buckets(min(MIN_PROMPT_BUCKET, max_len), max_len)
    self.layers = _split_layers(params["layers"])
    self.slots: Optional[Slots] = None
    self.rows: list = []          # per row: the owner's handle, or None (free)
    self.need: list = []          # per row: slots it still needs (span now + tokens to come)
    self.span: list = []          # per row: slots its tokens occupy (ending at the index)

  # ---------------------------------------------------------------- host bookkeeping

  @property
  def batch(self) -> int:
    return len(self.rows)

  @property
  def cache_len(self) -> int:
    return 0 if self.slots is None else self.slots.decode.valid.shape[1]

  def active(self) -> int:
    return sum(r is not None for r in self.rows)

  def prompt_bucket(self, length: int) -> int:
    return _bucket(length, self.prompt_buckets)

  def check_request(self, prompt_len: int, max_tokens: int) -> None:
    """Refuse a request that cannot fit: prompt + new tokens within max_len."""
    if prompt_len < 1:
      raise ValueError("the prompt is empty: allowed at least one token")
    if not isinstance(max_tokens, int) or max_tokens < 1:
      raise ValueError(f"max_tokens={max_tokens!r} is invalid: allowed an integer >= 1")
    if prompt_len + max_tokens > self.max_len:
      raise ValueError(f"the prompt's {prompt_len} tokens + max_tokens={max_tokens} exceed "
                       f"the context of {self.max_len} tokens")

  def cache_bytes(self, batch: Optional[int] = None, cache_len: Optional[int] = None) -> int:
    """Bytes of the KV cache at `batch` rows and `cache_len` slots (default: the largest,
    max_batch and max_len): the nbytes of the cache arrays the engine holds there."""
    slots = _empty_slots(self.cfg, batch or self.max_batch, cache_len or self.max_len,
                         self.cache_dtype)
    return sum(a.nbytes for kv in slots.decode.kv for a in kv)

  def _needs(self) -> list:
    return [self.need[r] for r in range(self.batch) if self.rows[r] is not None]

  # ---------------------------------------------------------------- device state moves

  def _put(self, tree):
    """Host values on the engine's device, committed (see `__init__`)."""
    return jax.device_put(tree, self.device)

  def _host(self) -> Slots:
    return jax.tree.map(np.asarray, self.slots)

  def _reshape(self, batch: int, cache_len: int, order: Sequence[int]) -> None:
    """Move to `batch` rows and `cache_len` slots, keeping rows `order` (in that order)
    and the tokens before the index (right-aligned to it): host copies, no compile."""
    new = _empty_slots(self.cfg, batch, cache_len, self.cache_dtype)
    if self.slots is None:
      self.slots = self._put(new)
      self.rows, self.need, self.span = [None] * batch, [0] * batch, [0] * batch
      return
    longest = max([self.span[r] for r in order] + [0])
    self.slots = self._put(_moved_slots(self._host(), new, order, longest,
                                             self.cfg.n_kv_heads))
    n = len(order)
    self.rows = [self.rows[r] for r in order] + [None] * (batch - n)
    self.need = [self.need[r] for r in order] + [0] * (batch - n)
    self.span = [self.span[r] for r in order] + [0] * (batch - n)

  def _roll(self, shift: int) -> None:
    """Move every row's tokens `shift` slots (negative: left) with the index."""
    h = self._host()
    dec = h.decode
    caches = tuple(KV(np.roll(c.k, shift, axis=1), np.roll(c.v, shift, axis=1))
                   for c in dec.kv)
    dec = dec._replace(kv=caches, valid=np.roll(dec.valid, shift, axis=1),
                       index=np.int32(int(dec.index) + shift))
    self.slots = self._put(h._replace(decode=dec))

  def _make_room(self, prompt_len: int, max_tokens: int) -> None:
    """Buckets and a layout in which a new request fits: a free row, a cache as long as
    every row's whole need (each row's tokens end at the shared index), and the prompt's
    room before the index."""
    order = [r for r in range(self.batch) if self.rows[r] is not None]
    batch = _bucket(len(order) + 1, self.batch_buckets)
    cache_len = _bucket(max(self._needs() + [prompt_len + max_tokens]), self.cache_buckets)
    if self.slots is None or batch != self.batch or cache_len != self.cache_len:
      self._reshape(batch, cache_len, order)
      order = [r for r in range(self.batch) if self.rows[r] is not None]   # rows moved
    index = int(self.slots.decode.index)
    want = max([self.span[r] for r in order] + [prompt_len])
    if index < want:
      self._roll(want - index)

  def _ensure_step_room(self) -> None:
    """Before a step: the index must be inside the cache; roll left if it is at the end."""
    if int(self.slots.decode.index) < self.cache_len:
      return
    longest = max([self.span[r] for r in range(self.batch) if self.rows[r] is not None] + [0])
    self._roll(longest - self.cache_len)

  # ---------------------------------------------------------------- the public steps

  def prefill(self, prompt: Sequence[int], *, control_flow: int = CF_RECURRENT,
              max_tokens: int = 1, echo: bool = False):
    """(Prefilled, PromptScores or None) of a prompt (token ids), every token at
    `control_flow` (2 recurrent, 1 non-recurrent), left-padded to its bucket, at the
    cache length the engine will hold it in with `max_tokens` to come."""
    if control_flow not in (CF_PLAIN, CF_RECURRENT):
      raise ValueError(f"control_flow={control_flow!r} is invalid: allowed 1 or 2")
    L = len(prompt)
    self.check_request(L, max_tokens)
    P = self.prompt_bucket(L)
    S = _bucket(max(self._needs() + [L + max_tokens]), self.cache_buckets)
    tokens = np.zeros((1, P), np.int32)
    tokens[0, P - L:] = prompt
    cf = np.full((1, P), control_flow, np.int32)
    recurrent = control_flow == CF_RECURRENT and self.cfg.recurrence is not None
    tokens = self._put(tokens)
    (kv, valid, state, position, logits), y = _prefill(
        self.params, self.cfg, tokens, self._put(np.int32(L)), self._put(cf), recurrent)
    if S > P:
      kv, valid = _widen(kv, valid, S)
    pre = Prefilled(kv, valid, state, position, logits, L, P, S)
    scores = None
    if echo:
      lp, ids, top = (np.asarray(x) for x in _score(self.params, self.cfg, y, tokens))
      scores = PromptScores(lp[P - L:], ids[P - L:], top[P - L:])
    return pre, scores

  def insert(self, owner, pre: Prefilled, max_tokens: int, *,
             control_flow: int = CF_RECURRENT, sampling: Sampling = Sampling(),
             logprobs: bool = True):
    """Put a prefilled prompt in a free slot for `owner`, who will take up to
    `max_tokens` tokens; returns (row, TokenOut of its first token). The generated
    tokens run at `control_flow` (2, or 1: the recurrence off); without `logprobs` the
    TokenOuts' log-probabilities are zeros (a step none of whose rows wants them skips
    the vocabulary's softmax and top-k)."""
    if self.active() >= self.max_batch:
      raise RuntimeError(f"every one of the {self.max_batch} slots is taken: wait for a "
                         "release (the server queues requests)")
    self._make_room(pre.length, max_tokens)
    if pre.cache_len != self.cache_len:          # the bucket moved since its prefill
      pre = _recached(pre, self.cache_len, self._put)
    row = self.rows.index(None)
    settings = _insert_settings(pre.prompt_bucket, row, control_flow, sampling, logprobs,
                                self.device)
    out = _first_token(pre.logits, *settings[3:7])
    self.slots = _insert(self.slots, pre.kv, pre.valid, pre.state, pre.position, *settings,
                         out[0])
    self.rows[row] = owner
    self.span[row] = pre.length
    self.need[row] = pre.length + max_tokens
    return row, _token_out(out)

  def step(self, return_logits: bool = False):
    """One token for every occupied row: [(row, owner, TokenOut)] (and the logits
    [B, V] with return_logits)."""
    if not self.active():
      return ([], None) if return_logits else []
    self._shrink()
    self._ensure_step_room()
    logits, decode = _advance(self.params, self.layers, self.cfg, self.slots.decode,
                              self.slots.token, self.slots.cf)
    rows, out = _choose(self.slots._replace(decode=None), logits)
    self.slots = rows._replace(decode=decode)
    token, logp, ids, top = (np.asarray(x) for x in out)
    done = []
    for r, owner in enumerate(self.rows):
      if owner is not None:
        self.span[r] += 1
        done.append((r, owner, TokenOut(int(token[r]), float(logp[r]), ids[r], top[r])))
    return (done, logits) if return_logits else done

  def release(self, row: int) -> None:
    """Free a row (its request finished or left). Row numbers hold until the next
    `insert` or `step`, which may move rows to a smaller bucket."""
    self.rows[row] = None
    self.need[row] = self.span[row] = 0

  def _shrink(self) -> None:
    """A smaller batch or cache bucket once the rows left fit one."""
    order = [r for r in range(self.batch) if self.rows[r] is not None]
    batch = _bucket(max(len(order), 1), self.batch_buckets)
    cache_len = _bucket(max(self._needs() + [1]), self.cache_buckets)
    if batch < self.batch or cache_len < self.cache_len:
      self._reshape(batch, cache_len, order)


  def warmup(self, prompt_lengths: Optional[Sequence[int]] = None,
             control_flows=(CF_RECURRENT,), echo: Sequence[bool] = (False,)) -> int:
    """Compile ahead, without running them, the programs requests will run: the decode
    step and insert of every (batch, cache) bucket, the token choices, and the prefill of
    each prompt bucket (every one up to max_len, or those of `prompt_lengths`) for each
    control flow, its echo scoring when `echo` has True, its widening to every longer
    cache bucket; traced here, compiled on up to eight cores at once. Returns the number
    of programs compiled."""
    if prompt_lengths is None:
      prompt_buckets = self.prompt_buckets
    else:
      prompt_buckets = sorted({self.prompt_bucket(n) for n in prompt_lengths})
    with concurrent.futures.ThreadPoolExecutor(min(os.cpu_count() or 1, 8)) as pool:
      compiled = [pool.submit(fn.lower(*args, **kwargs).compile)
                  for fn, args, kwargs in _programs(self, prompt_buckets, control_flows, echo)]
    for c in compiled:
      c.result()
    return len(compiled)


def _recached(pre: Prefilled, S: int, put) -> Prefilled:
  """A prefill at another cache length S: its slots [0, P) copied (host), then `put`."""
  def fit(a):
    a = np.asarray(a)
    out = np.zeros(a.shape[:1] + (S,) + a.shape[2:], a.dtype)
    out[:, :pre.prompt_bucket] = a[:, :pre.prompt_bucket]
    return put(out)
  kv = tuple(KV(fit(c.k), fit(c.v)) for c in pre.kv)
  valid = np.zeros(S, bool)
  valid[:pre.prompt_bucket] = np.asarray(pre.valid)[:pre.prompt_bucket]
  return pre._replace(kv=kv, valid=put(valid), cache_len=S)


def _token_out(out) -> TokenOut:
  token, logp, ids, top = (np.asarray(x) for x in out)
  return TokenOut(int(token), float(logp), ids, top)


def _insert_settings(prompt_bucket: int, row: int, control_flow: int, sampling: Sampling,
                     logprobs: bool, device) -> tuple:
  """An insert's per-request values, put on `device` explicitly (a step transfers
  nothing implicitly: tests run it under `jax.transfer_guard`)."""
  return jax.device_put((np.int32(prompt_bucket), np.int32(row), np.int32(control_flow),
                         np.float32(sampling.temperature), np.int32(sampling.top_k),
                         np.float32(sampling.top_p),
                         host_key(sampling.seed), np.bool_(logprobs)), device)


def host_key(seed: int) -> np.ndarray:
  """`jax.random.PRNGKey(seed)` made on the host ([2] uint32, threefry without x64: the
  seed's low 32 bits), so that no seed is transferred implicitly."""
  return np.array([0, seed & 0xFFFFFFFF], np.uint32)


def _spec(tree, device):
  """The shapes and dtypes of a tree of arrays, committed to `device` as the engine's are
  (what lowering a program needs)."""
  sharding = jax.sharding.SingleDeviceSharding(device)
  return jax.tree.map(lambda a: jax.ShapeDtypeStruct(np.shape(a), a.dtype, sharding=sharding),
                      tree)


def _programs(engine: Engine, prompt_buckets: Sequence[int], control_flows, echo):
  """(jitted function, arguments, keyword arguments) of each distinct program the
  engine runs for these prompt buckets: what `Engine.warmup` compiles."""
  cfg, seen, device = engine.cfg, set(), engine.device
  i32 = _spec(np.int32(0), device)
  shapes = functools.lru_cache(maxsize=None)(lambda n: _prefill_spec(engine, n))  # once a length
  for P in prompt_buckets:
    tokens = _spec(np.zeros((1, P), np.int32), device)
    for cf in control_flows:
      recurrent = cf == CF_RECURRENT and cfg.recurrence is not None
      if (P, recurrent) not in seen:
        seen.add((P, recurrent))
        yield _prefill, (engine.params, cfg, tokens, i32, tokens, recurrent), {}
    (kv, valid, *_), y = shapes(P)
    if any(echo):
      yield _score, (engine.params, cfg, y, tokens), {}
    for S in engine.cache_buckets:
      if S > P:
        yield _widen, (kv, valid, S), {}
  settings = _spec(_insert_settings(1, 0, CF_RECURRENT, Sampling(), True, device), device)
  logits = shapes(engine.cache_buckets[0])[0][4]
  yield _first_token, (logits, *settings[3:7]), {}
  for B in engine.batch_buckets:
    rows = _spec(_empty_slots(cfg, B, 1, engine.cache_dtype)._replace(decode=None), device)
    yield _choose, (rows, _spec(np.zeros((B, cfg.vocab_size), np.float32), device)), {}
  for S in engine.cache_buckets:
    pre = shapes(S)[0]
    for B in engine.batch_buckets:
      slots = _spec(_empty_slots(cfg, B, S, engine.cache_dtype), device)
      yield _insert, (slots, *pre[:4], *settings, i32), {}
      yield _advance, (engine.params, engine.layers, cfg, slots.decode, slots.token, slots.cf), {}


def _prefill_spec(engine: Engine, P: int):
  """Shapes of a prefill's ((kv, valid, state, position, logits), last-layer output) of a
  P-token bucket, on the engine's device."""
  tokens = jax.ShapeDtypeStruct((1, P), jnp.int32)
  run = lambda params, tokens_1P, length: _prefill(params, engine.cfg, tokens_1P, length,
                                                   tokens_1P, False)
  out = jax.eval_shape(run, engine.params, tokens, jax.ShapeDtypeStruct((), jnp.int32))
  return _spec(out, engine.device)
