"""Pathfinding (docs/experiments.md#tasks): the unique shortest path through a DAG with
parallel lanes and dead ends, following the T2MLR release's generator
(scripts/pathfinding/make_pathfinding_dataset.py); our own code, its definitions and knobs.

Graph: a backbone path of L edges (nodes 0..L, L uniform in [path_min, path_max]) from
start 0 to end L. Each of `lanes` parallel lanes leaves the backbone at index b uniform in
[0, L//2], rejoins it at m uniform in [L//2+1, L-1] and has (m - b) + extra fresh nodes,
extra uniform in [extra_min, extra_max], so its detour (m - b + extra + 1 edges) is
strictly longer than the backbone segment it bypasses. Then every node that reaches the end
(backbone and lane nodes, the end excepted, in index order) gets, with probability
dead_end_prob, a chain of dead_end_depth fresh nodes hanging off it. Edges are
deduplicated and never self-loops. Every lane spans the backbone's midpoint, so a start-end
path takes at most one lane and the backbone is always the unique shortest path; the
generator still counts the shortest paths (BFS layers) and redraws from the same stream if
there is more than one (MAX_ATTEMPTS, then an error), as the release does.

Names: "syllable" (the release's style: 2 syllables with probability 0.7 else 3, from its 70
consonant-vowel syllables, plus one suffix letter of SUFFIXES; distinct per example) or
"pool" (a sample without replacement from `name_pool(pool_size)`, fixed two-syllable names,
so the word tokenizer's vocabulary is small and fixed: `vocabulary`, `tokenizer`).

Prompt (exact): "Find the shortest path in this directed graph.\\nStart: <s>\\nEnd: <e>\\n"
"Edges:\\n" + the shuffled edges as "<u> -> <v>" lines + "\\nAnswer:". The release ends it
with "Answer: " (a trailing space); this module does not (`sft_record` adds the space back).
Response: ("Wait " if wait) + the path as "<n0> -> <n1> -> ..."; with random_walk, a random
walk from the start of at most random_walk_steps steps comes first: "<walk> | <response>".

Release notes: its `num_nodes=100` knob is never read by its generator (the graph's size
follows from the other knobs), so there is none here. Its checker (`_pathfinding_reward` in
src/components/generation_eval.py) reads keys `idx_to_symbol`, integer `start`/`end` and
`path_length` that its generator never writes, so it rejects every example of its own
dataset; `score_response` here reads what `generate_example` writes.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections import deque
from typing import Sequence, Union

import numpy as np
from absl import flags

from t2mlr_jax import cli, paths
from t2mlr_jax.data.generated import GeneratedSource, prompt_response_example
from t2mlr_jax.data.word_tokenizer import WordTokenizer

PROMPT_HEADER = "Find the shortest path in this directed graph.\n"
ANSWER_PREFIX = "Answer:"
ARROW = " -> "
WAIT = "Wait"
DIVIDER = "|"
SYLLABLES = tuple(c + v for c in "bcdfglmnprstvz" for v in "aeiou")   # the release's 70
SUFFIXES = ("x", "n", "r", "s", "t", "l", "m", "v")
NAME_STYLES = ("syllable", "pool")
MAX_ATTEMPTS = 100
# Every word a pool-named prompt or response holds besides the names.
FIXED_WORDS = ("Find", "the", "shortest", "path", "in", "this", "directed", "graph", ".",
               "Start", ":", "End", "Edges", "Answer", "->", WAIT, DIVIDER)
DEFAULTS = dict(path_min=10, path_max=18, lanes=6, extra_min=1, extra_max=3,
                dead_end_prob=0.2, dead_end_depth=2, wait=False, random_walk=False,
                random_walk_steps=30, names="syllable", pool_size=64)

SeedLike = Union[int, Sequence[int], np.random.SeedSequence, np.random.Generator]


def _check_count(name: str, value: int, minimum: int) -> None:
  if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < minimum:
    raise ValueError(f"{name}={value!r} is invalid: allowed integers >= {minimum}")


def _check_bool(name: str, value) -> None:
  if not isinstance(value, (bool, np.bool_)):
    raise ValueError(f"{name}={value!r} is invalid: allowed True or False")


def _check_knobs(k: dict) -> None:
  """ValueError naming the first invalid knob of a full knob dict (DEFAULTS' keys)."""
  _check_count("path_min", k["path_min"], 1)
  _check_count("path_max", k["path_max"], 1)
  if k["path_min"] > k["path_max"]:
    raise ValueError(f"path_min={k['path_min']} > path_max={k['path_max']} is invalid: "
                     "allowed path_min <= path_max")
  _check_count("lanes", k["lanes"], 0)
  if k["lanes"] > 0 and k["path_min"] < 3:
    raise ValueError(f"path_min={k['path_min']} is invalid with lanes={k['lanes']}: allowed "
                     "path_min >= 3 (a lane merges at an index in [L//2+1, L-1])")
  _check_count("extra_min", k["extra_min"], 0)
  _check_count("extra_max", k["extra_max"], 0)
  if k["extra_min"] > k["extra_max"]:
    raise ValueError(f"extra_min={k['extra_min']} > extra_max={k['extra_max']} is invalid: "
                     "allowed extra_min <= extra_max")
  p = k["dead_end_prob"]
  if (not isinstance(p, (int, float, np.floating, np.integer)) or isinstance(p, bool)
      or not 0.0 <= p <= 1.0):
    raise ValueError(f"dead_end_prob={p!r} is invalid: allowed numbers in [0, 1]")
  _check_count("dead_end_depth", k["dead_end_depth"], 1)
  _check_bool("wait", k["wait"])
  _check_bool("random_walk", k["random_walk"])
  _check_count("random_walk_steps", k["random_walk_steps"], 1)
  if k["names"] not in NAME_STYLES:
    raise ValueError(f"names={k['names']!r} is invalid: allowed {NAME_STYLES}")
  _check_count("pool_size", k["pool_size"], 1)
  if k["pool_size"] > len(SYLLABLES) ** 2:
    raise ValueError(f"pool_size={k['pool_size']} is invalid: allowed at most "
                     f"{len(SYLLABLES) ** 2} (two-syllable names)")


def _knobs(knobs: dict) -> dict:
  """DEFAULTS updated by `knobs`, checked; an unknown knob is a TypeError naming it."""
  unknown = sorted(set(knobs) - set(DEFAULTS))
  if unknown:
    raise TypeError(f"unknown pathfinding knobs {unknown}: allowed {sorted(DEFAULTS)}")
  k = {**DEFAULTS, **knobs}
  _check_knobs(k)
  return k


def max_nodes(**knobs) -> int:
  """The most nodes an example with these knobs can have (the pool_size that always fits)."""
  k = _knobs(knobs)
  length = k["path_max"]
  reach = length + 1 + (k["lanes"] * (length - 1 + k["extra_max"]) if k["lanes"] else 0)
  dead = (reach - 1) * k["dead_end_depth"] if k["dead_end_prob"] > 0 else 0
  return reach + dead


@functools.lru_cache(maxsize=None)
def _all_pool_names() -> tuple[str, ...]:
  # Ordered by a fixed hash, not a seeded shuffle, so the order never depends on numpy.
  names = [a + b for a in SYLLABLES for b in SYLLABLES]
  return tuple(sorted(names, key=lambda n: hashlib.sha256(f"pathfinding:{n}".encode())
                      .hexdigest()))


def name_pool(pool_size: int = 64) -> list[str]:
  """The fixed pool of `pool_size` two-syllable names (a prefix of one fixed order, so a
  smaller pool is a prefix of a larger one); identical on every machine and run."""
  _check_count("pool_size", pool_size, 1)
  if pool_size > len(SYLLABLES) ** 2:
    raise ValueError(f"pool_size={pool_size} is invalid: allowed at most "
                     f"{len(SYLLABLES) ** 2} (two-syllable names)")
  return list(_all_pool_names()[:pool_size])


def vocabulary(pool_size: int = 64) -> list[str]:
  """Every word a pool-named example's prompt and response can hold: FIXED_WORDS, then the
  pool's names (so a larger pool's ids extend a smaller one's)."""
  return list(FIXED_WORDS) + name_pool(pool_size)


@functools.lru_cache(maxsize=None)
def tokenizer(pool_size: int = 64) -> WordTokenizer:
  """The word tokenizer of `vocabulary(pool_size)` (cached)."""
  return WordTokenizer(vocabulary(pool_size), f"pathfinding{pool_size}")


TOKENIZER = tokenizer()


def format_prompt(start: str, end: str, edges: Sequence[Sequence[str]]) -> str:
  """The exact prompt text (ending "Answer:", no trailing space) for these named edges."""
  lines = "\n".join(f"{u}{ARROW}{v}" for u, v in edges)
  return f"{PROMPT_HEADER}Start: {start}\nEnd: {end}\nEdges:\n{lines}\n{ANSWER_PREFIX}"


def _build_graph(rng: np.random.Generator, k: dict) -> tuple[list[tuple[int, int]], int, int]:
  """(edges in insertion order, number of nodes, end node); the start is node 0."""
  edges: list[tuple[int, int]] = []
  seen: set[tuple[int, int]] = set()

  def add(u: int, v: int) -> None:
    if u != v and (u, v) not in seen:
      seen.add((u, v))
      edges.append((u, v))

  length = int(rng.integers(k["path_min"], k["path_max"] + 1))
  for i in range(length):
    add(i, i + 1)
  reach = list(range(length + 1))
  fresh = length + 1
  for _ in range(k["lanes"]):
    branch = int(rng.integers(0, length // 2 + 1))
    merge = int(rng.integers(length // 2 + 1, length))
    extra = int(rng.integers(k["extra_min"], k["extra_max"] + 1))
    lane = list(range(fresh, fresh + merge - branch + extra))
    fresh += len(lane)
    reach += lane
    for u, v in zip([branch] + lane, lane + [merge]):
      add(u, v)
  for src in reach:
    if src != length and rng.random() < k["dead_end_prob"]:
      for _ in range(k["dead_end_depth"]):
        add(src, fresh)
        src, fresh = fresh, fresh + 1
  return edges, fresh, length


def _adjacency(edges, nodes=()) -> dict:
  adj = {n: [] for n in nodes}
  for u, v in edges:
    adj.setdefault(u, []).append(v)
    adj.setdefault(v, [])
  return adj


def _bfs(adj: dict, start) -> tuple[dict, list]:
  """(distance from start of each reached node, the reached nodes in BFS order)."""
  dist, order, queue = {start: 0}, [start], deque([start])
  while queue:
    u = queue.popleft()
    for v in adj.get(u, ()):
      if v not in dist:
        dist[v] = dist[u] + 1
        order.append(v)
        queue.append(v)
  return dist, order


def _shortest_paths(adj: dict, start, end) -> tuple[int, list]:
  """(number of shortest start-end paths, one of them); (0, []) if end is unreachable."""
  dist, order = _bfs(adj, start)
  if end not in dist:
    return 0, []
  count = {start: 1}
  for u in order:                    # BFS order: every layer is complete before the next
    for v in adj[u]:
      if dist[v] == dist[u] + 1:
        count[v] = count.get(v, 0) + count[u]
  path = [end]
  while path[-1] != start:
    path.append(next(u for u in order if dist[u] == dist[path[-1]] - 1 and path[-1] in adj[u]))
  return count[end], path[::-1]


def _syllable_names(rng: np.random.Generator, n: int) -> list[str]:
  names: dict[str, None] = {}        # insertion-ordered set
  while len(names) < n:
    syllables = 2 if rng.random() < 0.7 else 3
    parts = [SYLLABLES[i] for i in rng.integers(0, len(SYLLABLES), size=syllables)]
    names["".join(parts) + SUFFIXES[int(rng.integers(0, len(SUFFIXES)))]] = None
  return list(names)


def _node_names(rng: np.random.Generator, n: int, k: dict) -> list[str]:
  if k["names"] == "syllable":
    return _syllable_names(rng, n)
  if n > k["pool_size"]:
    raise ValueError(f"pool_size={k['pool_size']} is invalid for this example: it has {n} "
                     f"nodes; allowed pool_size >= {n} (max_nodes(**knobs) always fits)")
  pool = name_pool(k["pool_size"])
  return [pool[i] for i in rng.choice(len(pool), size=n, replace=False)]


def _random_walk(rng: np.random.Generator, adj: dict, start: int, steps: int) -> list[int]:
  walk = [start]
  for _ in range(steps):
    nbrs = adj[walk[-1]]
    if not nbrs:
      break
    walk.append(nbrs[int(rng.integers(0, len(nbrs)))])
  return walk


def generate_example(seed: SeedLike, **knobs) -> dict:
  """One example: dict(prompt, response, answer (the path text), edges ([u, v] names in
  prompt order), start, end, path (names), shortest_length (edges)).

  seed: anything `np.random.default_rng` accepts; the example is a pure function of it and
  the knobs (DEFAULTS: the release's defaults, names="syllable", pool_size=64).
  """
  k = _knobs(knobs)
  rng = np.random.default_rng(seed)
  for _ in range(MAX_ATTEMPTS):
    edges, num_nodes, end = _build_graph(rng, k)
    adj = _adjacency(edges, range(num_nodes))
    count, path = _shortest_paths(adj, 0, end)
    if count == 1:
      break
  else:
    raise RuntimeError(f"no graph with a unique shortest path in {MAX_ATTEMPTS} attempts "
                       f"(seed={seed!r}, knobs={k})")
  names = _node_names(rng, num_nodes, k)
  named = [[names[u], names[v]] for u, v in edges]
  named = [named[i] for i in rng.permutation(len(named))]
  answer = ARROW.join(names[i] for i in path)
  response = f"{WAIT} {answer}" if k["wait"] else answer
  if k["random_walk"]:
    walk = _random_walk(rng, adj, 0, k["random_walk_steps"])
    response = f"{ARROW.join(names[i] for i in walk)} {DIVIDER} {response}"
  return dict(prompt=format_prompt(names[0], names[end], named), response=response,
              answer=answer, edges=named, start=names[0], end=names[end],
              path=[names[i] for i in path], shortest_length=len(path) - 1)


# ---------------------------------------------------------------------------
# Checking generated answers.

def is_shortest_path(edges: Sequence[Sequence[str]], start: str, end: str,
                     path_names: Sequence[str]) -> bool:
  """Whether `path_names` runs from start to end along `edges` in the fewest edges."""
  path = list(path_names)
  if not path or path[0] != start or path[-1] != end:
    return False
  edge_set = {(u, v) for u, v in edges}
  if any((u, v) not in edge_set for u, v in zip(path, path[1:])):
    return False
  dist, _ = _bfs(_adjacency(edges), start)
  return dist.get(end) == len(path) - 1


def parse_response(text: str) -> list[str]:
  """The path names of a generated response: after the last DIVIDER, without a leading
  "Wait", split on "->" ([] for text without a name)."""
  part = text.split(DIVIDER)[-1].strip()
  if part == WAIT or part.startswith(WAIT + " "):
    part = part[len(WAIT):].strip()
  names = [p.strip() for p in part.split("->")]
  return [] if any(not n for n in names) else names


def score_response(example: dict, text: str) -> bool:
  """Whether a generated response gives a shortest path of the example's graph (the gold
  path: it is unique); the release's optional walk prefix and "Wait " are skipped."""
  if not isinstance(text, str):
    return False
  return is_shortest_path(example["edges"], example["start"], example["end"],
                          parse_response(text))


# ---------------------------------------------------------------------------
# Token-level examples (word tokenizer) and a Grain source, for training from scratch.

def tokenize_example(example: dict, tokenizer: WordTokenizer | None = None,
                     recurrent_prompt: bool = False) -> dict[str, np.ndarray]:
  """<bos> prompt response <eos> as ids with next-token targets on the response and EOS.

  target_ids[t] is the id position t predicts (-100 where not supervised): the last prompt
  position predicts the first response token. control_flow: response and EOS 2; the prompt
  1, or with recurrent_prompt (the release trains Pathfinding all-recurrent:
  CONTROL_FLOW_ALL_RECURRENT=True) 2 as well except <bos>, which keeps 1.
  """
  tok = tokenizer or TOKENIZER
  prompt = [tok.bos_id] + tok.encode(example["prompt"])
  response = tok.encode(example["response"]) + [tok.eos_id]
  return prompt_response_example(prompt, response, recurrent_prompt=recurrent_prompt)


def max_tokens(**knobs) -> int:
  """The most tokens `tokenize_example` can give an example with these knobs (every lane
  at its longest, every dead end drawn): a seq_len no example exceeds."""
  k = _knobs(knobs)
  n = max_nodes(**knobs)
  edges = n - 1 + k["lanes"]                 # a tree on n nodes, plus each lane's merge edge
  prompt = 1 + 10 + 4 + 4 + 3 + 4 * edges + 2  # <bos>, header, Start/End, Edges:, Answer:
  path = 2 * k["path_max"] + 1
  walk = 2 * k["random_walk_steps"] + 2 if k["random_walk"] else 0
  return prompt + path + int(k["wait"]) + walk + 1


class PathfindingSource(GeneratedSource):
  """Random-access source of tokenized pool-named examples; example i is a pure function
  of (base_seed, i). The pool must fit every example these knobs can draw (`max_nodes`).
  With `limit`, longer examples are drawn again (data/generated.py): the largest graphs'
  tail is cut so a CPU's seq_len stays near the typical length, not `max_tokens`' worst."""

  def __init__(self, num_examples: int, *, base_seed: int = 0, recurrent_prompt: bool = False,
               limit: int | None = None, **knobs):
    if knobs.get("names", "pool") != "pool":
      raise ValueError(f"names={knobs['names']!r} is invalid: allowed 'pool' (the word "
                       "tokenizer's vocabulary holds the pool names only)")
    self.recurrent_prompt = bool(recurrent_prompt)
    self.kwargs = {**knobs, "names": "pool"}
    k = _knobs(self.kwargs)
    need = max_nodes(**self.kwargs)
    if need > k["pool_size"]:
      raise ValueError(f"pool_size={k['pool_size']} is invalid for these knobs: an example "
                       f"can have up to {need} nodes; allowed pool_size >= {need}")
    self.tokenizer = tokenizer(k["pool_size"])
    super().__init__(num_examples, self._make, base_seed=base_seed, limit=limit,
                     name="PathfindingSource",
                     details=f"recurrent_prompt={self.recurrent_prompt}, {self.kwargs}")

  def _make(self, seed) -> dict[str, np.ndarray]:
    return tokenize_example(generate_example(seed, **self.kwargs), self.tokenizer,
                            self.recurrent_prompt)


# ---------------------------------------------------------------------------
# Chat records (prompt/response text), for fine-tuning pretrained models.

def sft_record(example: dict) -> dict[str, str]:
  """{prompt, response, answer} in the release's exact text: the prompt gets back its
  trailing space ("Answer: "), so an HF tokenizer sees what the release trains on."""
  return dict(prompt=example["prompt"] + " ", response=example["response"],
              answer=example["answer"])


def write_sft_jsonl(path: str, num_examples: int, *, seed: int, **knobs) -> None:
  """`num_examples` records (example i from (seed, i); syllable names unless knobs say
  otherwise) as JSONL, written whole or not at all."""
  _check_count("num_examples", num_examples, 1)
  _knobs(knobs)
  paths.write_text(path, "".join(
      json.dumps(sft_record(generate_example((seed, i), **knobs))) + "\n"
      for i in range(num_examples)))


def write_release_splits(out: str, *, train: int = 20000, test: int = 1000, seed: int = 42,
                         **knobs) -> list[str]:
  """The release recipe's files under `out`: pathfinding_train.jsonl and
  pathfinding_test.jsonl (syllable names; test examples from seed + 1), as
  {prompt, response, answer} records for data.task=sft; returns their paths."""
  made = []
  for split, n, s in (("train", train, seed), ("test", test, seed + 1)):
    path = os.path.join(out, f"pathfinding_{split}.jsonl")
    write_sft_jsonl(path, n, seed=s, **knobs)
    made.append(path)
  return made


def main(argv=None):
  """`python -m t2mlr_jax.data.pathfinding --out=data/pathfinding`: the release recipe's
  data (configs/pathfinding.py:release_*); flags defined here so importing defines none."""
  out = flags.DEFINE_string("out", "data/pathfinding", "directory of the two JSONL files")
  train = flags.DEFINE_integer("train", 20000, "training examples (the release's 20000)")
  test = flags.DEFINE_integer("test", 1000, "held-out examples")
  seed = flags.DEFINE_integer("seed", 42, "the training split's seed (test: seed + 1)")
  wait = flags.DEFINE_bool("wait", False, "'Wait ' before each path (--add_wait_tokens)")

  def run(argv):
    del argv
    made = write_release_splits(out.value, train=train.value, test=test.value,
                                seed=seed.value, wait=wait.value)
    print(f"wrote {', '.join(made)}")
  cli.run(run, argv)


if __name__ == "__main__":
  main()
