"""ProsQA (Hao et al. 2024, Coconut): decide which of two concepts
an entity belongs to by following "Every X is a Y." facts over a random DAG.

Published format (Coconut's data/prosqa_{train,valid,test}.json; measured on valid+test,
800 records): every graph node is a concept (`wumpus`) or an entity (`Tom`); entities are
the only sources and each edge is one fact, "Every X is a Y." (concept to concept) or
"Tom is a X." (entity to concept), always with the article "a" ("a impus"). `question` is
the shuffled facts joined by spaces, then " Is Tom a A or B?" (no second "a"; A/B order
random): the target is a sink reachable from the root entity, `neg_target` a sink reachable
from another entity but not from the root. `steps` is one shortest path ("Tom is a X.",
"Every X is a Y.", ...), `answer` "Tom is a <target>.". Statistics: 14-28 nodes (mean 22.8)
of which 2-6 entities (mean 2.56, mostly 2), 36 edges, concept in-degree mean 1.78, steps
3-6 (41/44/13/2 %).

Construction (ours; the generator is not published): entities first, then concepts in a
random topological order; each concept draws one parent plus, repeatedly with probability
`extra_parent_p`, one more, uniformly among earlier nodes. The gold chain root -> c1 -> ...
-> c_depth is planted at random positions of that order; c_i's other parents are nodes at
distance >= i-1 from the root (or unreachable), so c_depth lies at shortest distance
exactly `depth`, and no node takes the target as a parent (a sink). neg_target is a uniform
sink the root does not reach; graphs without one (about half at the defaults) are drawn
again from the same stream, keeping the depth. Ours, not published: `depth` uniform in
[depth_min, depth_max] (published skews to 3-4), a fixed `num_concepts` (20, the published
mean less the entities) and `num_entities` (2, the mode). Measured at the defaults (800
seeds), against the published: 33 edges (36), the root reaching 16 of 20 concepts (12 of
20), neg_target a direct child of another entity in 46% (21%). Pure Python/numpy,
deterministic per seed.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Sequence, Union

import numpy as np

from t2mlr_jax import paths
from t2mlr_jax.data.generated import GeneratedSource, prompt_response_example
from t2mlr_jax.data.word_tokenizer import WordTokenizer

# The 17 entity names of the public files.
ENTITIES = ("Alex", "Bob", "Carol", "Davis", "Eva", "Fae", "Gabriel", "Jack", "Max", "Oliver",
            "Polly", "Rex", "Sally", "Sam", "Stella", "Tom", "Wren")
# The 38 concept words of the public files (alphabetical), so `vocabulary` covers them.
_PUBLISHED_CONCEPTS = (
    "bompus", "boompus", "brimpus", "chorpus", "dumpus", "felpus", "fompus", "gerpus", "gorpus",
    "grimpus", "gwompus", "hilpus", "impus", "jelpus", "jompus", "kerpus", "lempus", "lorpus",
    "numpus", "quimpus", "rempus", "rompus", "rorpus", "scrompus", "shumpus", "sterpus",
    "storpus", "terpus", "timpus", "tumpus", "vumpus", "worpus", "wumpus", "yerpus", "yimpus",
    "yumpus", "zhorpus", "zumpus")
_ONSETS = ("bl", "cr", "dr", "fl", "gl", "kr", "pl", "pr", "sk", "sl", "sn", "sp", "thr", "tr",
           "vr", "zw")
_RIMES = ("umpus", "impus", "orpus", "elpus", "erpus")
# Concept words, fixed order: the published 38, then our onset+rime words (onset-major).
CONCEPTS = _PUBLISHED_CONCEPTS + tuple(
    o + r for o in _ONSETS for r in _RIMES if o + r not in _PUBLISHED_CONCEPTS)
# The words of the sentences and the answer marker, besides entity and concept names.
STRUCTURE_WORDS = ("Every", "is", "a", "Is", "or", ".", "?", "###")
MAX_ATTEMPTS = 100

SeedLike = Union[int, Sequence[int], np.random.SeedSequence, np.random.Generator]
_LINE_RE = re.compile(r"^(?:Every )?(\S+) is a (\S+)\.$")
_ANSWER_RE = re.compile(r"^###\s*(\S+) is a (\S+?)\.?$")


def _check_count(name: str, value: int, minimum: int, maximum: int | None = None) -> None:
  if (not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < minimum
      or (maximum is not None and value > maximum)):
    allowed = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
    raise ValueError(f"{name}={value!r} is invalid: allowed integers {allowed}")


def _check_knobs(num_concepts, num_entities, depth_min, depth_max, extra_parent_p,
                 num_words) -> None:
  _check_count("num_entities", num_entities, 2, len(ENTITIES))
  _check_count("depth_min", depth_min, 1)
  _check_count("depth_max", depth_max, depth_min)
  _check_count("num_words", num_words, 2, len(CONCEPTS))
  _check_count("num_concepts", num_concepts, depth_max + 1, num_words)
  if not isinstance(extra_parent_p, (int, float, np.floating)) or not 0 <= extra_parent_p < 1:
    raise ValueError(f"extra_parent_p={extra_parent_p!r} is invalid: allowed a number in [0, 1)")


def _parent_count(rng: np.random.Generator, p: float, available: int) -> int:
  """One, then one more with probability p each time (a geometric in-degree), capped."""
  k = 1
  while k < available and rng.random() < p:
    k += 1
  return k


def _draw_graph(rng, n, k, depth, p):
  """(edges, root, target, neg_target, chain) of one DAG over k entities then n concepts, or
  None when no sink escapes the root (the caller draws again)."""
  root = int(rng.integers(k))
  slots = np.sort(rng.choice(n, depth, replace=False)) + k
  chain = {int(s): i + 1 for i, s in enumerate(slots)}      # node -> its chain position
  target = int(slots[-1])
  inf = n + k
  dist = [0 if e == root else inf for e in range(k)]
  edges: list[list[int]] = []
  prev = root
  for v in range(k, k + n):
    pos = chain.get(v)
    if pos is None:                                         # a free concept
      pool = [u for u in range(v) if u != target]
      fixed = []
    else:                                                   # c_pos: prev plus no shortcut
      pool = [u for u in range(v) if u not in (prev, target) and dist[u] >= pos - 1]
      fixed = [prev]
      prev = v
    m = _parent_count(rng, p, len(pool) + len(fixed)) - len(fixed)
    parents = fixed + [pool[i] for i in rng.choice(len(pool), m, replace=False)]
    dist.append(min(inf, 1 + min(dist[u] for u in parents)))
    edges += [[u, v] for u in sorted(parents)]
  has_child = {u for u, _ in edges}
  negs = [v for v in range(k, k + n) if v not in has_child and dist[v] == inf]
  if not negs:
    return None
  return edges, root, target, int(negs[int(rng.integers(len(negs)))]), sorted(chain)


def generate_example(seed: SeedLike, *, num_concepts: int = 20, num_entities: int = 2,
                     depth_min: int = 3, depth_max: int = 6, extra_parent_p: float = 0.44,
                     num_words: int = len(CONCEPTS)) -> dict:
  """One example in the public record layout, plus `entity` (the root's name).

  Args:
    seed: anything `np.random.default_rng` accepts; the example is a pure function of it
      and the other arguments.
    num_concepts: concepts per graph (> depth_max; published mean about 20).
    num_entities: entities (graph sources) per graph (2..17; published 2-6, mostly 2).
    depth_min, depth_max: the answer's shortest distance from the entity in facts
      (`len(steps)`), uniform in this range (published 3-6).
    extra_parent_p: probability of each further parent of a concept (0.44: mean in-degree
      1.67, published 1.78).
    num_words: concepts are drawn from CONCEPTS[:num_words] (38: the published words).
  """
  _check_knobs(num_concepts, num_entities, depth_min, depth_max, extra_parent_p, num_words)
  rng = np.random.default_rng(seed)
  depth = int(rng.integers(depth_min, depth_max + 1))
  for _ in range(MAX_ATTEMPTS):
    graph = _draw_graph(rng, num_concepts, num_entities, depth, extra_parent_p)
    if graph is not None:
      break
  else:
    raise RuntimeError(f"no graph with a sink unreachable from the entity in {MAX_ATTEMPTS} "
                       f"draws (num_concepts={num_concepts}, extra_parent_p={extra_parent_p}): "
                       "allowed settings leave some concepts off the entity's paths")
  edges, root, target, neg, chain = graph
  names = [ENTITIES[i] for i in rng.choice(len(ENTITIES), num_entities, replace=False)]
  names += [CONCEPTS[i] for i in rng.choice(num_words, num_concepts, replace=False)]
  entity = names[root]
  facts = [_fact(names[u], names[v], u < num_entities) for u, v in edges]
  facts = [facts[i] for i in rng.permutation(len(facts))]
  options = (names[target], names[neg]) if rng.random() < 0.5 else (names[neg], names[target])
  question = " ".join(facts) + f" Is {entity} a {options[0]} or {options[1]}?"
  walk = [root] + chain
  steps = [_fact(names[u], names[v], u == root) for u, v in zip(walk, walk[1:])]
  return dict(question=question, steps=steps, answer=f"{entity} is a {names[target]}.",
              idx_to_symbol=names, edges=edges, root=root, target=target, neg_target=neg,
              entity=entity)


def _fact(lhs: str, rhs: str, lhs_is_entity: bool) -> str:
  return f"{lhs} is a {rhs}." if lhs_is_entity else f"Every {lhs} is a {rhs}."


def response_text(example: dict) -> str:
  """The training response: the steps one per line, then `### <answer>` (the release's and
  GSM8K-Aug's layout, identical to sft.gsm8k_aug_response, which pulls in TFDS and JAX)."""
  return "\n".join(list(example["steps"]) + [f"### {example['answer']}"])


# ---------------------------------------------------------------------------
# Scoring.

def score_response(example: dict, text: str) -> dict[str, bool]:
  """answer_correct: the last `###` line is "### <entity> is a <target>."; path_valid: the
  other non-empty lines are facts of the question chaining from the entity to the target
  (the release's path reward, checked separately from the answer)."""
  gold = _LINE_RE.match(example["answer"].strip())
  if gold is None:
    raise ValueError(f"answer {example['answer']!r} is invalid: allowed 'Tom is a X.'")
  entity, target = gold.groups()
  lines = [line.strip() for line in text.split("\n") if line.strip()]
  marked = [line for line in lines if line.startswith("###")]
  final = _ANSWER_RE.match(marked[-1]) if marked else None
  answer_correct = final is not None and final.groups() == (entity, target)
  facts = set(_sentences(example["question"]))
  walk = [line for line in lines if not line.startswith("###")]
  current = entity
  for line in walk:
    m = _LINE_RE.match(line)
    if line not in facts or m is None or m.group(1) != current:
      current = None
      break
    current = m.group(2)
  return dict(answer_correct=answer_correct, path_valid=bool(walk) and current == target)


def _sentences(question: str) -> list[str]:
  """The fact sentences of a question ("... ." pieces; the closing "Is ... ?" dropped)."""
  return [s.strip() + "." for s in question.split(".")[:-1]]


# ---------------------------------------------------------------------------
# Word tokenizer and token-level examples, for training from scratch.

def vocabulary() -> list[str]:
  """Every word a question or response can hold: structure words, entities, concepts."""
  return list(STRUCTURE_WORDS + ENTITIES + CONCEPTS)


@functools.lru_cache(maxsize=None)
def tokenizer() -> WordTokenizer:
  """The ProsQA word tokenizer (one token per word, mark and newline)."""
  return WordTokenizer(vocabulary(), "prosqa")


_default_tokenizer = tokenizer    # tokenize_example's argument shadows the name


def tokenize_example(example: dict, tokenizer: WordTokenizer | None = None,
                     recurrent_prompt: bool = False) -> dict[str, np.ndarray]:
  """<bos> question "\\n" response <eos> as ids, next-token targets on the response and EOS.

  control_flow: the prompt 1 (the release trains ProsQA with a non-recurrent prompt), the
  response and EOS 2; recurrent_prompt=True makes the prompt 2 too, except <bos>.
  target_ids[t] is the id position t predicts (-100 where not supervised).
  """
  tok = tokenizer or _default_tokenizer()
  prompt = [tok.bos_id] + tok.encode(example["question"] + "\n")
  response = tok.encode(response_text(example)) + [tok.eos_id]
  return prompt_response_example(prompt, response, recurrent_prompt=recurrent_prompt)


class ProsQASource(GeneratedSource):
  """Random-access source of tokenized examples; example i is a pure function of
  (base_seed, i). With `limit`, longer examples are drawn again (data/generated.py), so a
  fixed seq_len holds every example (the largest graphs' tail is cut)."""

  def __init__(self, num_examples: int, *, base_seed: int = 0, recurrent_prompt: bool = False,
               limit: int | None = None, **knobs):
    generate_example((int(base_seed), 0), **knobs)     # refuses bad knobs now, not mid-run
    self.recurrent_prompt = bool(recurrent_prompt)
    self.knobs = dict(knobs)
    super().__init__(num_examples, self._make, base_seed=base_seed, limit=limit,
                     name="ProsQASource",
                     details=f"recurrent_prompt={self.recurrent_prompt}, {self.knobs}")

  def _make(self, seed) -> dict[str, np.ndarray]:
    return tokenize_example(generate_example(seed, **self.knobs),
                            recurrent_prompt=self.recurrent_prompt)


# ---------------------------------------------------------------------------
# Public files and SFT records.

def read_prosqa(path: str) -> list[dict]:
  """The records of a public ProsQA file (a JSON list, or JSONL), each with question, steps
  and answer (idx_to_symbol, edges, root, target, neg_target kept when present)."""
  p = paths.resolve(path)
  if not p.exists():
    raise FileNotFoundError(
        f"{p.name} not found at {path}: download Coconut's data/prosqa_*.json "
        "(github.com/facebookresearch/coconut) and pass data.path")
  text = p.read_text()
  try:
    records = json.loads(text) if text.lstrip().startswith("[") else [
        json.loads(line) for line in text.splitlines() if line.strip()]
  except json.JSONDecodeError as e:
    raise ValueError(f"{path}: not valid JSON or JSONL ({e})") from e
  for n, r in enumerate(records):
    if not isinstance(r, dict) or not {"question", "steps", "answer"} <= set(r):
      raise ValueError(f"{path}: record {n} is invalid: allowed objects with question, "
                       "steps and answer")
  if not records:
    raise ValueError(f"{path} holds no records")
  return records


def sft_record(example: dict) -> dict:
  """{question, steps, answer}: the GSM8K-Aug record shape the SFT loader reads."""
  return dict(question=example["question"], steps=list(example["steps"]),
              answer=example["answer"])


def write_sft_jsonl(path: str, num_examples: int, *, seed: int, **knobs) -> None:
  """`num_examples` records (example i from (seed, i)) as JSONL, written whole or not at all."""
  _check_count("num_examples", num_examples, 1)
  paths.write_text(path, "".join(
      json.dumps(sft_record(generate_example((seed, i), **knobs))) + "\n"
      for i in range(num_examples)))
