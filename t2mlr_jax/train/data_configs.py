"""Each task's `data` fields: a frozen dataclass per task (defaults, and the checks a field
needs alone in `__post_init__`), as a schedule declares its options. The `data` group of
the experiment config holds every task's fields (`config.base_config`); a task's typed
config (`config.data_config(config)`) takes its own and ignores the others. Checks that
need the prepared dataset or the model stay the task's (train/tasks.py)."""

from __future__ import annotations

import dataclasses
import re
from typing import Optional

from t2mlr_jax.config import invalid
from t2mlr_jax.data import pathfinding, prosqa, s5_curricula, s5_group

SFT_FORMATS = ("auto", "gsm8k_aug", "prompt_response")   # data.sft.FORMATS
TOO_LONG = ("error", "drop")
LM_DOCUMENTS = ("separate", "stream")                      # data.lm.DOCUMENTS


def _fail(field, value, allowed):
  invalid(field, value, allowed, prefix="config field ")


def _check_ints(config, minimum: int, *names) -> None:
  """Each named field an integer >= minimum."""
  for name in names:
    value = getattr(config, name)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
      _fail(f"data.{name}", value, f"an integer >= {minimum}")


def _int_list(name: str, value, example: str) -> list[int]:
  """The sorted distinct integers of a comma-separated field (e.g. eval lengths)."""
  try:
    return sorted({int(x) for x in str(value).split(",") if x.strip()})
  except ValueError:
    _fail(f"data.{name}", value, f"comma-separated integers, e.g. '{example}'")


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """The fields every task reads: the task and the input pipeline's."""
  task: str = "s5_retrieval"        # s5_retrieval, s5_word_problem, variable_assignment, sft, lm
  eval_batch_size: int = 64
  shuffle: bool = False
  num_threads: int = 1              # Grain worker threads
  prefetch: int = 4

  def __post_init__(self):
    if DATA_CONFIGS.get(self.task) is not type(self):
      tasks = [n for n, c in DATA_CONFIGS.items() if c is type(self)] or sorted(DATA_CONFIGS)
      _fail("data.task", self.task, f"one of {tasks}")
    _check_ints(self, 1, "eval_batch_size")
    _check_ints(self, 0, "num_threads", "prefetch")


@dataclasses.dataclass(frozen=True)
class S5WordProblemData(DataConfig):
  """The S5 word problem's fields (actions drawn per example, evaluated lengths, curricula)."""
  task: str = "s5_word_problem"
  group: str = "S5"                 # the permutation group
  min_actions: int = 1              # actions per training example, drawn uniformly
  max_actions: int = 32
  eval_min_actions: int = 1         # evaluated lengths
  eval_max_actions: int = 48
  eval_lengths: Optional[str] = None              # e.g. "8,16,32" instead
  eval_examples_per_length: int = 32
  curriculum_start: Optional[int] = None          # max_actions at step 0
  curriculum_steps: int = 0         # steps to grow to max_actions
  curriculum_hold_steps: int = 0
  group_curriculum: str = ""        # e.g. "Z2:2000" or "Z2+S3:2000" (group schedule)
  value_curriculum: str = ""        # S5-Retrieval: e.g. "1:3000" (value-length schedule)

  def __post_init__(self):
    super().__post_init__()
    if self.group not in s5_group.GROUPS:
      _fail("data.group", self.group, f"one of {s5_group.GROUPS}")
    if not 1 <= self.min_actions <= self.max_actions:
      _fail("data.max_actions", self.max_actions, f">= data.min_actions={self.min_actions} >= 1")
    self.lengths()
    self._check_curricula()

  def lengths(self) -> list[int]:
    """The evaluated numbers of actions: eval_lengths, else eval_min..eval_max_actions."""
    if self.eval_lengths:
      lengths = _int_list("eval_lengths", self.eval_lengths, "8,16,32")
      if not lengths or lengths[0] < 1:
        _fail("data.eval_lengths", self.eval_lengths, "positive integers")
      return lengths
    if not 1 <= self.eval_min_actions <= self.eval_max_actions:
      _fail("data.eval_max_actions", self.eval_max_actions,
            f">= data.eval_min_actions={self.eval_min_actions} >= 1")
    return list(range(self.eval_min_actions, self.eval_max_actions + 1))

  def _check_curricula(self) -> None:
    start = self.curriculum_start
    if start is not None:
      if not 1 <= start <= self.max_actions:
        _fail("data.curriculum_start", start, f"1..data.max_actions={self.max_actions}")
      for name in ("curriculum_steps", "curriculum_hold_steps"):
        if getattr(self, name) < 0:
          _fail(f"data.{name}", getattr(self, name), "an int >= 0")
    if self.group_curriculum:
      try:
        s5_curricula.parse_group_curriculum(self.group_curriculum, self.group)
      except ValueError as e:
        _fail("data.group_curriculum", self.group_curriculum, f"stages 'GROUP:STEP,...' ({e})")
    if self.value_curriculum:
      self._check_value_curriculum()

  def _check_value_curriculum(self) -> None:
    _fail("data.value_curriculum", self.value_curriculum,
          f"'' for data.task={self.task} (its examples have no values)")


@dataclasses.dataclass(frozen=True)
class S5RetrievalData(S5WordProblemData):
  """S5-Retrieval: the word problem's fields and the dictionary's values."""
  task: str = "s5_retrieval"
  value_len: int = 4                # characters per dictionary value
  dict_size: Optional[int] = None   # dictionary pairs
  retrieval: bool = True            # value slots target the retrieved value

  def _check_value_curriculum(self) -> None:
    try:
      s5_curricula.parse_value_curriculum(self.value_curriculum, self.value_len)
    except ValueError as e:
      _fail("data.value_curriculum", self.value_curriculum, f"stages 'V:STEP,...' ({e})")


@dataclasses.dataclass(frozen=True)
class VariableAssignmentData(DataConfig):
  """Variable assignment (byte-level): the alias chain's depth."""
  task: str = "variable_assignment"
  va_depth: int = 2                 # chain depth
  eval_examples_per_length: int = 32

  def __post_init__(self):
    super().__post_init__()
    _check_ints(self, 1, "va_depth", "eval_examples_per_length")


@dataclasses.dataclass(frozen=True)
class PathfindingData(DataConfig):
  """Pathfinding (word-level, generated): the graph knobs of data/pathfinding.py (pf_*, the
  release's defaults), the lengths evaluated and the token limit of training examples."""
  task: str = "pathfinding"
  pf_path_min: int = 10             # backbone edges, drawn uniformly
  pf_path_max: int = 18
  pf_lanes: int = 6                 # parallel lanes, each 1..3 nodes longer
  pf_extra_min: int = 1
  pf_extra_max: int = 3
  pf_dead_end_prob: float = 0.2
  pf_dead_end_depth: int = 2
  pf_wait: bool = False             # "Wait " before the path
  pf_recurrent_prompt: bool = True  # the release trains Pathfinding all-recurrent
  pf_max_tokens: Optional[int] = None   # redraw longer training examples (None: never)
  pf_eval_lengths: str = ""         # backbone lengths evaluated, e.g. "4,6,8" ("": the
  eval_examples_per_length: int = 32    # training range pf_path_min..pf_path_max)

  def __post_init__(self):
    super().__post_init__()
    _check_ints(self, 1, "eval_examples_per_length")
    if self.pf_max_tokens is not None:
      _check_ints(self, 16, "pf_max_tokens")
    for length in [None] + self.eval_lengths():
      try:
        pathfinding.max_nodes(**self.knobs(length))
      except ValueError as e:     # the generator's message starts with the knob's name
        if length is not None:
          _fail("data.pf_eval_lengths", self.pf_eval_lengths,
                f"backbone lengths these knobs can draw ({e})")
        allowed = re.sub(r"(?<![\w.])(" + "|".join(pathfinding.DEFAULTS) + r")\b",
                         r"data.pf_\1", str(e).split("allowed ", 1)[-1])
        _fail(f"data.pf_{str(e).split('=')[0]}", getattr(self, f"pf_{str(e).split('=')[0]}"),
              allowed)

  def knobs(self, length: Optional[int] = None) -> dict:
    """The generator's knobs; with `length`, every backbone exactly that long."""
    lo, hi = (self.pf_path_min, self.pf_path_max) if length is None else (length, length)
    return dict(path_min=lo, path_max=hi, lanes=self.pf_lanes, extra_min=self.pf_extra_min,
                extra_max=self.pf_extra_max, dead_end_prob=float(self.pf_dead_end_prob),
                dead_end_depth=self.pf_dead_end_depth, wait=bool(self.pf_wait))

  def eval_lengths(self) -> list[int]:
    """The backbone lengths evaluated (pf_eval_lengths, else the training range)."""
    if not self.pf_eval_lengths:
      return list(range(self.pf_path_min, self.pf_path_max + 1))
    lengths = _int_list("pf_eval_lengths", self.pf_eval_lengths, "4,6")
    if not lengths:
      _fail("data.pf_eval_lengths", self.pf_eval_lengths, "at least one length")
    return lengths

  def pool_size(self) -> int:
    """Node names the vocabulary needs: enough for the largest graph trained or evaluated."""
    return max(pathfinding.max_nodes(**self.knobs(n))
               for n in [None] + self.eval_lengths())


@dataclasses.dataclass(frozen=True)
class ProsQAData(DataConfig):
  """ProsQA (word-level, generated): the graph knobs of data/prosqa.py (prosqa_*), the
  graph sizes evaluated, the token limit of training examples, generation scoring."""
  task: str = "prosqa"
  prosqa_concepts: int = 20         # concepts per graph (the published mean)
  prosqa_entities: int = 2
  prosqa_depth_min: int = 3         # hops from the entity to the answer, drawn uniformly
  prosqa_depth_max: int = 6
  prosqa_extra_parent_p: float = 0.44
  prosqa_recurrent_prompt: bool = False   # the release trains ProsQA with a plain prompt
  prosqa_max_tokens: Optional[int] = None   # redraw longer training examples (None: never)
  prosqa_eval_concepts: str = ""    # graph sizes evaluated, e.g. "10,14" ("": the trained)
  prosqa_generate: bool = True      # exact-mode evaluations also decode and score answers
  eval_examples_per_length: int = 32

  def __post_init__(self):
    super().__post_init__()
    _check_ints(self, 1, "eval_examples_per_length")
    if self.prosqa_max_tokens is not None:
      _check_ints(self, 16, "prosqa_max_tokens")
    for size in [None] + self.eval_concepts():
      try:
        prosqa.generate_example(0, **self.knobs(size))
      except ValueError as e:     # the generator's message starts with the knob's name
        knob = str(e).split("=")[0]
        field = "prosqa_eval_concepts" if size else PROSQA_FIELDS.get(knob, f"prosqa_{knob}")
        _fail(f"data.{field}", getattr(self, field, None), str(e).split("allowed ", 1)[-1])

  def knobs(self, concepts: Optional[int] = None) -> dict:
    """The generator's knobs; with `concepts`, graphs of that many concepts."""
    return dict(num_concepts=concepts or self.prosqa_concepts,
                num_entities=self.prosqa_entities, depth_min=self.prosqa_depth_min,
                depth_max=self.prosqa_depth_max,
                extra_parent_p=float(self.prosqa_extra_parent_p))

  def eval_concepts(self) -> list[int]:
    """The graph sizes evaluated (prosqa_eval_concepts, else the trained one)."""
    if not self.prosqa_eval_concepts:
      return [self.prosqa_concepts]
    sizes = _int_list("prosqa_eval_concepts", self.prosqa_eval_concepts, "10,14")
    if not sizes:
      _fail("data.prosqa_eval_concepts", self.prosqa_eval_concepts, "at least one size")
    return sizes


# the generator's knob -> its data field
PROSQA_FIELDS = {"num_concepts": "prosqa_concepts", "num_entities": "prosqa_entities"}


@dataclasses.dataclass(frozen=True)
class SFTData(DataConfig):
  """Supervised fine-tuning on JSONL or TFDS records with a Hugging Face tokenizer."""
  task: str = "sft"
  path: Optional[str] = None        # sft: JSONL or tfds:NAME:SPLIT; lm: prepared dataset
  eval_path: Optional[str] = None
  tfds_data_dir: Optional[str] = None
  format: str = "auto"              # "auto", "prompt_response" or "gsm8k_aug"
  tokenizer: Optional[str] = None   # directory with tokenizer.json
  chat: bool = False                # wrap in the tokenizer's chat template
  add_bos: bool = False
  recurrent_prompt: bool = False    # prompt tokens recurrent too (the release's
  #                                   CONTROL_FLOW_ALL_RECURRENT: Pathfinding, HotpotQA)
  packed: bool = True               # pack examples into rows (segment ids)
  too_long: str = "error"           # "error" or "drop" (never truncated)
  eval_limit: int = 256             # held-out examples scored

  def __post_init__(self):
    super().__post_init__()
    if self.format not in SFT_FORMATS:
      _fail("data.format", self.format, f"one of {SFT_FORMATS}")
    if self.too_long not in TOO_LONG:
      _fail("data.too_long", self.too_long, f"one of {TOO_LONG}")
    _check_ints(self, 1, "eval_limit")


@dataclasses.dataclass(frozen=True)
class LMData(DataConfig):
  """Language modelling on a prepared dataset (python -m t2mlr_jax.data.prepare)."""
  task: str = "lm"
  path: Optional[str] = None
  mask_documents: bool = True       # attention does not cross documents
  documents: str = "separate"       # "separate": positions and the memory restart at each
  #                                   document, its first token not predicted; "stream":
  #                                   the block as one stream (nanochat, the LRT release)
  train_split: str = "train"
  eval_split: str = "validation"
  eval_blocks: Optional[int] = None   # held-out blocks scored (None: every block)

  def __post_init__(self):
    super().__post_init__()
    if self.documents not in LM_DOCUMENTS:
      _fail("data.documents", self.documents, f"one of {LM_DOCUMENTS}")
    if self.documents == "stream" and self.mask_documents:
      _fail("data.documents", self.documents, "'separate' with data.mask_documents=True "
            "('stream' attends across documents: set data.mask_documents=False)")
    n = self.eval_blocks
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
      _fail("data.eval_blocks", n, "None (every block) or an integer >= 1")


# each task's data config (train/tasks.py's Task.data); the first is the default task
DATA_CONFIGS = {
    "s5_retrieval": S5RetrievalData,
    "s5_word_problem": S5WordProblemData,
    "variable_assignment": VariableAssignmentData,
    "pathfinding": PathfindingData,
    "prosqa": ProsQAData,
    "sft": SFTData,
    "lm": LMData,
}
