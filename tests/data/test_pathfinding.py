"""Pathfinding data: graph structure, unique shortest path (checked by an independent path
enumeration on the prompt text), exact text format, names, tokenization and scoring."""

import hashlib
import json
import re

import numpy as np
import pytest

from t2mlr_jax.data import pathfinding as pf
from t2mlr_jax.data.word_tokenizer import split_words

HEADER = "Find the shortest path in this directed graph.\n"
SMALL = dict(path_min=3, path_max=5, lanes=2, extra_min=1, extra_max=2)
EDGE_RE = re.compile(r"^([a-z]+) -> ([a-z]+)$")
SETTINGS = [pytest.param({}, 6, id="default"), pytest.param(SMALL, 2, id="small")]


def _parse_prompt(prompt):
  """(start, end, edges) read back from the prompt text alone."""
  lines = prompt.split("\n")
  assert lines[0] + "\n" == HEADER and lines[3] == "Edges:" and lines[-1] == "Answer:"
  start = re.fullmatch(r"Start: ([a-z]+)", lines[1]).group(1)
  end = re.fullmatch(r"End: ([a-z]+)", lines[2]).group(1)
  edges = []
  for line in lines[4:-1]:
    m = EDGE_RE.match(line)
    assert m, line
    edges.append((m.group(1), m.group(2)))
  return start, end, edges


def _all_paths(edges, start, end):
  """Every simple start-end path, by depth-first enumeration (the graph must be acyclic)."""
  adj = {}
  for u, v in edges:
    adj.setdefault(u, []).append(v)
  out, stack = [], [[start]]
  while stack:
    path = stack.pop()
    if path[-1] == end:
      out.append(path)
      continue
    for v in adj.get(path[-1], ()):
      assert v not in path, "cycle"
      stack.append(path + [v])
  return out


@pytest.mark.parametrize("knobs,lanes", SETTINGS)
@pytest.mark.parametrize("seed", range(30))
def test_unique_shortest_path_from_the_prompt_text(seed, knobs, lanes):
  ex = pf.generate_example(seed, **knobs)
  assert set(ex) == {"prompt", "response", "answer", "edges", "start", "end", "path",
                     "shortest_length"}
  start, end, edges = _parse_prompt(ex["prompt"])
  assert (start, end) == (ex["start"], ex["end"])
  assert edges == [tuple(e) for e in ex["edges"]]
  assert len(set(edges)) == len(edges) and all(u != v for u, v in edges)
  # backbone + lanes (k nodes, k + 1 edges each) + dead ends (d nodes, d edges each): a
  # merged name would lose a node
  nodes = {n for e in edges for n in e}
  assert len(nodes) == len(edges) + 1 - lanes
  paths = sorted(_all_paths(edges, start, end), key=len)
  assert len(paths) == lanes + 1              # the backbone, or the backbone with one lane
  assert paths[0] == ex["path"] and len(paths[1]) > len(paths[0])   # unique, lanes longer
  lo, hi = knobs.get("path_min", 10), knobs.get("path_max", 18)
  assert lo <= ex["shortest_length"] == len(ex["path"]) - 1 <= hi
  assert ex["answer"] == " -> ".join(ex["path"]) == ex["response"]
  assert pf.is_shortest_path(ex["edges"], start, end, ex["path"])


def test_prompt_format_exact():
  ex = pf.generate_example(0, **SMALL)
  body = "\n".join(f"{u} -> {v}" for u, v in ex["edges"])
  assert ex["prompt"] == (f"{HEADER}Start: {ex['start']}\nEnd: {ex['end']}\nEdges:\n{body}"
                          "\nAnswer:")
  assert pf.sft_record(ex) == dict(prompt=ex["prompt"] + " ", response=ex["response"],
                                   answer=ex["answer"])
  assert pf.sft_record(ex)["prompt"].endswith("\nAnswer: ")     # the release's exact text


def test_edges_are_shuffled_and_lengths_vary():
  first_from_start = {pf.generate_example(s, **SMALL)["edges"][0][0] ==
                      pf.generate_example(s, **SMALL)["start"] for s in range(30)}
  assert first_from_start == {True, False}
  assert {pf.generate_example(s, **SMALL)["shortest_length"] for s in range(40)} == {3, 4, 5}


def test_syllable_names_follow_the_release_style():
  syl = "(?:[bcdfglmnprstvz][aeiou])"
  for s in range(10):
    ex = pf.generate_example(s)
    for n in {n for e in ex["edges"] for n in e}:
      assert re.fullmatch(f"{syl}{{2,3}}[xnrstlmv]", n), n


def test_determinism_per_seed():
  assert pf.generate_example(5) == pf.generate_example(5)
  assert pf.generate_example(5) != pf.generate_example(6)
  assert pf.generate_example((1, 2), names="pool", **SMALL) == pf.generate_example(
      (1, 2), names="pool", **SMALL)


def test_name_pool_is_fixed():
  assert pf.name_pool(8) == ["pefe", "tecu", "taba", "gade", "memo", "lara", "tezo", "gapo"]
  digest = hashlib.sha256(" ".join(pf.name_pool(4900)).encode()).hexdigest()
  assert digest == "c6d1a926077f32b533af68da4570e13d3678a2d103294f0837c1fedc9e021271"
  assert len(set(pf.name_pool(4900))) == 4900
  assert pf.name_pool(100)[:64] == pf.name_pool(64)
  assert pf.vocabulary(100)[:len(pf.vocabulary())] == pf.vocabulary()
  with pytest.raises(ValueError, match="pool_size"):
    pf.name_pool(4901)


def test_pool_names_are_sampled_from_the_pool():
  pool = set(pf.name_pool(64))
  seen = set()
  for s in range(20):
    ex = pf.generate_example(s, names="pool", **SMALL)
    names = {n for e in ex["edges"] for n in e}
    assert names <= pool
    seen |= names
  assert len(seen) > 50
  with pytest.raises(ValueError, match="pool_size"):
    pf.generate_example(0, names="pool")      # ~100 nodes at the release's defaults


@pytest.mark.parametrize("knobs", [dict(wait=True), dict(random_walk=True),
                                   dict(wait=True, random_walk=True, random_walk_steps=4)])
def test_word_tokenizer_round_trip(knobs):
  tok = pf.tokenizer(pf.max_nodes(**knobs))
  for s in range(5):
    for setting in (dict(SMALL, pool_size=64), dict(pool_size=pf.max_nodes())):
      ex = pf.generate_example(s, names="pool", **setting, **knobs)
      for text in (ex["prompt"], ex["response"]):
        assert tok.decode(tok.encode(text)) == text
        assert set(split_words(text)) <= set(tok.token_to_id)


def test_wait_and_random_walk_responses():
  ex = pf.generate_example(3, wait=True, **SMALL)
  assert ex["response"] == "Wait " + ex["answer"]
  ex = pf.generate_example(3, random_walk=True, wait=True, random_walk_steps=3, **SMALL)
  walk, sep, rest = ex["response"].partition(" | ")
  assert sep and rest == "Wait " + ex["answer"]
  walk = walk.split(" -> ")
  assert walk[0] == ex["start"] and 1 <= len(walk) <= 4
  assert all([u, v] in ex["edges"] for u, v in zip(walk, walk[1:]))


def test_tokenize_example_layout():
  ex = pf.generate_example(2, names="pool", **SMALL)
  tok = pf.TOKENIZER
  n_prompt = 1 + len(tok.encode(ex["prompt"]))
  n_resp = len(tok.encode(ex["response"])) + 1
  for recurrent in (False, True):
    out = pf.tokenize_example(ex, tok, recurrent_prompt=recurrent)
    ids, tgt, cf = out["input_ids"], out["target_ids"], out["control_flow"]
    assert ids.dtype == tgt.dtype == cf.dtype == np.int32
    assert len(ids) == n_prompt + n_resp and ids[0] == tok.bos_id and ids[-1] == tok.eos_id
    assert tok.decode(ids[:n_prompt]) == ex["prompt"]
    assert tok.decode(ids[n_prompt:]) == ex["response"]
    assert (tgt[:n_prompt - 1] == -100).all() and tgt[-1] == -100
    np.testing.assert_array_equal(tgt[n_prompt - 1:-1], ids[n_prompt:])
    assert cf[0] == 1 and (cf[n_prompt:] == 2).all()
    assert (cf[1:n_prompt] == (2 if recurrent else 1)).all()


def test_source_is_random_access_and_deterministic():
  src = pf.PathfindingSource(5, base_seed=3, recurrent_prompt=True, **SMALL)
  assert len(src) == 5 and "PathfindingSource" in repr(src)
  a, b = src[4], pf.PathfindingSource(5, base_seed=3, recurrent_prompt=True, **SMALL)[4]
  np.testing.assert_array_equal(a["input_ids"], b["input_ids"])
  ex = pf.generate_example((3, 4), names="pool", **SMALL)
  ids = pf.tokenize_example(ex, pf.TOKENIZER, recurrent_prompt=True)["input_ids"]
  np.testing.assert_array_equal(a["input_ids"], ids)
  with pytest.raises(IndexError, match="0..4"):
    src[5]
  with pytest.raises(ValueError, match="pool_size"):
    pf.PathfindingSource(5)                   # the release's defaults need up to 415 names
  assert len(pf.PathfindingSource(2, pool_size=pf.max_nodes())[1]["input_ids"]) > 300
  with pytest.raises(ValueError, match="names"):
    pf.PathfindingSource(5, names="syllable", **SMALL)


def _lane_path(ex):
  """A valid start-end path through a lane (longer than the gold one)."""
  start, end, edges = _parse_prompt(ex["prompt"])
  return sorted(_all_paths(edges, start, end), key=len)[1]


@pytest.mark.parametrize("seed", range(5))
def test_score_response(seed):
  ex = pf.generate_example(seed, **SMALL)
  gold = ex["answer"]
  assert pf.score_response(ex, ex["response"])
  assert pf.score_response(ex, "Wait " + gold)
  assert pf.score_response(ex, f"{ex['start']} -> {ex['path'][1]} | Wait {gold}")
  walked = pf.generate_example(seed, wait=True, random_walk=True, **SMALL)
  assert pf.score_response(walked, walked["response"])
  lane = _lane_path(ex)
  assert pf.is_shortest_path(ex["edges"], ex["start"], ex["end"], lane) is False
  assert not pf.score_response(ex, " -> ".join(lane))                # valid but longer
  assert not pf.score_response(ex, " -> ".join(ex["path"][:1] + ex["path"][2:]))  # no edge
  assert not pf.score_response(ex, " -> ".join(ex["path"][::-1]))    # wrong path
  assert not pf.score_response(ex, " -> ".join(ex["path"][:-1]))     # stops short
  assert not pf.score_response(ex, gold + " -> " + ex["end"])
  assert not pf.score_response(ex, "")
  assert not pf.score_response(ex, "Wait")
  assert not pf.score_response(ex, gold + " ->")


def test_write_sft_jsonl_is_deterministic_and_whole(tmp_path):
  a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
  pf.write_sft_jsonl(str(a), 3, seed=7, **SMALL)
  pf.write_sft_jsonl(str(b), 3, seed=7, **SMALL)
  assert a.read_text() == b.read_text()
  rows = [json.loads(line) for line in a.read_text().splitlines()]
  assert len(rows) == 3 and set(rows[0]) == {"prompt", "response", "answer"}
  assert rows[1] == pf.sft_record(pf.generate_example((7, 1), **SMALL))
  assert not list(tmp_path.glob("*.tmp"))


@pytest.mark.parametrize("knobs,match", [
    (dict(path_min=6, path_max=5), "path_min"),
    (dict(path_min=0), "path_min"),
    (dict(path_min=2, path_max=4), "path_min"),       # a lane needs L >= 3
    (dict(lanes=-1), "lanes"),
    (dict(extra_min=-1), "extra_min"),
    (dict(extra_min=3, extra_max=2), "extra_min"),
    (dict(dead_end_prob=1.5), "dead_end_prob"),
    (dict(dead_end_prob=-0.1), "dead_end_prob"),
    (dict(dead_end_prob=float("nan")), "dead_end_prob"),
    (dict(dead_end_depth=0), "dead_end_depth"),
    (dict(wait=1), "wait"),
    (dict(random_walk_steps=0), "random_walk_steps"),
    (dict(names="letters"), "names"),
    (dict(pool_size=0), "pool_size"),
])
def test_bad_knobs_raise(knobs, match):
  with pytest.raises(ValueError, match=match):
    pf.generate_example(0, **knobs)


def test_unknown_knob_and_edge_settings():
  with pytest.raises(TypeError, match="num_nodes"):
    pf.generate_example(0, num_nodes=100)
  ex = pf.generate_example(0, path_min=1, path_max=1, lanes=0, dead_end_prob=0.0)
  assert ex["edges"] == [[ex["start"], ex["end"]]] and ex["path"] == [ex["start"], ex["end"]]
  ex = pf.generate_example(1, dead_end_prob=1.0, dead_end_depth=3, **dict(SMALL, lanes=0))
  L = ex["shortest_length"]
  assert len(ex["edges"]) == L + L * 3        # every backbone node but the end has a chain


def test_shortest_path_count_and_redraw(monkeypatch):
  diamond = [(0, 1), (0, 2), (1, 3), (2, 3), (3, 4)]
  adj = pf._adjacency(diamond)
  assert pf._shortest_paths(adj, 0, 4)[0] == 2
  assert pf._shortest_paths(adj, 1, 4) == (1, [1, 3, 4])
  assert pf._shortest_paths(adj, 4, 0) == (0, [])
  assert not pf.is_shortest_path([list(e) for e in diamond], 0, 4, [0, 1, 4])
  monkeypatch.setattr(pf, "_build_graph", lambda rng, k: (diamond, 5, 4))
  with pytest.raises(RuntimeError, match="unique shortest path"):
    pf.generate_example(0)


def test_an_id_past_the_vocabulary_decodes_as_its_number():
  """A model's embedding table may be larger than the task's vocabulary: any id it emits
  decodes (as <idN>), so an untrained model's completion is scored, not an error."""
  tok = pf.tokenizer(8)
  assert tok.decode([tok.bos_id, tok.token_to_id["->"], tok.vocab_size + 3]) == (
      f"-> <id{tok.vocab_size + 3}>")
  with pytest.raises(ValueError, match="token id -1 is out of range"):
    tok.decode([-1])
