"""A word-level tokenizer over a fixed vocabulary, for from-scratch tasks whose text is
made of a small set of words (Pathfinding's node names, ProsQA's concepts): one token per
word keeps sequences short enough for a CPU.

Text is split into newlines, `###`, `->`, words ([A-Za-z0-9_']+) and single punctuation
marks; spaces separate tokens. `decode` writes one space between tokens except before
`.,?:!;` and around newlines, so canonical text (single spaces, none around newlines)
round-trips exactly. A word outside the vocabulary is an error naming it (never <unk>).
ids: 0 <pad>, 1 <bos>, 2 <eos>, 3 newline, then the vocabulary's words in order.
"""

from __future__ import annotations

import re
from typing import Iterable, Sequence

import numpy as np

PAD_ID, BOS_ID, EOS_ID, NEWLINE_ID = 0, 1, 2, 3
SPECIALS = ("<pad>", "<bos>", "<eos>", "\n")
_TOKEN_RE = re.compile(r"\n|###|->|[A-Za-z0-9_']+|[^\sA-Za-z0-9_']")
_NO_SPACE_BEFORE = frozenset(".,?:!;")


def split_words(text: str) -> list[str]:
  """The tokens of `text` as strings (spaces, tabs and carriage returns dropped)."""
  return _TOKEN_RE.findall(text)


class WordTokenizer:
  """Atomic-word tokenizer of one task's vocabulary (what chat, serving and the loaders read)."""
  pad_id, bos_id, eos_id = PAD_ID, BOS_ID, EOS_ID
  turn_separator = "\n"     # chat joins turns with a newline token

  def __init__(self, words: Iterable[str], name: str = "words"):
    words = tuple(words)
    for w in words:
      if split_words(w) != [w] or w in SPECIALS:
        raise ValueError(f"vocabulary word {w!r} is invalid: allowed one token of "
                         "split_words (a word, '->', '###' or one punctuation mark)")
    self.id_to_token: tuple[str, ...] = SPECIALS + words
    self.token_to_id = {t: i for i, t in enumerate(self.id_to_token)}
    if len(self.token_to_id) != len(self.id_to_token):
      raise ValueError(f"vocabulary {name!r} has duplicate words")
    self.name = name
    self.vocab_size = len(self.id_to_token)

  def encode(self, text: str) -> list[int]:
    """Token ids of `text`; a word outside the vocabulary is a ValueError naming it."""
    ids = []
    for w in split_words(text):
      i = self.token_to_id.get(w)
      if i is None or i < len(SPECIALS) and w != "\n":
        raise ValueError(f"text has the word {w!r}, which is not in the {self.name} "
                         f"vocabulary ({self.vocab_size} tokens)")
      ids.append(i)
    return ids

  def decode(self, ids: Sequence[int] | np.ndarray) -> str:
    """The text of token ids (<pad>, <bos>, <eos> dropped); the inverse of `encode` on
    canonical text. An id past the vocabulary (a model's embedding table may be larger:
    rows no text uses) reads `<idN>`, so any model output decodes."""
    out: list[str] = []
    prev = None
    for t in np.asarray(ids).reshape(-1).tolist():
      if t < 0:
        raise ValueError(f"token id {t} is out of range: allowed ids >= 0")
      if t < NEWLINE_ID:
        continue
      w = self.id_to_token[t] if t < self.vocab_size else f"<id{t}>"
      if prev is not None and prev != "\n" and w != "\n" and w not in _NO_SPACE_BEFORE:
        out.append(" ")
      out.append(w)
      prev = w
    return "".join(out)

  def __repr__(self) -> str:
    return f"WordTokenizer({self.name!r}, vocab_size={self.vocab_size})"
