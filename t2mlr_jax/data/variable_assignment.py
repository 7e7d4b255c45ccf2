"""Variable Assignment (docs/experiments.md#tasks): resolve a query variable through a
chain of aliases.

A prompt lists shuffled assignment lines — base variables holding digits
(`x=7`) and aliases (`q=x`) — and asks for the value of a query variable; the
answer is the digit reached by following the aliases. Distractor aliases make
the model pick the right chain out of several. Text only: tokenisation (with an
HF tokenizer, prompt cf=1, answer cf=2) happens elsewhere. Pure Python/numpy,
deterministic per seed.

Interpretation of "a chain of depth 2 ending in a base variable": `depth` is
the number of alias assignments from the query to the base variable, so
depth 2 is `query=alias`, `alias=base`, `base=<digit>` (two alias hops, two
chain variables besides the base). Note the public reference generator's
`depth=2` builds one more hop (query=c1, c1=c2, c2=base); pass depth=3 here to
get that shape.

Distractors: each of the `num_distractors` aliases is a fresh name assigned to
a uniformly chosen base variable, chain variable or earlier distractor (in a
random order), so no line forms a cycle and every variable resolves to a
digit; they never change the query's value (nothing in the chain points to a
distractor). Names are distinct single letters drawn without replacement from
a-z.

Prompt (exact): "Variable assignment. Follow the assignments and fill in the
blank.\\n" + lines joined by "\\n" + "\\n<query>=___\\nAnswer: |". The public
reference generator ends it with "Answer: | " (a trailing space);
docs/experiments.md#tasks and this module do not.
"""

from __future__ import annotations

import json
import string
from typing import Sequence, Union

import numpy as np

from t2mlr_jax import paths
from t2mlr_jax.data import byte_tokenizer

PROMPT_HEADER = "Variable assignment. Follow the assignments and fill in the blank.\n"
ANSWER_PREFIX = "Answer: |"
NAMES = string.ascii_lowercase

SeedLike = Union[int, Sequence[int], np.random.SeedSequence, np.random.Generator]


def _check_count(name: str, value: int, minimum: int) -> None:
  if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < minimum:
    raise ValueError(f"{name}={value!r} is invalid: allowed integers >= {minimum}")


def format_prompt(lines: Sequence[str], query: str) -> str:
  """The exact prompt text for these lines and query variable."""
  return PROMPT_HEADER + "\n".join(lines) + f"\n{query}=___\n" + ANSWER_PREFIX


def parse_lines(lines: Sequence[str]) -> dict[str, str]:
  """Map each left-hand variable to its right-hand side (a digit or a variable)."""
  table: dict[str, str] = {}
  for line in lines:
    lhs, sep, rhs = line.partition("=")
    if not sep or not lhs or not rhs or "=" in rhs:
      raise ValueError(f"line {line!r} is invalid: allowed '<var>=<digit>' or '<var>=<var>'")
    if lhs in table:
      raise ValueError(f"variable {lhs!r} is assigned twice")
    table[lhs] = rhs
  return table


def resolve(lines: Sequence[str], var: str) -> str:
  """The digit `var` holds, following alias lines until a digit (as a string).

  Raises ValueError on an unassigned variable or an alias cycle.
  """
  table = parse_lines(lines)
  seen = []
  while True:
    if var not in table:
      raise ValueError(f"variable {var!r} is not assigned (chain: {' -> '.join(seen)})")
    if var in seen:
      raise ValueError(f"alias cycle: {' -> '.join(seen + [var])}")
    seen.append(var)
    rhs = table[var]
    if rhs.isdigit():
      return rhs
    var = rhs


def generate_example(seed: SeedLike, *, num_base: int = 8, depth: int = 2,
                     num_distractors: int = 6) -> dict:
  """One example: dict(prompt=str, answer=str, lines=list[str], query=str).

  Args:
    seed: anything `np.random.default_rng` accepts; the example is a pure
      function of it and the other arguments.
    num_base: base variables, each holding a uniform digit 0-9 (>= 1).
    depth: alias assignments from the query to its base variable (>= 1).
    num_distractors: extra aliases of other variables (>= 0).
  """
  _check_count("num_base", num_base, 1)
  _check_count("depth", depth, 1)
  _check_count("num_distractors", num_distractors, 0)
  total = num_base + depth + num_distractors
  if total > len(NAMES):
    raise ValueError(f"num_base + depth + num_distractors = {total} is invalid: allowed at "
                     f"most {len(NAMES)} (single-letter names without replacement)")
  rng = np.random.default_rng(seed)
  names = [NAMES[i] for i in rng.permutation(len(NAMES))[:total]]
  base = names[:num_base]
  chain = names[num_base:num_base + depth]  # chain[0] is the query
  distractors = names[num_base + depth:]

  digits = rng.integers(0, 10, size=num_base)
  lines = [f"{v}={int(d)}" for v, d in zip(base, digits)]
  sink = base[int(rng.integers(0, num_base))]
  targets = chain[1:] + [sink]
  lines += [f"{a}={b}" for a, b in zip(chain, targets)]
  pool = base + chain
  for d in distractors:
    lines.append(f"{d}={pool[int(rng.integers(0, len(pool)))]}")
    pool.append(d)
  lines = [lines[i] for i in rng.permutation(len(lines))]

  query = chain[0]
  answer = str(int(digits[base.index(sink)]))
  return dict(prompt=format_prompt(lines, query), answer=answer, lines=lines, query=query)


# ---------------------------------------------------------------------------
# Token-level examples (byte tokenizer) and a Grain source, for training from scratch.

def tokenize_example(example: dict, tokenizer=None) -> dict[str, np.ndarray]:
  """<bos> prompt answer <eos> as ids with next-token targets on the answer and EOS only.

  control_flow: prompt 1 (non-recurrent), answer and EOS 2; padding
  positions are added later. target_ids[t] is the id that position t predicts
  (-100 where not supervised): the last prompt position predicts the answer.
  """
  tok = tokenizer or byte_tokenizer.TOKENIZER
  prompt = [tok.bos_id] + tok.encode(example["prompt"])
  answer = tok.encode(example["answer"]) + [tok.eos_id]
  ids = np.asarray(prompt + answer, np.int32)
  cf = np.asarray([1] * len(prompt) + [2] * len(answer), np.int32)
  targets = np.full(len(ids), -100, np.int32)
  targets[len(prompt) - 1:-1] = answer
  return dict(input_ids=ids, target_ids=targets, control_flow=cf)


def control_flow(input_ids, tokenizer=None) -> np.ndarray:
  """The control flow `tokenize_example` gives, rebuilt from token ids [L] or [B, L]: 1
  through the prompt (up to and including the answer prefix ANSWER_PREFIX's tokens, its last
  occurrence in the row), 2 after it; the tokenizer's pad id is 0. Rows without the
  prefix are refused (not a variable-assignment prompt)."""
  tok = tokenizer or byte_tokenizer.TOKENIZER
  marker = np.asarray(tok.encode(ANSWER_PREFIX), np.int64)
  ids = np.asarray(input_ids)
  if ids.ndim not in (1, 2) or not np.issubdtype(ids.dtype, np.integer):
    raise ValueError(f"input_ids must be integer token ids of shape [L] or [B, L], got "
                     f"{ids.dtype} of shape {ids.shape}")
  rows = ids.reshape(-1, ids.shape[-1])
  cf = np.full(rows.shape, 2, np.int32)
  k = len(marker)
  for b, row in enumerate(rows):
    ends = [t + k for t in range(len(row) - k + 1) if np.array_equal(row[t:t + k], marker)]
    if not ends:
      raise ValueError(f"row {b} holds no answer prefix {ANSWER_PREFIX!r}: allowed token ids "
                       "of a variable-assignment prompt (format_prompt)")
    cf[b, :ends[-1]] = 1
  pad = getattr(tok, "pad_id", None)
  if pad is not None:
    cf[rows == pad] = 0
  return cf.reshape(ids.shape)


class VariableAssignmentSource:
  """Random-access source of tokenized examples; example i is a pure function of (seed, i)."""

  def __init__(self, num_examples: int, *, base_seed: int = 0, depth: int = 2,
               num_base: int = 8, num_distractors: int = 6):
    _check_count("num_examples", num_examples, 1)
    self.num_examples = int(num_examples)
    self.base_seed = int(base_seed)
    self.kwargs = dict(depth=depth, num_base=num_base, num_distractors=num_distractors)

  def __len__(self) -> int:
    return self.num_examples

  def __getitem__(self, index: int) -> dict[str, np.ndarray]:
    if not 0 <= int(index) < self.num_examples:
      raise IndexError(f"index={index} is out of range: allowed 0..{self.num_examples - 1}")
    ex = generate_example((self.base_seed, int(index)), **self.kwargs)
    return tokenize_example(ex)

  def __repr__(self) -> str:
    return (f"VariableAssignmentSource(num_examples={self.num_examples}, "
            f"base_seed={self.base_seed}, {self.kwargs})")


# ---------------------------------------------------------------------------
# Chat records (prompt/response text), for fine-tuning pretrained models.

def chain_lines(lines: Sequence[str], var: str) -> list[str]:
  """The assignment lines followed from `var` to its digit, in order (`z=l`, `l=v`, `v=1`)."""
  table = parse_lines(lines)
  out = []
  resolve(lines, var)            # raises on an unassigned variable or a cycle
  while not table[var].isdigit():
    out.append(f"{var}={table[var]}")
    var = table[var]
  return out + [f"{var}={table[var]}"]


def parse_prompt(prompt: str) -> tuple[list[str], str]:
  """(assignment lines, query variable) of a prompt made by `format_prompt`."""
  parts = prompt.split("\n")
  if (not prompt.startswith(PROMPT_HEADER) or len(parts) < 4 or parts[-1] != ANSWER_PREFIX
      or not parts[-2].endswith("=___")):
    raise ValueError(f"prompt {prompt[:60]!r}... is not a Variable Assignment prompt "
                     "(format_prompt's layout)")
  return parts[1:-2], parts[-2][:-len("=___")]


def chain_correct(prompt: str, completion: str) -> bool:
  """Whether a completion opens with the right chain walk (`sft_record`'s response)."""
  lines, query = parse_prompt(prompt)
  gold = chain_lines(lines, query)
  return completion.split("\n")[:len(gold)] == gold


def sft_record(example: dict, *, steps: bool = True) -> dict[str, str]:
  """{prompt, response} for SFT (`data.task="sft"`): the response walks the chain one
  assignment per line, then `### <digit>` (GSM8K-Aug's answer marker); steps=False gives
  `### <digit>` alone. With the prompt non-recurrent (cf 1) and a one-token answer the
  recurrence could not act on the answer; the walk gives it response tokens to act on."""
  walk = chain_lines(example["lines"], example["query"]) if steps else []
  return dict(prompt=example["prompt"], response="\n".join(walk + [f"### {example['answer']}"]),
              answer=example["answer"])


def write_sft_jsonl(path: str, num_examples: int, *, seed: int, steps: bool = True,
                    **kwargs) -> None:
  """`num_examples` records (example i from (seed, i)) as JSONL, written whole or not at all."""
  _check_count("num_examples", num_examples, 1)
  paths.write_text(path, "".join(
      json.dumps(sft_record(generate_example((seed, i), **kwargs), steps=steps)) + "\n"
      for i in range(num_examples)))
