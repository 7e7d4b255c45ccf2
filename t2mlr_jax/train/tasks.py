"""Tasks: what data a config trains on and how it is evaluated.

A task turns the `data` config group into a training source (random access,
deterministic per index), fixed evaluation batches, and a metrics accumulator. Each task
declares its data fields as a frozen dataclass (`Task.data`, train/data_configs.py) that
checks them; the checks here need the prepared dataset or the model.
"""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple, Optional

from t2mlr_jax import checkpoint
from t2mlr_jax.checkpoint import Checkpointer
from t2mlr_jax.config import invalid
from t2mlr_jax.data import (
  byte_tokenizer,
  pathfinding,
  pipeline,
  prosqa,
  s5,
  s5_curricula,
  s5_examples,
  s5_group,
  sft,
  variable_assignment,
)
from t2mlr_jax.data.lm import BlockSource, read_manifest, spread, token_bytes
from t2mlr_jax.data.tokenizer import load_tokenizer
from t2mlr_jax.eval import prosqa as prosqa_eval
from t2mlr_jax.eval.bpb import evaluate_bpb
from t2mlr_jax.eval.pathfinding import PathfindingMetrics
from t2mlr_jax.eval.runner import evaluate
from t2mlr_jax.eval.s5 import S5Metrics
from t2mlr_jax.eval.sequence import SequenceMetrics
from t2mlr_jax.registry import FAMILIES
from t2mlr_jax.train.config import data_config
from t2mlr_jax.train.data_configs import (
  LMData,
  PathfindingData,
  ProsQAData,
  S5RetrievalData,
  S5WordProblemData,
  SFTData,
  VariableAssignmentData,
)

EVAL_SEED_OFFSET = 1_000_003      # eval examples never share seeds with training ones


class Task(NamedTuple):
  name: str
  data: type                   # its data fields' frozen dataclass (data_configs.DATA_CONFIGS)
  train_source: Callable       # (config, num_examples) -> random-access source
  eval_batches: Callable       # (config) -> list of padded batch dicts
  metrics: Callable            # () -> accumulator with update(pred, batch) / result()
  max_train_len: Callable      # (config) -> the longest training example
  # (config, params, cfg, batches, mode) -> results; None: eval.runner.evaluate + metrics
  evaluate: Optional[Callable] = None
  train_views: bool = False    # evaluations add the training mode's view
  # (config) -> the tokenizer of the task's own vocabulary (its ids are no tokenizer.json's:
  # chat and the loaders read a run's tokens with it); None: data.tokenizer / init_from
  tokenizer: Optional[Callable] = None
  # (config) -> None: checks of the data against the config that need the dataset or the
  # model (run before the model's own, so a mismatch is named as the data's)
  check: Optional[Callable] = None


def _fail(field, value, allowed):
  invalid(field, value, allowed, prefix="config field ")


def _s5_kwargs(d, word_problem):
  if word_problem:
    return dict(group=d.group)
  return dict(group=d.group, value_len=d.value_len, dict_size=d.dict_size,
              retrieval=d.retrieval)


def _s5_max_len(config, word_problem):
  d = data_config(config)
  return _s5_length(d, d.max_actions, word_problem)


def _s5_length(d, n, word_problem):
  if word_problem:
    return n
  return s5_examples.sequence_length(n, value_len=d.value_len, dict_size=d.dict_size,
                                     group=d.group)


def _s5_train_source(config, num_examples, word_problem):
  d, t = data_config(config), config.train
  curriculum = None
  if d.curriculum_start is not None:
    curriculum = functools.partial(s5_curricula.length_curriculum, start=d.curriculum_start,
                                   end=d.max_actions, warmup_steps=d.curriculum_steps,
                                   hold_steps=d.curriculum_hold_steps)
  group_schedule = None
  if d.group_curriculum:
    group_schedule = functools.partial(
        s5_curricula.group_curriculum,
        stages=s5_curricula.parse_group_curriculum(d.group_curriculum, d.group), group=d.group)
  value_schedule = None
  if d.value_curriculum:
    value_schedule = functools.partial(
        s5_curricula.value_curriculum,
        stages=s5_curricula.parse_value_curriculum(d.value_curriculum, d.value_len),
        value_len=d.value_len)
  return s5.S5Source(num_examples, min_actions=d.min_actions, max_actions=d.max_actions,
                     base_seed=t.seed, curriculum=curriculum, examples_per_step=t.batch_size,
                     group_schedule=group_schedule, value_schedule=value_schedule,
                     word_problem=word_problem, **_s5_kwargs(d, word_problem))


def _s5_eval_batches(config, word_problem):
  d = data_config(config)
  kwargs = _s5_kwargs(d, word_problem)
  examples = []
  for n in d.lengths():
    for i in range(d.eval_examples_per_length):
      seed = (config.train.seed + EVAL_SEED_OFFSET, n, i)
      examples.append(s5_examples.generate_word_problem(seed, n, **kwargs) if word_problem
                      else s5_examples.generate_example(seed, n, **kwargs))
  seq_len = max(len(ex["input_ids"]) for ex in examples)
  if seq_len > config.model.max_seq_len:
    _fail("data.eval_max_actions", max(d.lengths()),
          f"lengths whose sequences fit model.max_seq_len={config.model.max_seq_len} "
          f"(the longest needs {seq_len})")
  return pipeline.stack_batches(examples, seq_len, d.eval_batch_size)


def _s5_tokenizer(config):
  """The official 188-token S5 vocabulary (s5_group.py), whatever the config."""
  return s5_group.TOKENIZER


def _make_s5(name, word_problem):
  return Task(
      name=name,
      data=S5WordProblemData if word_problem else S5RetrievalData,
      train_source=functools.partial(_s5_train_source, word_problem=word_problem),
      eval_batches=functools.partial(_s5_eval_batches, word_problem=word_problem),
      metrics=S5Metrics,
      max_train_len=functools.partial(_s5_max_len, word_problem=word_problem),
      tokenizer=_s5_tokenizer)


def _va_source(config, num_examples, seed_offset=0):
  return variable_assignment.VariableAssignmentSource(
      num_examples, base_seed=config.train.seed + seed_offset, depth=data_config(config).va_depth)


def _va_eval_batches(config):
  d = data_config(config)
  src = _va_source(config, d.eval_examples_per_length, EVAL_SEED_OFFSET)
  examples = [src[i] for i in range(len(src))]
  seq_len = max(len(ex["input_ids"]) for ex in examples)
  return pipeline.stack_batches(examples, seq_len, d.eval_batch_size)


def _va_max_len(config):
  src = _va_source(config, 64)
  return max(len(src[i]["input_ids"]) for i in range(len(src)))   # every example: same length


def _pf_source(config, num_examples, seed_offset=0, length=None):
  """Training examples (length None: the trained range, pf_max_tokens applied) or one
  backbone length's evaluation examples (never redrawn for length)."""
  d = data_config(config)
  return pathfinding.PathfindingSource(
      num_examples, base_seed=config.train.seed + seed_offset,
      recurrent_prompt=d.pf_recurrent_prompt, limit=None if length else d.pf_max_tokens,
      pool_size=d.pool_size(), **d.knobs(length))


def _pf_eval_batches(config):
  d = data_config(config)
  examples = []
  for n in d.eval_lengths():
    src = _pf_source(config, d.eval_examples_per_length, EVAL_SEED_OFFSET + n, length=n)
    examples += [src[i] for i in range(len(src))]
  return _sized_batches(config, examples, "pf_eval_lengths", "lengths")


def _sized_batches(config, examples, field, what):
  """Fixed eval batches of examples of several sizes, padded to the longest, which must fit
  model.max_seq_len (else the data field choosing the sizes is named)."""
  seq_len = max(len(ex["input_ids"]) for ex in examples)
  if seq_len > config.model.max_seq_len:
    _fail(f"data.{field}", config.data[field], f"{what} whose examples fit "
          f"model.max_seq_len={config.model.max_seq_len} (the longest needs {seq_len})")
  return pipeline.stack_batches(examples, seq_len, data_config(config).eval_batch_size)


def _pf_max_len(config):
  d = data_config(config)
  return d.pf_max_tokens or pathfinding.max_tokens(**d.knobs())


def _pf_tokenizer(config):
  """The word vocabulary: the fixed words and enough pool names for every graph."""
  return pathfinding.tokenizer(data_config(config).pool_size())


def _pf_metrics():
  tok = pathfinding.TOKENIZER        # the fixed words' ids do not depend on the pool size
  return PathfindingMetrics(tok.token_to_id["->"], tok.token_to_id[pathfinding.DIVIDER])


def _prosqa_source(config, num_examples):
  d = data_config(config)
  return prosqa.ProsQASource(num_examples, base_seed=config.train.seed,
                             recurrent_prompt=d.prosqa_recurrent_prompt,
                             limit=d.prosqa_max_tokens, **d.knobs())


def _prosqa_examples(config) -> dict:
  """{graph size: the held-out examples (raw dicts)}, fixed per config seed."""
  d = data_config(config)
  return {n: [prosqa.generate_example((config.train.seed + EVAL_SEED_OFFSET, n, i),
                                      **d.knobs(n))
              for i in range(d.eval_examples_per_length)] for n in d.eval_concepts()}


def _prosqa_batches(config, examples):
  d = data_config(config)
  tokens = [prosqa.tokenize_example(ex, recurrent_prompt=d.prosqa_recurrent_prompt)
            for ex in examples]
  return _sized_batches(config, tokens, "prosqa_eval_concepts", "sizes")


def _prosqa_eval_batches(config):
  return _prosqa_batches(config, sum(_prosqa_examples(config).values(), []))


def _prosqa_max_len(config):
  d = data_config(config)
  if d.prosqa_max_tokens is None:
    _fail("data.prosqa_max_tokens", None, "a token limit (graphs have no fixed size: "
          "longer training examples are drawn again); e.g. 320 for 20 concepts")
  return d.prosqa_max_tokens


def _prosqa_evaluate(config, params, cfg, batches, mode, mesh=None):
  """Teacher-forced loss and exact match, over all and per graph size (one pass); in exact
  mode also the answers and chains the model writes itself (eval/prosqa.py), per size and
  over all."""
  d = data_config(config)
  metrics = functools.partial(prosqa_eval.SizedMetrics, d.eval_concepts(),
                              d.eval_examples_per_length)
  out = evaluate(params, cfg, batches, metrics, mode=mode, mesh=mesh)
  if not (d.prosqa_generate and mode == "exact"):
    return out
  per_size = {str(n): prosqa_eval.generation_scores(
      params, cfg, prosqa.tokenizer(), examples, batch_size=d.eval_batch_size,
      prompt_cf=2 if d.prosqa_recurrent_prompt else 1)
      for n, examples in _prosqa_examples(config).items()}
  for key in ("answer_acc", "path_valid_acc"):
    out[f"{key}_by_concepts"] = {n: row[key] for n, row in per_size.items()}
    out[key] = sum(row[key] * row["num_examples"] for row in per_size.values()) / sum(
        row["num_examples"] for row in per_size.values())
  return out


def _own_vocabulary_fits(config) -> None:
  """model.vocab_size holds the task's own vocabulary (a from-scratch model's embedding)."""
  task = get_task(config)
  vocab = task.tokenizer(config).vocab_size
  if not config.model.get("init_from") and config.model.vocab_size < vocab:
    _fail("model.vocab_size", config.model.vocab_size, f">= {vocab}, the vocabulary of "
          f"data.task={task.name} with these data fields")


def _tokenizer(config):
  path = data_config(config).tokenizer or config.model.init_from
  if not path:
    _fail("data.tokenizer", path, "a directory with tokenizer.json (or set model.init_from)")
  return load_tokenizer(path)


@functools.lru_cache(maxsize=4)
def _sft_examples(path, tokenizer_dir, seq_len, fmt, chat, add_bos, packed, too_long, limit,
                  tfds_data_dir, prompt_cf):
  return sft.SFTSource(path, load_tokenizer(tokenizer_dir), seq_len=seq_len, fmt=fmt, chat=chat,
                       add_bos=add_bos, packed=packed, too_long=too_long, limit=limit,
                       tfds_data_dir=tfds_data_dir, prompt_cf=prompt_cf)


def _sft_source_for(config, path, packed, limit=None):
  d = data_config(config)
  if not path:
    _fail("data.path", path, "a JSONL file or 'tfds:NAME:SPLIT' of {question, steps, answer} "
          "or {prompt, response} records")
  return _sft_examples(path, d.tokenizer or config.model.init_from, config.train.seq_len,
                       d.format, d.chat, d.add_bos, packed, d.too_long, limit, d.tfds_data_dir,
                       2 if d.recurrent_prompt else 1)


def _sft_train_source(config, num_examples):
  d = data_config(config)
  return sft.repeat(_sft_source_for(config, d.path, d.packed), num_examples)


def _sft_eval_batches(config):
  d = data_config(config)
  src = _sft_source_for(config, d.eval_path or d.path, False, d.eval_limit)
  examples = [src[i] for i in range(len(src))]
  seq_len = max(len(ex["input_ids"]) for ex in examples)
  return pipeline.stack_batches(examples, seq_len, d.eval_batch_size)


def _sft_max_len(config):
  _tokenizer(config)          # fails early, naming the field, if there is none
  d = data_config(config)
  src = _sft_source_for(config, d.path, d.packed)
  return max(len(src[i]["input_ids"]) for i in range(len(src)))


def _lm_source(config, split):
  d = data_config(config)
  if not d.path:
    _fail("data.path", d.path, "a prepared dataset directory (python -m "
          "t2mlr_jax.data.prepare)")
  return BlockSource(d.path, split, mask_documents=d.mask_documents, documents=d.documents)


def _lm_train_source(config, num_examples):
  del num_examples      # the pipeline repeats the blocks in epochs
  return _lm_source(config, data_config(config).train_split)


def _lm_eval_batches(config):
  d = data_config(config)
  examples = spread(_lm_source(config, d.eval_split), d.eval_blocks)
  return pipeline.stack_batches(examples, len(examples[0]["input_ids"]), d.eval_batch_size)


def _lm_evaluate(config, params, cfg, batches, mode, mesh=None):
  return evaluate_bpb(params, cfg, batches, token_bytes(config.data.path), mode=mode,
                      mesh=mesh)


def _lm_block_size(config):
  path = data_config(config).path
  if not path:
    _fail("data.path", path, "a prepared dataset directory")
  try:
    return read_manifest(path)["block_size"]
  except ValueError as e:
    _fail("data.path", path, f"a prepared dataset directory ({e})")


def _validate_lm(config) -> None:
  _lm_block_size(config)
  d = data_config(config)
  manifest = read_manifest(d.path)
  block, m = manifest["block_size"], config.model
  family = FAMILIES.get(m.arch, "config field model.arch")
  if family.bounded_context and block > m.max_seq_len:
    _fail("model.max_seq_len", m.max_seq_len, f">= the block size {block} of data.path="
          f"{d.path} (prepare the data with a smaller --block_size)")
  if config.train.seq_len != block:
    _fail("train.seq_len", config.train.seq_len, f"{block}, the block size of data.path="
          f"{d.path} (blocks are never cut or padded)")
  vocab = manifest["tokenizer"]["vocab_size"]
  if not m.get("init_from") and m.vocab_size < vocab:
    _fail("model.vocab_size", m.vocab_size, f">= {vocab}, the vocabulary of data.path="
          f"{d.path}'s tokenizer")
  for field, split in (("data.train_split", d.train_split), ("data.eval_split", d.eval_split)):
    if split not in manifest["splits"]:
      _fail(field, split, f"a split of data.path={d.path}: {sorted(manifest['splits'])}")


_REGISTRY = {
    "s5_retrieval": _make_s5("s5_retrieval", False),
    "s5_word_problem": _make_s5("s5_word_problem", True),
    # byte-level, from scratch; answers scored by exact match (greedy, exact recurrence)
    "variable_assignment": Task("variable_assignment", VariableAssignmentData, _va_source,
                                _va_eval_batches, SequenceMetrics, _va_max_len,
                                tokenizer=lambda config: byte_tokenizer.TOKENIZER),
    # word-level, from scratch: the unique shortest path through a generated DAG
    "pathfinding": Task("pathfinding", PathfindingData, _pf_source, _pf_eval_batches,
                        _pf_metrics, _pf_max_len, tokenizer=_pf_tokenizer,
                        check=_own_vocabulary_fits),
    # word-level, from scratch: which of two concepts an entity is, by a multi-hop chain
    "prosqa": Task("prosqa", ProsQAData, _prosqa_source, _prosqa_eval_batches, SequenceMetrics,
                   _prosqa_max_len, evaluate=_prosqa_evaluate,
                   tokenizer=lambda config: prosqa.tokenizer(), check=_own_vocabulary_fits),
    # supervised fine-tuning on JSONL (GSM8K-Aug or {prompt, response}), HF tokenizer
    "sft": Task("sft", SFTData, _sft_train_source, _sft_eval_batches, SequenceMetrics,
                _sft_max_len),
    # language modelling on a prepared dataset (data.prepare); bits per byte in 3 views
    "lm": Task("lm", LMData, _lm_train_source, _lm_eval_batches, None, _lm_block_size,
               evaluate=_lm_evaluate, train_views=True, check=_validate_lm),
}
TASKS = tuple(_REGISTRY)


def get_task(config) -> Task:
  name = config.data.task
  if name not in _REGISTRY:
    _fail("data.task", name, f"one of {sorted(_REGISTRY)}")
  return _REGISTRY[name]


def own_tokenizer(config):
  """The tokenizer of a saved experiment config's task, when the task has a vocabulary of
  its own (S5, variable assignment); None otherwise (or for a task not registered here).
  What `convert.loading` takes as `own` for a training workdir."""
  task = _REGISTRY.get(config.get("data", {}).get("task"))
  if task is None or task.tokenizer is None:
    return None
  return task.tokenizer(config)


def task_tokenizer(config):
  """The tokenizer of the task's text: its own vocabulary's (`own_tokenizer`), else the
  one data.tokenizer or model.init_from names (what RL decodes completions with)."""
  return own_tokenizer(config) or _tokenizer(config)


def run_eval(task: Task, config, params, cfg, batches, mode: str = "exact", mesh=None) -> dict:
  """The task's evaluation of `params` on fixed batches under one forward mode (with the
  trainer's mesh: batches split over its batch axes, as training's are)."""
  if task.evaluate is not None:
    return task.evaluate(config, params, cfg, batches, mode, mesh)
  return evaluate(params, cfg, batches, task.metrics, mode=mode, mesh=mesh)


def evaluate_checkpoint(workdir, step=None, mode="exact") -> dict:
  """The training task's own evaluation of a workdir's checkpoint (latest step by default)
  in `mode`: {step, task, mode, **metrics}, the numbers the trainer logs."""
  ckpt = Checkpointer(workdir, read_only=True)
  step = ckpt.latest_step() if step is None else step
  ckpt.manager.close()
  if step is None:
    raise ValueError(f"no checkpoint found under {workdir}/checkpoints")
  config = checkpoint.load_config(workdir, step)
  cfg, params = checkpoint.load(workdir, step)
  task = get_task(config)
  results = run_eval(task, config, params, cfg, task.eval_batches(config), mode)
  return {"step": step, "task": config.data.task, "mode": mode, **results}


def check_source(config, task: Task) -> None:
  """The task's checks of its data against the config, run before the model's own (so a
  block size larger than model.max_seq_len is named as such)."""
  if task.check is not None:
    task.check(config)


def validate_data(config, task: Task) -> None:
  """Data checks that need the task: its fields (its dataclass's own checks), and every
  training example fits train.seq_len."""
  d = data_config(config)
  longest = task.max_train_len(config)
  if longest > config.train.seq_len:
    _fail("train.seq_len", config.train.seq_len,
          f">= {longest}, the longest training example of data.task={d.task}")
