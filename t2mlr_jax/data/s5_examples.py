"""S5-Retrieval and the S5 word problem: one example from a seed, its length, its control
flow, and the position masks its metrics read.

S5-Retrieval (docs/experiments.md#tasks) tests state tracking and retrieval together: a
shuffled dictionary maps action tokens (permutations of 5 points) to random character
strings, then a stream of actions follows, each with v blank slots. At an
action the model must emit the running permutation product; at the slots it
must copy the dictionary value keyed by that action. Transformers fail at long
lengths, LSTMs fail at retrieval (the T2MLR paper) — hence the task.

Everything here is pure numpy (no jax, no model imports) and deterministic
from a seed; the vocabulary and the group algebra are s5_group.py's.

Example layout (label shift 0: position t is scored against target[t]):

  input   <A_k1> c c c c ... <A_kD> c c c c  |  <A_a1> _ _ _ _ ... <A_aN> _ _ _ _
  target  (copies of the input ..............)   <S_1>  value(a1)  ... <S_N> value(aN)
  cf      1 .................................  1  2 ........................... 2

where `_` is a blank (space), `<S_t>` the running state after action t, and
value(a) the dictionary value of key a (blanks in the no-retrieval variant).
"""

from __future__ import annotations

from typing import Mapping, Optional, Sequence, Union

import numpy as np

from t2mlr_jax.data.s5_group import (
  ACTION_OFFSET,
  NUM_PERMUTATIONS,
  PAD_ID,
  SEP_ID,
  SPACE_ID,
  VALUE_CHAR_IDS,
  _check_positive,
  _group_index_array,
  running_states,
)

# ---------------------------------------------------------------------------
# Generators.

SeedLike = Union[int, Sequence[int], np.random.SeedSequence, np.random.Generator]


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
