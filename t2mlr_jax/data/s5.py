"""S5-Retrieval and the S5 word problem: the official vocabulary, generators, a Grain source.

S5-Retrieval (docs/experiments.md#tasks) tests state tracking and retrieval together: a
shuffled dictionary maps action tokens (permutations of 5 points) to random character
strings, then a stream of actions follows, each with v blank slots. At an
action the model must emit the running permutation product; at the slots it
must copy the dictionary value keyed by that action. Transformers fail at long
lengths, LSTMs fail at retrieval (the T2MLR paper) — hence the task.

Everything here is pure numpy (no jax, no model imports) and deterministic
from a seed. Token ids follow the official 188-token vocabulary exactly:

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

Example layout (label shift 0: position t is scored against target[t]):

  input   <A_k1> c c c c ... <A_kD> c c c c  |  <A_a1> _ _ _ _ ... <A_aN> _ _ _ _
  target  (copies of the input ..............)   <S_1>  value(a1)  ... <S_N> value(aN)
  cf      1 .................................  1  2 ........................... 2

where `_` is a blank (space), `<S_t>` the running state after action t, and
value(a) the dictionary value of key a (blanks in the no-retrieval variant).
"""

from __future__ import annotations

import itertools
import string
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import numpy as np

from t2mlr_jax.losses import IGNORE as IGNORE_ID

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
# Generators.

SeedLike = Union[int, Sequence[int], np.random.SeedSequence, np.random.Generator]


def _check_positive(name: str, value: int) -> None:
  if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
    raise ValueError(f"{name}={value!r} is invalid: allowed integers >= 1")


def _draw_actions(rng: np.random.Generator, num_actions: int, group: str) -> np.ndarray:
  elements = _group_index_array(group)
  return elements[rng.integers(0, len(elements), size=num_actions)]


def generate_example(seed: SeedLike, num_actions: int, *, value_len: int = 4,
                     dict_size: Optional[int] = None, retrieval: bool = True,
                     group: str = "S5", full_dictionary: bool = False) -> dict[str, np.ndarray]:
  """One S5-Retrieval example: dict(input_ids, target_ids, control_flow), int32 [L].

  Args:
    seed: anything `np.random.default_rng` accepts; the example is a pure
      function of it and the other arguments.
    num_actions: N >= 1, the number of action steps.
    value_len: v >= 1, characters per dictionary value (= blank slots per step).
    dict_size: N_dict, the number of dictionary pairs. Default min(N, |group|).
      Must be at least the number of distinct actions drawn (which depends on
      the seed) and at most |group|; `dict_size >= min(N, |group|)` never fails.
    retrieval: False gives the no-retrieval variant: value slots target blanks.
    group: one of GROUPS; actions are uniform over its elements (identity included).
    full_dictionary: the dictionary holds every group element (N_dict = |group|).

  Length L = N_dict*(1+v) + 1 + N*(1+v), i.e. 10N+1 for v=4 and N_dict = N.
  """
  _check_positive("num_actions", num_actions)
  _check_positive("value_len", value_len)
  elements = _group_index_array(group)
  order = len(elements)
  if full_dictionary:
    if dict_size is not None and dict_size != order:
      raise ValueError(f"dict_size={dict_size!r} is invalid with full_dictionary=True: "
                       f"allowed None or {order} (the order of {group})")
    n_dict = order
  elif dict_size is None:
    n_dict = min(num_actions, order)
  else:
    _check_positive("dict_size", dict_size)
    if dict_size > order:
      raise ValueError(f"dict_size={dict_size} is invalid: allowed at most {order}, the "
                       f"number of elements of {group}")
    n_dict = dict_size

  rng = np.random.default_rng(seed)
  actions_N = _draw_actions(rng, num_actions, group)
  used = np.unique(actions_N)
  if len(used) > n_dict:
    raise ValueError(f"dict_size={n_dict} is invalid: this example uses {len(used)} "
                     f"distinct actions; allowed dict_size >= {len(used)} (use "
                     f"dict_size >= min(num_actions, {order}) to be safe for every seed)")
  others = np.setdiff1d(elements, used)
  extra = rng.choice(others, size=n_dict - len(used), replace=False)
  keys_D = rng.permutation(np.concatenate([used, extra]).astype(np.int64))
  values_DV = rng.choice(VALUE_CHAR_IDS, size=(n_dict, value_len))  # int32 char ids

  # Dictionary + separator: inputs and targets coincide, cf 1.
  dict_rows = np.concatenate([(keys_D + ACTION_OFFSET)[:, None], values_DV], axis=1)
  head = np.concatenate([dict_rows.reshape(-1), [SEP_ID]]).astype(np.int32)

  # Action steps: action then v blanks; targets are the running state then the value.
  value_of = {int(k): values_DV[d] for d, k in enumerate(keys_D)}
  states_N = running_states(actions_N)
  step_in = np.full((num_actions, 1 + value_len), SPACE_ID, dtype=np.int32)
  step_in[:, 0] = actions_N + ACTION_OFFSET
  step_tgt = np.full((num_actions, 1 + value_len), SPACE_ID, dtype=np.int32)
  step_tgt[:, 0] = states_N + ACTION_OFFSET
  if retrieval:
    step_tgt[:, 1:] = np.stack([value_of[int(a)] for a in actions_N])

  input_ids = np.concatenate([head, step_in.reshape(-1)]).astype(np.int32)
  target_ids = np.concatenate([head, step_tgt.reshape(-1)]).astype(np.int32)
  control_flow = np.concatenate([np.ones(len(head), np.int32),
                                 np.full(step_in.size, 2, np.int32)])
  return dict(input_ids=input_ids, target_ids=target_ids, control_flow=control_flow)


def generate_word_problem(seed: SeedLike, num_actions: int, *,
                          group: str = "S5") -> dict[str, np.ndarray]:
  """The plain word problem: N action tokens, each targeting the running state; cf all 2."""
  _check_positive("num_actions", num_actions)
  _group_index_array(group)  # validates `group`
  rng = np.random.default_rng(seed)
  actions_N = _draw_actions(rng, num_actions, group)
  return dict(input_ids=(actions_N + ACTION_OFFSET).astype(np.int32),
              target_ids=(running_states(actions_N) + ACTION_OFFSET).astype(np.int32),
              control_flow=np.full(num_actions, 2, np.int32))


def control_flow(input_ids, pad_id: int = PAD_ID) -> np.ndarray:
  """The control flow the S5 tasks train with, rebuilt from token ids [L] or [B, L]: 1
  (non-recurrent) up to and including the first separator (the dictionary), 2 after it
  (the actions); rows without a separator (word problems) are all 2; pad_id positions
  are 0. What `forward(..., mode="exact", control_flow=...)` needs to score S5 inputs as
  the model was trained."""
  ids = np.asarray(input_ids)
  if ids.ndim not in (1, 2) or not np.issubdtype(ids.dtype, np.integer):
    raise ValueError(f"input_ids must be integer token ids of shape [L] or [B, L], got "
                     f"{ids.dtype} of shape {ids.shape}")
  rows = ids.reshape(-1, ids.shape[-1])
  is_sep = rows == SEP_ID
  has_sep = is_sep.any(axis=1, keepdims=True)
  after_sep = np.cumsum(is_sep, axis=1) - is_sep > 0        # strictly after the first SEP
  cf = np.where(has_sep & ~after_sep, 1, 2).astype(np.int32)
  cf[rows == pad_id] = 0
  return cf.reshape(ids.shape)


def sequence_length(num_actions: int, *, value_len: int = 4, dict_size: Optional[int] = None,
                    group: str = "S5", full_dictionary: bool = False) -> int:
  """Length of `generate_example(...)` for these arguments (for choosing seq_len)."""
  _check_positive("num_actions", num_actions)
  _check_positive("value_len", value_len)
  order = len(_group_index_array(group))
  if full_dictionary:
    n_dict = order
  else:
    n_dict = min(num_actions, order) if dict_size is None else dict_size
  return (n_dict + num_actions) * (1 + value_len) + 1


# ---------------------------------------------------------------------------
# Metric masks.

def state_positions(example: Mapping[str, np.ndarray]) -> np.ndarray:
  """Bool mask of the action positions (whose targets are states), any shape.

  Works on single examples and padded batches alike: an action step position
  (cf 2) holding an action token. Its sum over the last axis is N.
  """
  ids = np.asarray(example["input_ids"])
  cf = np.asarray(example["control_flow"])
  return (cf == 2) & (ids >= ACTION_OFFSET) & (ids < ACTION_OFFSET + NUM_PERMUTATIONS)


def value_positions(example: Mapping[str, np.ndarray]) -> np.ndarray:
  """Bool mask of the value slots (blank inputs of action steps), any shape."""
  ids = np.asarray(example["input_ids"])
  cf = np.asarray(example["control_flow"])
  return (cf == 2) & (ids == SPACE_ID)


def value_slots(example: Mapping[str, np.ndarray]) -> np.ndarray:
  """Int array, any shape: k at the k-th value slot after an action (1..v), 0 elsewhere.
  Splits value accuracy by character: a model can hold the first characters of a
  dictionary's values and not the rest."""
  state, value = state_positions(example), value_positions(example)
  idx = np.broadcast_to(np.arange(state.shape[-1]), state.shape)
  last_action = np.maximum.accumulate(np.where(state, idx, -1), axis=-1)
  return np.where(value & (last_action >= 0), idx - last_action, 0)


def position_masks(example: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
  """Masks for metrics: 'state', 'value', 'answer' (state | value), 'dictionary' (cf 1)."""
  state = state_positions(example)
  value = value_positions(example)
  cf = np.asarray(example["control_flow"])
  return dict(state=state, value=value, answer=state | value, dictionary=cf == 1)


# ---------------------------------------------------------------------------
# Lengths, curriculum, Grain source, batching.

def sample_num_actions(rng: np.random.Generator, min_actions: int, max_actions: int) -> int:
  """A length drawn uniformly from min_actions..max_actions (inclusive)."""
  _check_positive("min_actions", min_actions)
  _check_positive("max_actions", max_actions)
  if max_actions < min_actions:
    raise ValueError(f"max_actions={max_actions} is invalid: allowed >= "
                     f"min_actions={min_actions}")
  return int(rng.integers(min_actions, max_actions + 1))


def length_curriculum(step: int, start: int, end: int, warmup_steps: int,
                      hold_steps: int = 0) -> int:
  """Maximum length at `step`: `start` for the first `hold_steps` steps, then linear from
  `start` to `end` over the next `warmup_steps` steps (rounded down), then `end`.

  warmup_steps = 0 means `end` right after the hold. The hold lets a short-sequence
  circuit form first: for S5-Retrieval short sequences also mean small dictionaries,
  where the lookup is learned (docs/experiments.md).
  Use with S5Source via functools.partial(length_curriculum, start=..., end=...,
  warmup_steps=..., hold_steps=...).
  """
  _check_positive("start", start)
  _check_positive("end", end)
  if end < start:
    raise ValueError(f"end={end} is invalid: allowed >= start={start}")
  if warmup_steps < 0:
    raise ValueError(f"warmup_steps={warmup_steps} is invalid: allowed >= 0")
  if hold_steps < 0:
    raise ValueError(f"hold_steps={hold_steps} is invalid: allowed >= 0")
  if step < 0:
    raise ValueError(f"step={step} is invalid: allowed >= 0")
  if step < hold_steps:
    return start
  step -= hold_steps
  if warmup_steps == 0 or step >= warmup_steps:
    return end
  return start + ((end - start) * step) // warmup_steps


def parse_group_curriculum(text: str, group: str) -> tuple[tuple[str, int], ...]:
  """Stages "Z2:2000" or "Z2:1000,S3:3000" (train on Z2 up to step 1000, then S3 up to
  3000, then `group`). A stage may mix groups, "Z2+S3:2000": each of its examples draws
  its group uniformly from those listed. Each stage's groups must be subgroups of `group`
  (so their action tokens and dictionaries are a subset) and the steps must increase."""
  stages, last = [], -1
  for part in filter(None, (x.strip() for x in text.split(","))):
    name, sep, until = part.partition(":")
    names = name.split("+")
    if (not all(n in GROUPS for n in names) or len(set(names)) != len(names) or not sep
        or not until.strip().isdigit()):
      raise ValueError(f"group curriculum stage {part!r} is invalid: allowed 'GROUP:STEP' "
                       f"or 'GROUP+GROUP:STEP' with each GROUP one of {', '.join(GROUPS)} "
                       f"(no repeats) and STEP an integer >= 0")
    for n in names:
      if not set(group_elements(n)) <= set(group_elements(group)):
        raise ValueError(f"group curriculum stage {part!r} is invalid: {n} is not a "
                         f"subgroup of {group}")
    if int(until) <= last:
      raise ValueError(f"group curriculum stage {part!r} is invalid: steps must increase")
    stages.append((name, int(until)))
    last = int(until)
  return tuple(stages)


def _stage_at(step: int, stages: Sequence[tuple[Any, int]], after: Any) -> Any:
  """The setting of the first stage (setting, until) with step < until, else `after`."""
  return next((setting for setting, until in stages if step < until), after)


def group_curriculum(step: int, stages: Sequence[tuple[str, int]], group: str) -> str:
  """The group of training step `step`: the first stage (name, until) with step < until,
  else `group` ("Z2+S3" names a mixed stage). Small groups first mean small
  S5-Retrieval dictionaries first, where the lookup circuit forms (docs/experiments.md)."""
  return _stage_at(step, stages, group)


def parse_value_curriculum(text: str, value_len: int) -> tuple[tuple[int, int], ...]:
  """Stages "1:3000" or "1:2000,2:4000" (values of 1 character up to step 2000, then 2 up
  to 4000, then `value_len`). Each stage's length must be 1..value_len and the steps must
  increase: short values first, as small groups first, let the state and the lookup form
  before the values grow (docs/experiments.md)."""
  stages, last = [], -1
  for part in filter(None, (x.strip() for x in text.split(","))):
    v, sep, until = part.partition(":")
    if not (sep and v.strip().isdigit() and until.strip().isdigit()
            and 1 <= int(v) <= value_len):
      raise ValueError(f"value curriculum stage {part!r} is invalid: allowed 'V:STEP' with "
                       f"V an integer 1..{value_len} (data.value_len) and STEP an integer "
                       f">= 0")
    if int(until) <= last:
      raise ValueError(f"value curriculum stage {part!r} is invalid: steps must increase")
    stages.append((int(v), int(until)))
    last = int(until)
  return tuple(stages)


def value_curriculum(step: int, stages: Sequence[tuple[int, int]], value_len: int) -> int:
  """The value length of training step `step`: the first stage (v, until) with
  step < until, else `value_len`."""
  return _stage_at(step, stages, value_len)


class S5Source:
  """Grain `RandomAccessDataSource` of S5-Retrieval (or word-problem) examples.

  Example `index` is a pure function of (base_seed, index): its length N is
  uniform over min_actions..max_actions and its content comes from an
  independent stream, so any worker, order or restart sees the same data.

  `curriculum` (optional) maps a training step to the current maximum length
  (e.g. functools.partial(length_curriculum, ...)); index i belongs to step
  i // examples_per_step, and N is then uniform over
  min_actions..clip(curriculum(step), min_actions, max_actions). The step
  mapping assumes indices are read in order (no global shuffle), which costs
  nothing here since every index is already an independent random example.
  `group_schedule` (optional) likewise maps the step to the group actions are drawn
  from (e.g. functools.partial(group_curriculum, stages=..., group=...)), and
  `value_schedule` (optional) the step to the value length (value_curriculum).
  """

  def __init__(self, num_examples: int, *, min_actions: int = 1, max_actions: int = 32,
               base_seed: int = 0, value_len: int = 4, dict_size: Optional[int] = None,
               retrieval: bool = True, group: str = "S5", full_dictionary: bool = False,
               word_problem: bool = False,
               curriculum: Optional[Callable[[int], int]] = None,
               examples_per_step: int = 1,
               group_schedule: Optional[Callable[[int], str]] = None,
               value_schedule: Optional[Callable[[int], int]] = None):
    _check_positive("num_examples", num_examples)
    _check_positive("min_actions", min_actions)
    _check_positive("max_actions", max_actions)
    _check_positive("value_len", value_len)
    _check_positive("examples_per_step", examples_per_step)
    if max_actions < min_actions:
      raise ValueError(f"max_actions={max_actions} is invalid: allowed >= "
                       f"min_actions={min_actions}")
    if not isinstance(base_seed, (int, np.integer)) or base_seed < 0:
      raise ValueError(f"base_seed={base_seed!r} is invalid: allowed integers >= 0")
    order = len(_group_index_array(group))
    if dict_size is not None and not full_dictionary:
      _check_positive("dict_size", dict_size)
      if not min(max_actions, order) <= dict_size <= order:
        raise ValueError(f"dict_size={dict_size} is invalid: allowed "
                         f"{min(max_actions, order)}..{order} (at least "
                         f"min(max_actions, |{group}|) so that every example fits)")
    self.num_examples = int(num_examples)
    self.min_actions = int(min_actions)
    self.max_actions = int(max_actions)
    self.base_seed = int(base_seed)
    self.value_len = int(value_len)
    self.dict_size = dict_size
    self.retrieval = bool(retrieval)
    self.group = group
    self.full_dictionary = bool(full_dictionary)
    self.word_problem = bool(word_problem)
    self.curriculum = curriculum
    self.examples_per_step = int(examples_per_step)
    self.group_schedule = group_schedule
    self.value_schedule = value_schedule

  def __len__(self) -> int:
    return self.num_examples

  def max_actions_at(self, index: int) -> int:
    """The upper end of the length range for example `index`."""
    if self.curriculum is None:
      return self.max_actions
    cap = int(self.curriculum(index // self.examples_per_step))
    return min(self.max_actions, max(self.min_actions, cap))

  def num_actions_of(self, index: int) -> int:
    """N of example `index` (without generating it)."""
    self._check_index(index)
    rng = np.random.default_rng((self.base_seed, int(index), 0))
    return sample_num_actions(rng, self.min_actions, self.max_actions_at(int(index)))

  def group_at(self, index: int) -> str:
    """The group example `index` draws its actions from."""
    if self.group_schedule is None:
      return self.group
    names = self.group_schedule(int(index) // self.examples_per_step).split("+")
    if len(names) == 1:
      return names[0]
    rng = np.random.default_rng((self.base_seed, int(index), 2))
    return names[int(rng.integers(0, len(names)))]

  def value_len_at(self, index: int) -> int:
    """The value length of example `index`."""
    if self.value_schedule is None:
      return self.value_len
    return int(self.value_schedule(int(index) // self.examples_per_step))

  def __getitem__(self, index: int) -> dict[str, np.ndarray]:
    n = self.num_actions_of(index)
    seed = (self.base_seed, int(index), 1)
    group = self.group_at(index)
    if self.word_problem:
      return generate_word_problem(seed, n, group=group)
    dict_size = self.dict_size
    if dict_size is not None and group != self.group:
      dict_size = min(dict_size, len(_group_index_array(group)))
    return generate_example(seed, n, value_len=self.value_len_at(index), dict_size=dict_size,
                            retrieval=self.retrieval, group=group,
                            full_dictionary=self.full_dictionary)

  def _check_index(self, index: int) -> None:
    if not isinstance(index, (int, np.integer)) or isinstance(index, bool):
      raise TypeError(f"index must be an integer, got {type(index).__name__}")
    if not 0 <= index < self.num_examples:
      raise IndexError(f"index={index} is out of range: allowed 0..{self.num_examples - 1}")

  def __repr__(self) -> str:
    return (f"S5Source(num_examples={self.num_examples}, min_actions={self.min_actions}, "
            f"max_actions={self.max_actions}, base_seed={self.base_seed}, "
            f"value_len={self.value_len}, dict_size={self.dict_size}, "
            f"retrieval={self.retrieval}, group={self.group!r}, "
            f"full_dictionary={self.full_dictionary}, word_problem={self.word_problem}, "
            f"curriculum={self.curriculum!r}, examples_per_step={self.examples_per_step}, "
            f"group_schedule={self.group_schedule!r}, "
            f"value_schedule={self.value_schedule!r})")


def pad_batch(examples: Sequence[Mapping[str, Any]], seq_len: int,
              pad_id: int = PAD_ID) -> dict[str, np.ndarray]:
  """Right-pad examples into int32 [B, seq_len] arrays; never truncates.

  input_ids pad with `pad_id`, target_ids with IGNORE_ID (-100), control_flow
  with 0 (cf 0 = padding). An example longer than seq_len is an error.
  """
  if len(examples) == 0:
    raise ValueError("examples is empty: allowed a non-empty sequence of examples")
  _check_positive("seq_len", seq_len)
  fill = dict(input_ids=pad_id, target_ids=IGNORE_ID, control_flow=0)
  out = {k: np.full((len(examples), seq_len), v, dtype=np.int32) for k, v in fill.items()}
  for b, ex in enumerate(examples):
    lengths = {k: len(ex[k]) for k in fill}
    if len(set(lengths.values())) != 1:
      raise ValueError(f"example {b} has arrays of different lengths: {lengths}")
    length = lengths["input_ids"]
    if length > seq_len:
      raise ValueError(f"example {b} has length {length} > seq_len={seq_len}: allowed "
                       f"seq_len >= the longest example (never truncated)")
    for k in fill:
      out[k][b, :length] = np.asarray(ex[k])
  return out
