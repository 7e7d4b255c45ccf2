"""The S5 tasks' vocabulary and group algebra: the official 188-token vocabulary, its
tokenizer, permutations of 5 points, their composition, the subgroups, running states.

Token ids follow the official 188-token vocabulary exactly:

  0-3      <pad> <unk> <bos> <eos>
  4-29     a-z
  30-55    A-Z
  56-65    0-9
  66       ' ' (the blank value slot)
  67       '|' (dictionary / query separator)
  68-187   <A_xxxxx> for the 120 permutations of (1,2,3,4,5), in
           itertools.permutations order (<A_12345> = 68, <A_54321> = 187)

Composition: the state starts at the identity 12345 and an action `act` maps
`old` to `new[i] = old[act[i] - 1]` (12345∘41235 = 41235, 41235∘53124 = 52413).

Subgroups ("S4", "A4", "S3", "Z2") are permutations of (1..n) embedded in S5
by fixing the remaining points, so every group shares the `<A_xxxxx>` tokens.

Pure numpy (no jax, no model imports). The examples built from these are in
s5_examples.py, the curricula in s5_curricula.py, the Grain source in s5.py.
"""

from __future__ import annotations

import itertools
import string
from typing import Sequence

import numpy as np

# ---------------------------------------------------------------------------
# Vocabulary and tokenizer.

PAD_ID = 0
UNK_ID = 1
BOS_ID = 2
EOS_ID = 3
SPACE_ID = 66
SEP_ID = 67
ACTION_OFFSET = 68

SPECIAL_TOKENS = ("<pad>", "<unk>", "<bos>", "<eos>")
VALUE_CHARS = string.ascii_lowercase + string.ascii_uppercase + string.digits
PERMUTATIONS: tuple[tuple[int, ...], ...] = tuple(itertools.permutations((1, 2, 3, 4, 5)))
NUM_PERMUTATIONS = len(PERMUTATIONS)  # 120
IDENTITY = (1, 2, 3, 4, 5)


def action_token(perm: Sequence[int]) -> str:
  """The atomic token of a permutation of (1..5), e.g. (4,1,2,3,5) -> '<A_41235>'."""
  return "<A_" + "".join(str(int(p)) for p in perm) + ">"


VOCAB: tuple[str, ...] = (SPECIAL_TOKENS + tuple(VALUE_CHARS) + (" ", "|")
                          + tuple(action_token(p) for p in PERMUTATIONS))
VOCAB_SIZE = len(VOCAB)  # 188
VALUE_CHAR_IDS = np.arange(4, 4 + len(VALUE_CHARS), dtype=np.int32)  # ids of [a-zA-Z0-9]

_PERM_INDEX: dict[tuple[int, ...], int] = {p: i for i, p in enumerate(PERMUTATIONS)}
_PERMS_P5 = np.asarray(PERMUTATIONS, dtype=np.int64)  # [120, 5], values 1..5


def _compose_table() -> np.ndarray:
  """COMPOSE[s, a] = index of the state reached from state s by action a."""
  table = np.empty((NUM_PERMUTATIONS, NUM_PERMUTATIONS), dtype=np.int64)
  for s, old in enumerate(PERMUTATIONS):
    for a, act in enumerate(PERMUTATIONS):
      table[s, a] = _PERM_INDEX[tuple(old[i - 1] for i in act)]
  return table


_COMPOSE = _compose_table()


class S5Tokenizer:
  """Atomic-token tokenizer of the official S5-Retrieval vocabulary.

  `encode` parses greedily: a `<...>` span that is a vocabulary token becomes
  that token, anything else is read one character at a time. A character
  outside the vocabulary is an error (never silently `<unk>`).
  """
  pad_id, bos_id, eos_id = PAD_ID, BOS_ID, EOS_ID   # what generation and chat read
  turn_separator = ""     # chat joins turns with it: a turn is S5 text as typed (no newline)

  def __init__(self, vocab: Sequence[str] = VOCAB):
    self.id_to_token: tuple[str, ...] = tuple(vocab)
    self.token_to_id: dict[str, int] = {t: i for i, t in enumerate(self.id_to_token)}
    if len(self.token_to_id) != len(self.id_to_token):
      raise ValueError("vocab has duplicate tokens")
    self.vocab_size = len(self.id_to_token)

  def encode(self, text: str) -> list[int]:
    """Token ids of `text` (characters, `<special>` tokens and action tokens)."""
    ids: list[int] = []
    i = 0
    while i < len(text):
      if text[i] == "<":
        end = text.find(">", i + 1)
        if end != -1 and text[i:end + 1] in self.token_to_id:
          ids.append(self.token_to_id[text[i:end + 1]])
          i = end + 1
          continue
      ch = text[i]
      if ch not in self.token_to_id:
        raise ValueError(f"text has character {ch!r} at offset {i}, which is not in the "
                         f"S5 vocabulary (allowed: [a-zA-Z0-9], ' ', '|' and "
                         f"<pad>/<unk>/<bos>/<eos>/<A_xxxxx> tokens)")
      ids.append(self.token_to_id[ch])
      i += 1
    return ids

  def decode(self, ids: Sequence[int] | np.ndarray) -> str:
    """The text of token ids (the inverse of `encode`)."""
    out = []
    for t in np.asarray(ids).reshape(-1).tolist():
      if not 0 <= t < self.vocab_size:
        raise ValueError(f"token id {t} is out of range: allowed 0..{self.vocab_size - 1}")
      out.append(self.id_to_token[t])
    return "".join(out)

  def __repr__(self) -> str:
    return f"S5Tokenizer(vocab_size={self.vocab_size})"


TOKENIZER = S5Tokenizer()


def action_id(perm: Sequence[int]) -> int:
  """Token id of a permutation of (1..5)."""
  key = tuple(int(p) for p in perm)
  if key not in _PERM_INDEX:
    raise ValueError(f"perm={perm!r} is not a permutation of (1,2,3,4,5)")
  return ACTION_OFFSET + _PERM_INDEX[key]


def perm_of_id(token_id: int) -> tuple[int, ...]:
  """Permutation of an action token id (68..187)."""
  if not ACTION_OFFSET <= token_id < ACTION_OFFSET + NUM_PERMUTATIONS:
    raise ValueError(f"token_id={token_id} is not an action token: allowed "
                     f"{ACTION_OFFSET}..{ACTION_OFFSET + NUM_PERMUTATIONS - 1}")
  return PERMUTATIONS[token_id - ACTION_OFFSET]


# ---------------------------------------------------------------------------
# Groups.

GROUPS = ("S5", "S4", "A4", "S3", "Z2")


def compose(state: Sequence[int], action: Sequence[int]) -> tuple[int, ...]:
  """The state after `action`: new[i] = state[action[i] - 1]."""
  if len(state) != len(action):
    raise ValueError(f"state and action lengths differ: {len(state)} vs {len(action)}")
  return tuple(int(state[int(a) - 1]) for a in action)


def _is_even(perm: Sequence[int]) -> bool:
  inversions = sum(1 for i in range(len(perm)) for j in range(i + 1, len(perm))
                   if perm[i] > perm[j])
  return inversions % 2 == 0


def _group_indices(group: str) -> np.ndarray:
  """Indices into PERMUTATIONS of the group's elements, in itertools order."""
  if group == "S5":
    keep = lambda p: True
  elif group == "S4":
    keep = lambda p: p[4] == 5
  elif group == "A4":
    keep = lambda p: p[4] == 5 and _is_even(p)
  elif group == "S3":
    keep = lambda p: p[3] == 4 and p[4] == 5
  elif group == "Z2":
    keep = lambda p: p[2:] == (3, 4, 5)
  else:
    raise ValueError(f"group={group!r} is invalid: allowed {', '.join(GROUPS)}")
  return np.asarray([i for i, p in enumerate(PERMUTATIONS) if keep(p)], dtype=np.int64)


_GROUP_INDICES = {g: _group_indices(g) for g in GROUPS}


def group_elements(group: str) -> tuple[tuple[int, ...], ...]:
  """The group's elements as permutations of (1..5), identity first."""
  return tuple(PERMUTATIONS[i] for i in _group_index_array(group))


def _group_index_array(group: str) -> np.ndarray:
  if group not in _GROUP_INDICES:
    raise ValueError(f"group={group!r} is invalid: allowed {', '.join(GROUPS)}")
  return _GROUP_INDICES[group]


def running_states(action_indices: np.ndarray) -> np.ndarray:
  """Permutation indices of the running state after each action (identity start)."""
  states = np.empty(len(action_indices), dtype=np.int64)
  s = _PERM_INDEX[IDENTITY]
  for t, a in enumerate(action_indices):
    s = _COMPOSE[s, a]
    states[t] = s
  return states


# ---------------------------------------------------------------------------
# Argument checks shared by the S5 modules.

def _check_positive(name: str, value: int) -> None:
  if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
    raise ValueError(f"{name}={value!r} is invalid: allowed integers >= 1")
