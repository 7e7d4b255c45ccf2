"""A conversation with a model, its answers streamed token by token: what `python -m
t2mlr_jax.chat` runs, usable from Python (`ChatSession(cfg, params, tokenizer).reply(text)`)."""

from __future__ import annotations

import itertools
import time
from typing import Callable, Optional

import jax
import numpy as np

from t2mlr_jax import stream

PROMPT_BUCKET = 64       # prompts are left-padded to a multiple (fewer prefill compiles)
CACHE_BUCKET = 256       # KV cache sizes are multiples (fewer decode-step compiles)


def _round_up(n: int, k: int) -> int:
  return -(-n // k) * k


class ChatSession:
  """A conversation with one model: `reply(text, on_text)` streams the answer."""

  def __init__(self, cfg, params, tokenizer, *, system: Optional[str] = None,
               max_new_tokens: int = 256, temperature: float = 0.0,
               top_k: Optional[int] = None, top_p: Optional[float] = None, seed: int = 0,
               prompt_control_flow: int = 1):
    self.cfg, self.params, self.tok = cfg, params, tokenizer
    self.system, self.max_new_tokens = system, max_new_tokens
    self.sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p)
    self.prompt_control_flow = prompt_control_flow
    self.seed, self.turn = seed, 0
    self.messages: list[dict] = []
    self.compiled: set[tuple[int, int]] = set()   # (prompt bucket, cache size) warmed up
    if self.tok.eos_id is None:
      raise ValueError("the tokenizer has no eos_token: answers would never end")

  def reset(self) -> None:
    """Forget the conversation (the system prompt stays)."""
    self.messages = []

  def _prompt_ids(self, messages) -> list[int]:
    system = [{"role": "system", "content": self.system}] if self.system else []
    if not getattr(self.tok, "chat_template", None):   # a base model: the turns' text
      sep = getattr(self.tok, "turn_separator", "\n")    # a task's vocabulary may lack \n
      return self.tok.encode(sep.join(m["content"] for m in messages) + sep)
    return self.tok.encode(self.tok.apply_chat_template(system + messages))

  def reply(self, text: str, on_text: Callable[[str], None] = lambda s: None) -> dict:
    """Append the user's turn, generate the answer (calling on_text with each new piece
    of text), append it; returns the answer and timings. The first reply of a prompt
    bucket and cache size compiles its prefill and decode step first, timed on its own
    (compile_s): time to first token and decode speed are those of compiled programs."""
    messages = self.messages + [{"role": "user", "content": text}]
    limit = self.cfg.max_seq_len - self.max_new_tokens
    ids = self._prompt_ids(messages)
    while len(ids) > limit and len(messages) > 1:     # forget the oldest exchanges
      messages = messages[2:]
      ids = self._prompt_ids(messages)
    if len(ids) > limit:                  # the message alone is too long: keep the history
      raise ValueError(f"the message needs {len(ids)} tokens; at most {limit} fit before "
                       f"the {self.max_new_tokens} new tokens (max_seq_len="
                       f"{self.cfg.max_seq_len})")
    P = min(_round_up(len(ids), PROMPT_BUCKET), limit)
    pad = self.tok.pad_id if self.tok.pad_id is not None else self.tok.eos_id
    prompt = np.array([[pad] * (P - len(ids)) + ids], np.int32)
    cache = min(_round_up(P + self.max_new_tokens, CACHE_BUCKET), self.cfg.max_seq_len)
    rng = jax.random.PRNGKey(self.seed + self.turn)
    self.turn += 1
    tokens = lambda: stream(self.params, self.cfg, prompt, max_new_tokens=self.max_new_tokens,
                            eos_id=self.tok.eos_id, rng=rng, prompt_lengths=[len(ids)],
                            prompt_control_flow=self.prompt_control_flow, cache_len=cache,
                            **self.sampling)
    compile_s = 0.0
    if (P, cache) not in self.compiled:     # compile prefill + step apart from the timings
      start = time.perf_counter()
      for _ in itertools.islice(tokens(), 2):    # the prefill and one decode step
        pass
      compile_s = time.perf_counter() - start
      self.compiled.add((P, cache))
    out, shown, start, first, steps = [], "", time.perf_counter(), None, 0
    for token in tokens():
      first = time.perf_counter() if first is None else first
      steps += 1
      if int(token[0]) == self.tok.eos_id:
        break
      out.append(int(token[0]))
      text_so_far = self.tok.decode(out)
      if not text_so_far.endswith("\ufffd"):         # wait for a complete UTF-8 character
        on_text(text_so_far[len(shown):])
        shown = text_so_far
    answer = self.tok.decode(out)
    if answer != shown:
      on_text(answer[len(shown):])
    self.messages = messages + [{"role": "assistant", "content": answer}]
    end = time.perf_counter()
    first = first or end
    return {"answer": answer, "tokens": len(out), "prompt_tokens": len(ids),
            "compile_s": compile_s, "prompt_bucket": P, "cache_len": cache,
            "time_to_first_token_s": first - start, "seconds": end - start,
            "decode_tokens_per_s": (steps - 1) / (end - first) if steps > 1 else None}


def stats_line(info: dict) -> str:
  """--stats: compile time (when this reply compiled), time to first token and decode
  speed of the compiled programs."""
  lines = []
  if info["compile_s"]:
    lines.append(f"[compiled in {info['compile_s']:.1f} s: prefill of a "
                 f"{info['prompt_bucket']}-token prompt bucket, decode step of a "
                 f"{info['cache_len']}-token cache]")
  rate = info["decode_tokens_per_s"]
  speed = f"decode {rate:.1f} tokens/s" if rate is not None else "no decode step"
  lines.append(f"[{info['prompt_tokens']} prompt tokens, {info['tokens']} new; first token "
               f"{info['time_to_first_token_s'] * 1e3:.0f} ms, {speed}]")
  return "\n".join(lines)
