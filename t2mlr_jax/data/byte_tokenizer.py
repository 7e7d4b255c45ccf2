"""A byte-level tokenizer for from-scratch text tasks (no download needed).

ids: 0 <pad>, 1 <bos>, 2 <eos>, then the 256 UTF-8 byte values (id = byte + 3).
"""

from __future__ import annotations

from typing import Sequence

PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
OFFSET = 3
VOCAB_SIZE = 256 + OFFSET


class ByteTokenizer:
  vocab_size = VOCAB_SIZE
  pad_id, bos_id, eos_id = PAD_ID, BOS_ID, EOS_ID

  def encode(self, text: str) -> list[int]:
    return [b + OFFSET for b in text.encode("utf-8")]

  def decode(self, ids: Sequence[int]) -> str:
    """Bytes of the ids >= OFFSET (special tokens dropped), decoded as UTF-8."""
    out = bytearray()
    for i in ids:
      i = int(i)
      if not 0 <= i < VOCAB_SIZE:
        raise ValueError(f"token id {i} is out of range: allowed 0..{VOCAB_SIZE - 1}")
      if i >= OFFSET:
        out.append(i - OFFSET)
    return out.decode("utf-8", errors="replace")


TOKENIZER = ByteTokenizer()
