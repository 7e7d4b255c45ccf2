"""Hugging Face tokenizers from a local directory, and their chat templates.

`load_tokenizer(path)` reads `tokenizer.json` with the `tokenizers` package and
`tokenizer_config.json` (special tokens, `chat_template`) — no `transformers`
needed at run time. Chat templates render with jinja2 the way transformers
does (sandboxed, trim_blocks, lstrip_blocks, `raise_exception`).
"""

from __future__ import annotations

import datetime
import json
import os
from typing import Optional, Sequence

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer


def _token_text(value) -> Optional[str]:
  """Special tokens appear as strings or as {"content": ...} dicts in tokenizer_config.json."""
  if value is None or isinstance(value, str):
    return value
  if isinstance(value, dict):
    return value.get("content")
  raise ValueError(f"cannot read special token {value!r}")


class HFTokenizer:
  """encode/decode/chat-template over a `tokenizers.Tokenizer` and its config."""

  def __init__(self, path: str):
    file = os.path.join(path, "tokenizer.json")
    if not os.path.isfile(file):
      raise ValueError(f"{path!r} has no tokenizer.json (only fast tokenizers are supported)")
    config = {}
    cfg_file = os.path.join(path, "tokenizer_config.json")
    if os.path.isfile(cfg_file):
      with open(cfg_file) as f:
        config = json.load(f)
    template_file = os.path.join(path, "chat_template.jinja")
    if config.get("chat_template") is None and os.path.isfile(template_file):
      with open(template_file) as f:
        config["chat_template"] = f.read()
    self._setup(Tokenizer.from_file(file), config, path)

  @classmethod
  def from_objects(cls, tokenizer, config: dict, path: str = "") -> "HFTokenizer":
    """From a `tokenizers.Tokenizer` and a tokenizer_config.json dict (e.g. built from a
    GGUF file's metadata)."""
    self = cls.__new__(cls)
    self._setup(tokenizer, dict(config), path)
    return self

  def _setup(self, tokenizer, config: dict, path: str) -> None:
    self.path = path
    self.tokenizer = tokenizer
    self.config = config
    self.chat_template = config.get("chat_template")
    if isinstance(self.chat_template, list):    # named templates: take "default"
      named = {t["name"]: t["template"] for t in self.chat_template}
      self.chat_template = named.get("default", next(iter(named.values())))
    self.bos_token = _token_text(config.get("bos_token"))
    self.eos_token = _token_text(config.get("eos_token"))
    self.pad_token = _token_text(config.get("pad_token"))
    self.bos_id = self._id(self.bos_token)
    self.eos_id = self._id(self.eos_token)
    self.pad_id = self._id(self.pad_token)
    self.vocab_size = self.tokenizer.get_vocab_size(with_added_tokens=True)

  def save(self, directory: str) -> list[str]:
    """Write tokenizer.json and tokenizer_config.json (with the chat template) there."""
    os.makedirs(directory, exist_ok=True)
    self.tokenizer.save(os.path.join(directory, "tokenizer.json"))
    config = {**self.config, "chat_template": self.chat_template}
    config.setdefault("tokenizer_class", "PreTrainedTokenizerFast")
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
      json.dump({k: v for k, v in config.items() if v is not None}, f, indent=2)
    return ["tokenizer.json", "tokenizer_config.json"]

  def _id(self, token: Optional[str]) -> Optional[int]:
    return None if token is None else self.tokenizer.token_to_id(token)

  def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
    return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

  def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
    return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

  def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
    """The chat template rendered as text (tokenize it with add_special_tokens=False)."""
    if not self.chat_template:
      raise ValueError(f"the tokenizer in {self.path!r} has no chat template")
    return render_chat_template(self.chat_template, messages,
                                add_generation_prompt=add_generation_prompt,
                                bos_token=self.bos_token or "", eos_token=self.eos_token or "")


def render_chat_template(template: str, messages: list[dict], **variables) -> str:
  """Render like transformers' apply_chat_template(tokenize=False)."""
  def raise_exception(message):
    raise TemplateError(message)

  def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)

  env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                      extensions=["jinja2.ext.loopcontrols"])
  env.filters["tojson"] = tojson
  env.globals["raise_exception"] = raise_exception
  env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
  return env.from_string(template).render(messages=messages, **variables)


def load_tokenizer(path: str) -> HFTokenizer:
  return HFTokenizer(path)


class TokenizerView:
  """One interface over the library's tokenizers (HFTokenizer, the byte tokenizer), for
  the lm-eval adapter and the server."""

  def __init__(self, tok, name: str):
    self.tok, self.name = tok, name
    self.bos_id = getattr(tok, "bos_id", None)
    self.eos_id = getattr(tok, "eos_id", None)
    self.pad_id = getattr(tok, "pad_id", None)
    self.chat_template = getattr(tok, "chat_template", None)
    self.is_hf = hasattr(tok, "tokenizer")

  def encode(self, text: str, special: bool) -> list[int]:
    """Token ids; `special`: the tokenizer's post-processor adds its special tokens (the
    byte tokenizer has none)."""
    if self.is_hf:
      return self.tok.tokenizer.encode(text, add_special_tokens=special).ids
    return self.tok.encode(text)

  def decode(self, ids, skip_special_tokens: bool = True) -> str:
    ids = [int(i) for i in ids]
    if self.is_hf:
      return self.tok.decode(ids, skip_special_tokens=skip_special_tokens)
    return self.tok.decode(ids)

  def token_text(self, token_id: Optional[int]) -> Optional[str]:
    if token_id is None:
      return None
    return self.decode([token_id], skip_special_tokens=False) if self.is_hf else None
