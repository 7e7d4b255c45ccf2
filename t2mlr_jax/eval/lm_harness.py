"""Every model of the library as an lm-evaluation-harness model (`lm-eval==0.4.13`),
registered as `t2mlr_jax` when this module is imported (`python -m t2mlr_jax.lm_eval` is
the command line over it). From Python, import this module and call
`lm_eval.simple_evaluate(model="t2mlr_jax", model_args={...})`, or pass an instance
(`T2MLRLM(path=...)`, `T2MLRLM.from_model(cfg, params, tokenizer)`).

`model_args` (MODEL_ARGS):

    path                 a GGUF file, a Hugging Face directory, a parameter export or a
                         training workdir (t2mlr_jax.convert.loading); step: a workdir's checkpoint
    tokenizer            a directory with tokenizer.json (default: the model's own)
    batch_size           requests per compiled batch (default 8; the --batch_size flag
                         when model_args has none)
    mode                 how log-likelihoods are scored: exact (default, the true
                         recurrence), parallel (recurrence off), or a training schedule
                         (jacobi, interleaved, chunked, multi_refine; any type).
                         generate_until always decodes exactly
    dtype                compute dtype, float32 or bfloat16 (default: the model's own)
    max_length           context limit in tokens (default and maximum: the model's
                         max_seq_len)
    prompt_control_flow  2 (default: the recurrence acts on the context, as in
                         pretraining) or 1 (the context is non-recurrent, as chat/SFT
                         models are trained); continuations and generated tokens are 2
    add_bos              None (default: the tokenizer's own rule, as lm-eval's HF backend;
                         True for an lm workdir whose packing starts documents with BOS),
                         True (prepend BOS) or False (no special tokens)

Scoring follows lm-eval's Hugging Face backend: the context and continuation are
tokenized by `TemplateLM` (whole string, then split), a sequence longer than max_length
is cut from the left (the last max_length + 1 tokens, minus the last), each request is
its own sequence starting at position 0 (where the recurrent memory resets), requests
are batched longest first and right-padded (padding has control flow 0). Rolling
log-likelihoods use lm-eval's own disjoint windows, each window scored as a request.
Generation decodes left-padded batches with the library's KV-cached decoder
(`t2mlr_jax.stream`: `generate`'s tokens one compiled step at a time, so a batch stops
as soon as every row has met a stop string or EOS), contexts cut from the left to
max_length - max_gen_toks as lm-eval does; the text is cut at the first stop string.
"""

from __future__ import annotations

import json
import logging
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import lm_eval.models  # noqa: F401  (lm-eval's own models, registered before ours)
import numpy as np
from jinja2.exceptions import TemplateError
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window, simple_parse_args_string

from t2mlr_jax import registry
from t2mlr_jax.convert.loading import load_model_and_tokenizer
from t2mlr_jax.data.tokenizer import TokenizerView, render_chat_template
from t2mlr_jax.model.decode import stream
from t2mlr_jax.model.modes import BUILTIN_MODES, forward, mode_names

log = logging.getLogger(__name__)

MODEL_ARGS = ("path", "step", "tokenizer", "batch_size", "mode", "dtype", "max_length",
              "prompt_control_flow", "add_bos")
# what lm-eval's CLI and simple_evaluate add to every model's arguments: batch_size (used
# when model_args has none), and these, which a JAX model has no use for
HARNESS_ARGS = ("max_batch_size", "device", "trust_remote_code")
DTYPES = ("float32", "bfloat16")
SCORE_BUCKET = 32          # scoring lengths are rounded up to a multiple (fewer compiles)
PROMPT_BUCKET = 32         # so are generation prompts
CACHE_BUCKET = 256         # and KV cache sizes
GEN_KWARGS = ("until", "max_gen_toks", "do_sample", "temperature", "top_k", "top_p")


def _round_up(n: int, k: int) -> int:
  return -(-n // k) * k


def _check_model_args(args: dict) -> None:
  bad = sorted(set(args) - set(MODEL_ARGS))
  if bad:
    raise ValueError(f"model_args key(s) {bad} invalid for model t2mlr_jax: allowed "
                     f"{', '.join(MODEL_ARGS)}")


def _as_bool(name, value) -> Optional[bool]:
  if value is None or isinstance(value, bool):
    return value
  if isinstance(value, str) and value.lower() in ("true", "false", "none"):
    return {"true": True, "false": False, "none": None}[value.lower()]
  raise ValueError(f"{name}={value!r} is invalid: allowed True, False or None")


def _as_int(name, value, allowed: str) -> int:
  if isinstance(value, bool):
    raise ValueError(f"{name}={value!r} is invalid: allowed {allowed}")
  try:
    out = int(value)
  except (TypeError, ValueError):
    raise ValueError(f"{name}={value!r} is invalid: allowed {allowed}") from None
  if out != value and str(out) != str(value).strip():
    raise ValueError(f"{name}={value!r} is invalid: allowed {allowed}")
  return out


def _check_options(batch_size, dtype, prompt_control_flow, add_bos):
  """The model_args that need no model, checked (and parsed from CLI strings):
  (batch_size, prompt_control_flow, add_bos)."""
  batch = _as_int("batch_size", batch_size, "a positive integer (one compiled batch "
                  "shape; 'auto' is not supported)")
  if batch < 1:
    raise ValueError(f"batch_size={batch_size!r} is invalid: allowed a positive integer")
  if dtype is not None and dtype not in DTYPES:
    raise ValueError(f"dtype={dtype!r} is invalid: allowed {', '.join(DTYPES)} (default: "
                     "the model's)")
  cf = _as_int("prompt_control_flow", prompt_control_flow,
               "1 (non-recurrent context) or 2 (recurrent)")
  if cf not in (1, 2):
    raise ValueError(f"prompt_control_flow={prompt_control_flow!r} is invalid: allowed 1 "
                     "(non-recurrent context) or 2 (recurrent)")
  return batch, cf, _as_bool("add_bos", add_bos)


@register_model("t2mlr_jax")
class T2MLRLM(TemplateLM):
  """A T2MLR, LRT or plain transformer of this library behind lm-eval's `TemplateLM`."""
  own_tokenizer: Optional[Callable] = None   # a task's vocabulary: set by the lm_eval command

  def __init__(self, path: Optional[str] = None, step=None, tokenizer: Optional[str] = None,
               batch_size=8, mode: str = "exact", dtype: Optional[str] = None,
               max_length=None, prompt_control_flow=2, add_bos=None, **unknown):
    super().__init__()
    _check_model_args(unknown)
    _check_options(batch_size, dtype, prompt_control_flow, add_bos)   # before loading
    if path is None:
      raise ValueError("model_args path is required: a GGUF file, a Hugging Face "
                       "directory, a parameter export or a training workdir")
    step = None if step is None else _as_int("step", step, "a saved step (an integer)")
    cfg, params, found = load_model_and_tokenizer(str(path), step, tokenizer, own=self.own_tokenizer)
    if add_bos is None and found.documents_start_with_bos:
      add_bos = True
    self._setup(cfg, params, found.tokenizer, found.source, batch_size=batch_size,
                mode=mode, dtype=dtype, max_length=max_length,
                prompt_control_flow=prompt_control_flow, add_bos=add_bos, path=str(path))

  @classmethod
  def from_model(cls, cfg, params, tokenizer, *, name: str = "model", **options):
    """An instance over a model already in memory: `tokenizer` is an HFTokenizer
    (t2mlr_jax.data.tokenizer) or the byte tokenizer; options as model_args (batch_size,
    mode, dtype, max_length, prompt_control_flow, add_bos)."""
    bad = sorted(set(options) - set(MODEL_ARGS) | set(options) & {"path", "step", "tokenizer"})
    if bad:
      raise ValueError(f"option(s) {bad} invalid for from_model: allowed batch_size, mode, "
                       "dtype, max_length, prompt_control_flow, add_bos")
    self = cls.__new__(cls)
    TemplateLM.__init__(self)
    self._setup(cfg, params, tokenizer, name, path=name, **options)
    return self

  def _setup(self, cfg, params, tokenizer, tokenizer_source, *, batch_size=8, mode="exact",
             dtype=None, max_length=None, prompt_control_flow=2, add_bos=None,
             path="model"):
    if not registry.family_of(cfg).decodes:
      raise ValueError(f"{path!r} holds a {registry.family_of(cfg).name} model: lm-eval runs "
                       "models that decode (transformers, with or without a recurrence)")
    batch_size, prompt_control_flow, add_bos = _check_options(batch_size, dtype,
                                                              prompt_control_flow, add_bos)
    self.batch_size_per_device = batch_size
    max_length = _check_mode_and_length(cfg, mode, max_length)
    dtype = cfg.dtype if dtype is None else dtype
    self.add_bos = add_bos
    self.cfg = cfg.replace(dtype=dtype) if cfg.dtype != dtype else cfg
    self.params = params
    self.mode, self._max_length = mode, max_length
    self.prompt_control_flow = prompt_control_flow
    self.tok = (tokenizer if isinstance(tokenizer, TokenizerView)
                else TokenizerView(tokenizer, tokenizer_source))
    self.tokenizer = self.tok          # TemplateLM.chat_template reads .chat_template
    if self.tok.eos_id is None and self.tok.bos_id is None:
      raise ValueError(f"the tokenizer of {path!r} has neither an EOS nor a BOS token: "
                       "lm-eval needs one to condition an empty context on")
    self.path = path

  # ------------------------------------------------------------------ lm-eval plumbing

  @classmethod
  def create_from_arg_string(cls, arg_string: str, additional_config=None):
    """model_args as the CLI writes them ("path=...,mode=exact"), checked key by key."""
    return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

  @classmethod
  def create_from_arg_obj(cls, arg_dict: dict, additional_config=None):
    """model_args as a dict; of the harness's own arguments, batch_size is used when
    model_args has none and the others (device, max_batch_size, trust_remote_code) do
    not apply to a JAX model (JAX places arrays on its default device)."""
    args = dict(arg_dict or {})
    extra = {k: v for k, v in (additional_config or {}).items() if v is not None}
    for key in HARNESS_ARGS:
      args.pop(key, None)
    _check_model_args(args)
    if "batch_size" not in args and "batch_size" in extra:
      args["batch_size"] = extra["batch_size"]
    return cls(**args)

  @property
  def eot_token_id(self) -> int:
    return self.tok.eos_id if self.tok.eos_id is not None else self.tok.bos_id

  @property
  def prefix_token_id(self) -> int:
    """What an empty context (and a rolling window's first token) is conditioned on: BOS,
    else EOS, as lm-eval's HF backend."""
    return self.tok.bos_id if self.tok.bos_id is not None else self.tok.eos_id

  @property
  def max_length(self) -> int:
    return self._max_length

  @property
  def max_gen_toks(self) -> int:
    return 256

  @property
  def batch_size(self) -> int:
    return self.batch_size_per_device

  @property
  def tokenizer_name(self) -> str:
    return self.tok.name.replace("/", "__")

  def get_model_info(self) -> dict:
    return {"model": self.path, "mode": self.mode, "dtype": self.cfg.dtype,
            "recurrence": self.cfg.recurrence.type if self.cfg.recurrence else None,
            "num_params": int(self.cfg.num_params()), "max_length": self.max_length,
            "prompt_control_flow": self.prompt_control_flow}

  def tok_encode(self, string: str, add_special_tokens: Optional[bool] = None,
                 left_truncate_len: Optional[int] = None, **kwargs) -> list[int]:
    """Ids of `string`. add_special_tokens None follows model_args add_bos: None the
    tokenizer's post-processor (no special tokens when the string already starts with the
    BOS text, as lm-eval's HF backend), True BOS first, False no special tokens."""
    bos_text = self.tok.token_text(self.tok.bos_id)
    starts_with_bos = bool(bos_text) and string.startswith(bos_text)
    if add_special_tokens is None:
      add_special_tokens = False if starts_with_bos else self.add_bos
    if add_special_tokens is None:
      ids = self.tok.encode(string, special=True)
    else:
      ids = self.tok.encode(string, special=False)
      if add_special_tokens and self.tok.bos_id is not None and (
          not ids or ids[0] != self.tok.bos_id):
        ids = [self.tok.bos_id] + ids
    if left_truncate_len:
      ids = ids[-left_truncate_len:]
    return ids

  def tok_decode(self, tokens, skip_special_tokens: bool = True) -> str:
    if isinstance(tokens, (int, np.integer)):
      tokens = [tokens]
    return self.tok.decode(tokens, skip_special_tokens=skip_special_tokens)

  def apply_chat_template(self, chat_history: list[dict], add_generation_prompt: bool = True
                          ) -> str:
    """The tokenizer's chat template over lm-eval's messages; without a generation prompt
    the text ends with the last message's content (transformers' continue_final_message),
    so the answer continues it. A template that refuses the system role renders without
    it, as lm-eval's HF backend does."""
    text, chat_history = _render_chat(self.tok, chat_history, add_generation_prompt)
    if not add_generation_prompt and chat_history:
      last = chat_history[-1]["content"].strip()
      at = text.rfind(last)
      if last and at >= 0:
        text = text[:at + len(last)]
    return text

  # ------------------------------------------------------------------------- scoring

  def _score(self, rows: list[tuple[list[int], int]]) -> list[tuple[float, bool]]:
    """(Σ log p, greedy) of each row (tokens, n): the tokens but the last are the input,
    the last n tokens are scored, each predicted from the position before it. Rows are
    batched longest first, right-padded with control flow 0; results in the rows' order."""
    B = self.batch_size
    order = sorted(range(len(rows)), key=lambda i: -len(rows[i][0]))
    out: list = [None] * len(rows)
    for start in range(0, len(order), B):
      idx = order[start:start + B]
      tokens_BT, cf_BT, target_BT = _score_batch([rows[i] for i in idx], B, self.max_length,
                                                 self.prompt_control_flow)
      logits = forward(self.params, self.cfg, jnp.asarray(tokens_BT), mode=self.mode,
                       control_flow=jnp.asarray(cf_BT))
      logp, greedy = (np.asarray(x) for x in _reduce(logits, jnp.asarray(target_BT)))
      for r, i in enumerate(idx):
        out[i] = (float(logp[r]), bool(greedy[r]))
    return out

  def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs):
    """lm-eval's tokenized requests ((context, continuation), context ids, continuation
    ids) -> (log p(continuation | context), greedy) each."""
    rows = []
    for _, ctx, cont in requests:
      if not cont:
        raise ValueError("a loglikelihood request has an empty continuation")
      if len(cont) > self.max_length:
        raise ValueError(f"a continuation of {len(cont)} tokens is longer than max_length="
                         f"{self.max_length}")
      # cut from the left: max_length inputs, the last len(cont) of them predicting cont
      rows.append(((list(ctx) + list(cont))[-(self.max_length + 1):], len(cont)))
    return self._score(rows)

  def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
    """log p(text) over lm-eval's disjoint rolling windows of max_length tokens (the
    first conditioned on prefix_token_id); each window is its own sequence."""
    windows, owner = [], []
    for n, (string,) in enumerate(req.args for req in requests):
      for ctx, cont in map(make_disjoint_window, get_rolling_token_windows(
          token_list=self.tok_encode(string), prefix_token=self.prefix_token_id,
          max_seq_len=self.max_length, context_len=1)):
        windows.append(((None, None), ctx, cont))
        owner.append(n)
    totals = [0.0] * len(requests)
    for n, (logp, _) in zip(owner, self._loglikelihood_tokens(windows)):
      totals[n] += logp
    for req, total in zip(requests, totals):
      self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
    return totals

  # ---------------------------------------------------------------------- generation

  def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
    """Decode each context (greedy unless the request samples) with the exact recurrence
    until a stop string, EOS or max_gen_toks; the text before the first stop string."""
    groups: dict[str, list[int]] = {}
    for n, req in enumerate(requests):
      key = json.dumps(req.args[1], sort_keys=True, default=str)
      groups.setdefault(key, []).append(n)
    out: list = [None] * len(requests)
    for members in groups.values():
      gen_kwargs = requests[members[0]].args[1]
      contexts = [requests[n].args[0] for n in members]
      for n, text in zip(members, self._generate(contexts, gen_kwargs)):
        out[n] = text
        self.cache_hook.add_partial("generate_until", requests[n].args, text)
    return out

  def _generate(self, contexts: list[str], gen_kwargs: dict) -> list[str]:
    """Each context's text (before the first stop string) under one set of gen_kwargs."""
    eos_text = (self.tok.token_text(self.tok.eos_id) if self.tok.eos_id is not None
                else None)
    until, N, sampling = _generation_settings(gen_kwargs, self.max_gen_toks, self.max_length,
                                              eos_text)
    max_ctx = self.max_length - N
    encoded = [self.tok_encode(c, left_truncate_len=max_ctx) for c in contexts]
    order = sorted(range(len(contexts)), key=lambda i: -len(encoded[i]))
    pad = self.tok.pad_id if self.tok.pad_id is not None else self.eot_token_id
    B = self.batch_size
    texts: list = [None] * len(contexts)
    for start in range(0, len(order), B):
      idx = order[start:start + B]
      P = min(_round_up(len(encoded[idx[0]]), PROMPT_BUCKET), max_ctx)
      prompt_BP, lengths_B = _left_padded([encoded[i] for i in idx], B, P, pad)
      cache = min(_round_up(P + N, CACHE_BUCKET), self.cfg.max_seq_len)
      new = [[] for _ in range(B)]
      done = np.zeros(B, bool)
      done[len(idx):] = True
      for token in stream(self.params, self.cfg, prompt_BP, max_new_tokens=N,
                          eos_id=self.tok.eos_id, prompt_lengths=lengths_B,
                          prompt_control_flow=self.prompt_control_flow, cache_len=cache,
                          rng=jax.random.PRNGKey(start), **sampling):
        _take_tokens(self.tok, token, new, done, until)
        if done.all():
          break
      for r, i in enumerate(idx):
        texts[i] = _before_stops(self.tok.decode(new[r]), until)
    return texts


def _check_mode_and_length(cfg, mode: str, max_length) -> int:
  """Refuse a mode this model has not; max_length checked (default: max_seq_len)."""
  type_name = cfg.recurrence.type if cfg.recurrence is not None else "plain"
  modes = (("exact", "parallel") + tuple(m for m in mode_names() if m not in BUILTIN_MODES)
           if cfg.recurrence is not None else ("exact", "parallel"))
  if mode not in modes:
    raise ValueError(f"mode={mode!r} is invalid for this {type_name} model: allowed "
                     f"{', '.join(modes)}")
  if max_length is None:
    max_length = cfg.max_seq_len
  max_length = _as_int("max_length", max_length, f"an integer in 2..{cfg.max_seq_len} "
                       "(the model's max_seq_len)")
  if not 2 <= max_length <= cfg.max_seq_len:
    raise ValueError(f"max_length={max_length} is invalid: allowed 2..{cfg.max_seq_len} "
                     "(the model's max_seq_len)")
  return max_length


def _render_chat(tok: TokenizerView, chat_history: list[dict], add_generation_prompt: bool):
  """(text, the messages rendered): the tokenizer's chat template; a template that refuses
  the system role renders without it, as lm-eval's HF backend does."""
  if not tok.chat_template:
    raise ValueError(f"--apply_chat_template: the tokenizer {tok.name!r} has no chat "
                     "template")
  variables = dict(bos_token=tok.token_text(tok.bos_id) or "",
                   eos_token=tok.token_text(tok.eos_id) or "")
  try:
    text = render_chat_template(tok.chat_template, chat_history,
                                add_generation_prompt=add_generation_prompt, **variables)
  except TemplateError:       # a template without a system role: drop it (as lm-eval's HF)
    log.warning("the chat template failed; rendering without the system message")
    chat_history = [m for m in chat_history if m["role"] != "system"]
    text = render_chat_template(tok.chat_template, chat_history,
                                add_generation_prompt=add_generation_prompt, **variables)
  return text, chat_history


def _score_batch(rows: list[tuple[list[int], int]], B: int, max_length: int,
                 prompt_control_flow: int):
  """(tokens, control flow, targets), each (B, T), of rows (tokens, n) longest first:
  right-padded with control flow 0, targets -1 but on the last n tokens."""
  longest = len(rows[0][0]) - 1
  T = max(longest, min(_round_up(longest, SCORE_BUCKET), max_length))
  tokens_BT = np.zeros((B, T), np.int32)
  cf_BT = np.zeros((B, T), np.int32)
  target_BT = np.full((B, T), -1, np.int32)
  for r, (seq, k) in enumerate(rows):
    n = len(seq) - 1
    tokens_BT[r, :n] = seq[:-1]
    cf_BT[r, :n - k + 1] = prompt_control_flow   # the context's tokens
    cf_BT[r, n - k + 1:n] = 2                     # the continuation's, fed back
    target_BT[r, n - k:n] = seq[-k:]
  return tokens_BT, cf_BT, target_BT


def _generation_settings(gen_kwargs: dict, max_gen_toks: int, max_length: int,
                         eos_text: Optional[str]):
  """(stop strings, max new tokens, sampling kwargs) of lm-eval's gen_kwargs, checked."""
  unknown = sorted(set(gen_kwargs) - set(GEN_KWARGS) - {"max_new_tokens", "max_tokens",
                                                        "max_completion_tokens"})
  if unknown:
    raise ValueError(f"generation kwarg(s) {unknown} not supported by t2mlr_jax: allowed "
                     f"{', '.join(GEN_KWARGS)} (and max_gen_toks' aliases)")
  kwargs = normalize_gen_kwargs(gen_kwargs, max_gen_toks)
  until = [s for s in handle_stop_sequences(kwargs.pop("until", None), eos=eos_text) if s]
  N = int(kwargs.pop("max_gen_toks"))
  if N < 1 or max_length - N < 1:
    raise ValueError(f"max_gen_toks={N} is invalid: allowed 1..{max_length - 1} "
                     f"(max_length={max_length} holds the context too)")
  temperature = float(kwargs.get("temperature") or 0.0) if kwargs.get("do_sample") else 0.0
  sampling = dict(temperature=temperature, top_k=kwargs.get("top_k"),
                  top_p=kwargs.get("top_p")) if temperature > 0 else {}
  return until, N, sampling


def _left_padded(prompts: list[list[int]], B: int, P: int, pad: int):
  """(prompt (B, P) right-aligned with `pad` before, lengths (B,)); filler rows: one
  padding token."""
  prompt_BP = np.full((B, P), pad, np.int32)
  lengths_B = np.ones(B, np.int32)
  for r, ids in enumerate(prompts):
    prompt_BP[r, P - len(ids):] = ids
    lengths_B[r] = len(ids)
  return prompt_BP, lengths_B


def _take_tokens(tok: TokenizerView, token_B, new: list, done, until: list) -> None:
  """Append each unfinished row's token to `new`; a row is done at EOS (not appended) or
  once its recent text holds a stop string."""
  for r in range(len(new)):
    if done[r]:
      continue
    if tok.eos_id is not None and int(token_B[r]) == tok.eos_id:
      done[r] = True
      continue
    new[r].append(int(token_B[r]))
    if until and any(s in tok.decode(new[r][-(8 + 4 * _longest(until)):]) for s in until):
      done[r] = True


def _before_stops(text: str, until: list) -> str:
  for stop in until:
    text = text.split(stop)[0]
  return text


def _longest(strings) -> int:
  return max(len(s) for s in strings)


@jax.jit
def _reduce(logits, target):
  """(Σ log p(target), all targets greedy) per row over the positions with target >= 0."""
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  scored = target >= 0
  safe = jnp.where(scored, target, 0)
  picked = jnp.take_along_axis(logp, safe[..., None], axis=-1)[..., 0]
  total = jnp.sum(jnp.where(scored, picked, 0.0), axis=-1)
  greedy = jnp.all(jnp.where(scored, jnp.argmax(logits, axis=-1) == safe, True), axis=-1)
  return total, greedy
