"""UTF-8 bytes per token id, the denominator of bits per byte (`t2mlr_jax.eval.bpb`):
the byte tokenizer's (1 per byte id, 0 for specials) and a byte-level BPE
`tokenizer.json`'s (each token's characters mapped back to bytes; special tokens 0)."""

from __future__ import annotations

import json

import numpy as np

from t2mlr_jax.data import byte_tokenizer as bt


def byte_tokenizer_lengths() -> np.ndarray:
  """[V] UTF-8 bytes of each id of the library's byte tokenizer: 0 for <pad>/<bos>/<eos>,
  1 for each byte id."""
  lengths = np.ones(bt.VOCAB_SIZE, np.int32)
  lengths[:bt.OFFSET] = 0
  return lengths


def _byte_level_alphabet() -> dict:
  """GPT-2's byte ↔ printable-character map (the ByteLevel pre-tokenizer's), inverted."""
  keep = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
          + list(range(ord("®"), ord("ÿ") + 1)))
  chars, n = list(keep), 0
  for b in range(256):
    if b not in keep:
      keep.append(b)
      chars.append(256 + n)
      n += 1
  return {chr(c): b for b, c in zip(keep, chars)}


def hf_token_lengths(tokenizer) -> np.ndarray:
  """[V] UTF-8 bytes of each id of a byte-level BPE `tokenizer.json` (GPT-2, Llama-3,
  SmolLM2, nanochat style): the token's characters mapped back to bytes; 0 for special
  (added, special=True) tokens. `tokenizer`: a `t2mlr_jax.data.tokenizer.HFTokenizer`."""
  tok = tokenizer.tokenizer
  spec = json.loads(tok.to_str())
  types = {(spec.get("pre_tokenizer") or {}).get("type"), (spec.get("decoder") or {}).get("type")}
  pre = spec.get("pre_tokenizer") or {}
  types |= {p.get("type") for p in pre.get("pretokenizers", [])}
  if "ByteLevel" not in types:
    raise ValueError(f"tokenizer {getattr(tokenizer, 'path', '')!r} is not byte-level BPE "
                     "(no ByteLevel pre-tokenizer or decoder): allowed byte-level tokenizers, "
                     "or pass token byte lengths to bpb_sums yourself")
  special = {t["id"] for t in spec.get("added_tokens", []) if t.get("special")}
  alphabet = _byte_level_alphabet()
  lengths = np.zeros(tokenizer.vocab_size, np.int32)
  for i in range(tokenizer.vocab_size):
    piece = tok.id_to_token(i)
    if piece is None or i in special:
      continue
    lengths[i] = sum(1 if ch in alphabet else len(ch.encode("utf-8")) for ch in piece)
  return lengths
