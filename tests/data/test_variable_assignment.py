"""Variable Assignment data: structure, exact prompt format, alias resolution, determinism."""

import re

import numpy as np
import pytest

from t2mlr_jax.data import variable_assignment as va

HEADER = "Variable assignment. Follow the assignments and fill in the blank.\n"
LINE_RE = re.compile(r"^([a-z])=([a-z]|[0-9])$")


def _table(lines):
  out = {}
  for line in lines:
    m = LINE_RE.match(line)
    assert m, line
    assert m.group(1) not in out
    out[m.group(1)] = m.group(2)
  return out


def _chain(table, var):
  """Independent resolution: the list of variables visited from var to a digit."""
  path = [var]
  while not table[path[-1]].isdigit():
    path.append(table[path[-1]])
    assert len(path) <= len(table), "cycle"
  return path


@pytest.mark.parametrize("seed", range(25))
def test_structure_and_answer(seed):
  ex = va.generate_example(seed)
  assert set(ex) == {"prompt", "answer", "lines", "query"}
  lines, query = ex["lines"], ex["query"]
  table = _table(lines)  # also checks: single letters, each assigned once
  assert len(lines) == 8 + 2 + 6
  assert len(set(table)) == 16  # names without replacement
  base = [v for v, rhs in table.items() if rhs.isdigit()]
  aliases = [v for v, rhs in table.items() if not rhs.isdigit()]
  assert len(base) == 8 and len(aliases) == 8
  path = _chain(table, query)
  assert len(path) == 3  # query -> alias -> base variable: depth 2
  assert path[0] not in base and path[1] not in base and path[2] in base
  assert ex["answer"] == table[path[2]]
  assert ex["answer"] == va.resolve(lines, query)
  assert re.fullmatch(r"[0-9]", ex["answer"])
  distractors = [v for v in aliases if v not in path]
  assert len(distractors) == 6
  for v in table:  # every variable resolves: the distractors form no cycle
    _chain(table, v)
    va.resolve(lines, v)
  assert ex["prompt"] == HEADER + "\n".join(lines) + f"\n{query}=___\nAnswer: |"


def test_prompt_format_exact():
  ex = va.generate_example(0)
  body = ex["prompt"].split("\n")
  assert body[0] == "Variable assignment. Follow the assignments and fill in the blank."
  assert body[1:17] == ex["lines"]
  assert body[17] == f"{ex['query']}=___"
  assert body[18] == "Answer: |"
  assert len(body) == 19
  assert va.format_prompt(["a=1", "b=a"], "b") == HEADER + "a=1\nb=a\nb=___\nAnswer: |"


def test_lines_are_shuffled():
  # The query's own line is not always in the same place, base lines not always first.
  query_positions = set()
  first_is_base = set()
  for seed in range(40):
    ex = va.generate_example(seed)
    query_positions.add(next(i for i, l in enumerate(ex["lines"])
                             if l.startswith(ex["query"] + "=")))
    first_is_base.add(ex["lines"][0][-1].isdigit())
  assert len(query_positions) > 5
  assert first_is_base == {True, False}


def test_answers_and_names_vary():
  answers = {va.generate_example(s)["answer"] for s in range(200)}
  assert answers == {str(d) for d in range(10)}
  queries = {va.generate_example(s)["query"] for s in range(200)}
  assert len(queries) > 15


def test_determinism_per_seed():
  assert va.generate_example(5) == va.generate_example(5)
  assert va.generate_example(5) != va.generate_example(6)
  assert va.generate_example((1, 2)) == va.generate_example((1, 2))


def test_other_depths_and_sizes():
  ex = va.generate_example(3, num_base=4, depth=3, num_distractors=2)
  table = _table(ex["lines"])
  assert len(table) == 4 + 3 + 2
  assert len(_chain(table, ex["query"])) == 4
  assert ex["answer"] == va.resolve(ex["lines"], ex["query"])
  ex = va.generate_example(3, depth=1, num_distractors=0)
  assert len(_chain(_table(ex["lines"]), ex["query"])) == 2


def test_resolve_follows_alias_chains():
  lines = ["a=3", "b=a", "c=b", "d=7", "e=c"]
  assert va.resolve(lines, "e") == "3"
  assert va.resolve(lines, "d") == "7"
  with pytest.raises(ValueError, match="cycle"):
    va.resolve(["a=b", "b=a"], "a")
  with pytest.raises(ValueError, match="not assigned"):
    va.resolve(["a=b"], "a")
  with pytest.raises(ValueError, match="assigned twice"):
    va.resolve(["a=1", "a=2"], "a")
  with pytest.raises(ValueError, match="invalid"):
    va.resolve(["a:1"], "a")


@pytest.mark.parametrize("kwargs,match", [
    (dict(num_base=0), "num_base"),
    (dict(depth=0), "depth"),
    (dict(num_distractors=-1), "num_distractors"),
    (dict(num_base=20, num_distractors=6), "at most 26"),
])
def test_bad_arguments_raise(kwargs, match):
  with pytest.raises(ValueError, match=match):
    va.generate_example(0, **kwargs)


def test_chain_lines_walks_the_aliases_in_order():
  lines = ["c=l", "v=1", "z=l", "l=v", "q=3"]
  assert va.chain_lines(lines, "z") == ["z=l", "l=v", "v=1"]
  assert va.chain_lines(lines, "q") == ["q=3"]
  with pytest.raises(ValueError, match="not assigned"):
    va.chain_lines(lines, "w")


def test_sft_record_response_walks_the_chain_then_marks_the_answer():
  ex = va.generate_example(1)
  rec = va.sft_record(ex)
  walk = rec["response"].split("\n")
  assert rec["prompt"] == ex["prompt"] and walk[-1] == f"### {ex['answer']}"
  assert walk[0].startswith(ex["query"] + "=") and len(walk) == 2 + 2   # depth 2: 3 lines
  assert walk[-2].endswith("=" + ex["answer"])
  assert all(line in ex["lines"] for line in walk[:-1])
  assert va.sft_record(ex, steps=False)["response"] == f"### {ex['answer']}"


def test_write_sft_jsonl_is_deterministic_and_whole(tmp_path):
  import json
  a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
  va.write_sft_jsonl(str(a), 5, seed=3)
  va.write_sft_jsonl(str(b), 5, seed=3)
  assert a.read_text() == b.read_text()
  recs = [json.loads(line) for line in a.read_text().splitlines()]
  assert [r["prompt"] for r in recs] == [va.generate_example((3, i))["prompt"] for i in range(5)]
  assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl", "b.jsonl"]
  with pytest.raises(ValueError, match="num_examples"):
    va.write_sft_jsonl(str(tmp_path / "c.jsonl"), 0, seed=0)


def test_chain_correct_scores_the_walk_not_just_the_answer():
  ex = va.generate_example(4)
  assert va.parse_prompt(ex["prompt"]) == (ex["lines"], ex["query"])
  walk = va.sft_record(ex)["response"]
  assert va.chain_correct(ex["prompt"], walk)
  assert va.chain_correct(ex["prompt"], walk + "\nmore text")
  first, rest = walk.split("\n", 1)
  assert not va.chain_correct(ex["prompt"], rest)                 # skips the first hop
  assert not va.chain_correct(ex["prompt"], f"### {ex['answer']}")  # right digit, no walk
  with pytest.raises(ValueError, match="not a Variable Assignment prompt"):
    va.parse_prompt("What is 2+2?")


def test_control_flow_from_tokens_is_the_tokenized_one():
  from t2mlr_jax.data import variable_assignment as va
  for seed in range(4):
    ex = va.tokenize_example(va.generate_example(seed, depth=1 + seed % 3))
    np.testing.assert_array_equal(va.control_flow(ex["input_ids"]), ex["control_flow"])
  with pytest.raises(ValueError, match="answer prefix"):
    va.control_flow(np.array([5, 6, 7], np.int32))
