"""Tasks: what data a config trains on and how it is evaluated.

A task turns the `data` config group into a training source (random access,
deterministic per index), fixed evaluation batches, and a metrics accumulator.
"""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple

from t2mlr_jax.data import pipeline, s5, variable_assignment
from t2mlr_jax.eval.s5 import S5Metrics
from t2mlr_jax.eval.sequence import SequenceMetrics
EVAL_SEED_OFFSET = 1_000_003      # eval examples never share seeds with training ones


class Task(NamedTuple):
  name: str
  train_source: Callable       # (config, num_examples) -> random-access source
  eval_batches: Callable       # (config) -> list of padded batch dicts
  metrics: Callable            # () -> accumulator with update(pred, batch) / result()
  max_train_len: Callable      # (config) -> the longest training example


def _fail(field, value, allowed):
  raise ValueError(f"config field {field}={value!r} is invalid: allowed {allowed}")


def eval_lengths(d) -> list[int]:
  if d.eval_lengths:
    try:
      lengths = sorted({int(x) for x in str(d.eval_lengths).split(",") if x.strip()})
    except ValueError:
      _fail("data.eval_lengths", d.eval_lengths, "comma-separated integers, e.g. '8,16,32'")
    if not lengths or lengths[0] < 1:
      _fail("data.eval_lengths", d.eval_lengths, "positive integers")
    return lengths
  if not 1 <= d.eval_min_actions <= d.eval_max_actions:
    _fail("data.eval_max_actions", d.eval_max_actions,
          f">= data.eval_min_actions={d.eval_min_actions} >= 1")
  return list(range(d.eval_min_actions, d.eval_max_actions + 1))


def _s5_kwargs(d, word_problem):
  if d.group not in s5.GROUPS:
    _fail("data.group", d.group, f"one of {s5.GROUPS}")
  if word_problem:
    return dict(group=d.group)
  return dict(group=d.group, value_len=d.value_len, dict_size=d.dict_size,
              retrieval=d.retrieval)


def _s5_length(d, n, word_problem):
  if word_problem:
    return n
  return s5.sequence_length(n, value_len=d.value_len, dict_size=d.dict_size, group=d.group)


def _s5_train_source(config, num_examples, word_problem):
  d, t = config.data, config.train
  curriculum = None
  if d.curriculum_start is not None:
    curriculum = functools.partial(s5.length_curriculum, start=d.curriculum_start,
                                   end=d.max_actions, warmup_steps=d.curriculum_steps)
  return s5.S5Source(num_examples, min_actions=d.min_actions, max_actions=d.max_actions,
                     base_seed=t.seed, curriculum=curriculum, examples_per_step=t.batch_size,
                     word_problem=word_problem, **_s5_kwargs(d, word_problem))


def _s5_eval_batches(config, word_problem):
  d = config.data
  kwargs = _s5_kwargs(d, word_problem)
  examples = []
  for n in eval_lengths(d):
    for i in range(d.eval_examples_per_length):
      seed = (config.train.seed + EVAL_SEED_OFFSET, n, i)
      examples.append(s5.generate_word_problem(seed, n, **kwargs) if word_problem
                      else s5.generate_example(seed, n, **kwargs))
  seq_len = max(len(ex["input_ids"]) for ex in examples)
  if seq_len > config.model.max_seq_len:
    _fail("data.eval_max_actions", max(eval_lengths(d)),
          f"lengths whose sequences fit model.max_seq_len={config.model.max_seq_len} "
          f"(the longest needs {seq_len})")
  return pipeline.stack_batches(examples, seq_len, d.eval_batch_size)


def _make_s5(name, word_problem):
  return Task(
      name=name,
      train_source=functools.partial(_s5_train_source, word_problem=word_problem),
      eval_batches=functools.partial(_s5_eval_batches, word_problem=word_problem),
      metrics=S5Metrics,
      max_train_len=lambda config: _s5_length(config.data, config.data.max_actions,
                                              word_problem))


def _va_source(config, num_examples, seed_offset=0):
  return variable_assignment.VariableAssignmentSource(
      num_examples, base_seed=config.train.seed + seed_offset, depth=config.data.va_depth)


def _va_eval_batches(config):
  d = config.data
  src = _va_source(config, d.eval_examples_per_length, EVAL_SEED_OFFSET)
  examples = [src[i] for i in range(len(src))]
  seq_len = max(len(ex["input_ids"]) for ex in examples)
  return pipeline.stack_batches(examples, seq_len, d.eval_batch_size)


def _va_max_len(config):
  src = _va_source(config, 64)
  return max(len(src[i]["input_ids"]) for i in range(len(src)))   # every example: same length


_REGISTRY = {
    "s5_retrieval": _make_s5("s5_retrieval", False),
    "s5_word_problem": _make_s5("s5_word_problem", True),
    # byte-level, from scratch; answers scored by exact match (greedy, exact recurrence)
    "variable_assignment": Task("variable_assignment", _va_source, _va_eval_batches,
                                SequenceMetrics, _va_max_len),
}
TASKS = tuple(_REGISTRY)


def get_task(config) -> Task:
  name = config.data.task
  if name not in _REGISTRY:
    _fail("data.task", name, f"one of {sorted(_REGISTRY)}")
  return _REGISTRY[name]


def validate_data(config, task: Task) -> None:
  """Data checks that need the task: every training example fits train.seq_len."""
  d = config.data
  if task.name.startswith("s5"):
    if not 1 <= d.min_actions <= d.max_actions:
      _fail("data.max_actions", d.max_actions, f">= data.min_actions={d.min_actions} >= 1")
    eval_lengths(d)
  longest = task.max_train_len(config)
  if longest > config.train.seq_len:
    _fail("train.seq_len", config.train.seq_len,
          f">= {longest}, the longest training example of data.task={d.task}")
