"""The S5 tasks' Grain source: S5-Retrieval (or word-problem) examples by index, each a
pure function of (base_seed, index), with the curricula of s5_curricula.py as functions
of the step; and the padding of examples into a batch.

The tasks themselves: s5_examples.py (one example, its layout, control flow and metric
masks) and s5_group.py (the official 188-token vocabulary, the group algebra).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

from t2mlr_jax.data.s5_examples import generate_example, generate_word_problem
from t2mlr_jax.data.s5_group import PAD_ID, _check_positive, group_elements
from t2mlr_jax.losses import IGNORE as IGNORE_ID


def sample_num_actions(rng: np.random.Generator, min_actions: int, max_actions: int) -> int:
  """A length drawn uniformly from min_actions..max_actions (inclusive)."""
  _check_positive("min_actions", min_actions)
  _check_positive("max_actions", max_actions)
  if max_actions < min_actions:
    raise ValueError(f"max_actions={max_actions} is invalid: allowed >= "
                     f"min_actions={min_actions}")
  return int(rng.integers(min_actions, max_actions + 1))


class S5Source:
  """Grain `RandomAccessDataSource` of S5-Retrieval (or word-problem) examples.

  Example `index` is a pure function of (base_seed, index): its length N is
  uniform over min_actions..max_actions and its content comes from an
  independent stream, so any worker, order or restart sees the same data.

  `curriculum` (optional) maps a training step to the current maximum length
  (e.g. functools.partial(s5_curricula.length_curriculum, ...)); index i belongs to step
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
    order = len(group_elements(group))
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
      dict_size = min(dict_size, len(group_elements(group)))
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
