"""ProsQA data: the answer follows from the question's facts (checked from the text alone),
the steps are a shortest chain of those facts, scoring, tokenization, the public file
loader and SFT records."""

import json
import re

import numpy as np
import pytest

from t2mlr_jax.data import prosqa, sft
from t2mlr_jax.data.word_tokenizer import BOS_ID, EOS_ID, NEWLINE_ID

EVERY_RE = re.compile(r"^Every ([a-z]+) is a ([a-z]+)\.$")
ENTITY_RE = re.compile(r"^([A-Z][a-z]+) is a ([a-z]+)\.$")
QUESTION_RE = re.compile(r"^Is ([A-Z][a-z]+) a ([a-z]+) or ([a-z]+)\?$")

# Two records in the public files' layout: one with the graph keys, one without.
PUBLIC_RECORDS = [
    dict(question="Every wumpus is a yimpus. Tom is a wumpus. Every yimpus is a rempus. "
                  "Bob is a gorpus. Every gorpus is a brimpus. Is Tom a brimpus or rempus?",
         steps=["Tom is a wumpus.", "Every wumpus is a yimpus.", "Every yimpus is a rempus."],
         answer="Tom is a rempus.",
         idx_to_symbol=["Tom", "Bob", "wumpus", "gorpus", "yimpus", "brimpus", "rempus"],
         edges=[[0, 2], [1, 3], [2, 4], [3, 5], [4, 6]], root=0, target=6, neg_target=5),
    dict(question="Sally is a lempus. Every lempus is a impus. Every impus is a jelpus. "
                  "Every boompus is a jelpus. Alex is a boompus. Alex is a terpus. "
                  "Is Sally a terpus or jelpus?",
         steps=["Sally is a lempus.", "Every lempus is a impus.", "Every impus is a jelpus."],
         answer="Sally is a jelpus."),
]


def parse_question(question):
  """(facts as (lhs, rhs) pairs, fact sentences, entity, option A, option B), from text."""
  head, _, tail = question.rpartition(". ")
  q = QUESTION_RE.match(tail)
  assert q, tail
  sentences = [s + "." for s in head.split(". ")]
  pairs = []
  for s in sentences:
    m = EVERY_RE.match(s) or ENTITY_RE.match(s)
    assert m, s
    pairs.append(m.groups())
  return pairs, sentences, q.group(1), q.group(2), q.group(3)


def closure(pairs):
  """Everything reachable from each node, by repeated set union until nothing grows."""
  reach = {}
  for a, b in pairs:
    reach.setdefault(a, set()).add(b)
    reach.setdefault(b, set())
  grown = True
  while grown:
    grown = False
    for a in reach:
      new = set().union(*(reach[b] for b in reach[a])) - reach[a]
      if new:
        reach[a] |= new
        grown = True
  return reach


def hops(pairs, start, goal):
  """The fewest facts from start to goal (frontier by frontier), or None."""
  frontier, seen, n = {start}, {start}, 0
  while frontier:
    if goal in frontier:
      return n
    frontier = {b for a, b in pairs if a in frontier} - seen
    seen |= frontier
    n += 1
  return None


def answer_follows(example):
  """Whether the answer's concept, and not the other option, follows from the facts."""
  pairs, _, entity, a, b = parse_question(example["question"])
  m = ENTITY_RE.match(example["answer"])
  if not m or m.group(1) != entity or m.group(2) not in (a, b):
    return False
  other = b if m.group(2) == a else a
  reach = closure(pairs)[entity]
  return m.group(2) in reach and other not in reach


def steps_chain(example):
  """Whether the steps are facts of the question walking from the entity to the answer."""
  _, sentences, entity, _, _ = parse_question(example["question"])
  current = entity
  for i, step in enumerate(example["steps"]):
    m = (ENTITY_RE if i == 0 else EVERY_RE).match(step)
    if not m or step not in sentences or m.group(1) != current:
      return False
    current = m.group(2)
  return example["answer"] == f"{entity} is a {current}."


@pytest.mark.parametrize("seed", range(30))
def test_answer_follows_and_steps_are_a_shortest_chain(seed):
  ex = prosqa.generate_example(seed)
  assert set(ex) == {"question", "steps", "answer", "idx_to_symbol", "edges", "root", "target",
                     "neg_target", "entity"}
  pairs, sentences, entity, a, b = parse_question(ex["question"])
  assert entity == ex["entity"] and entity in prosqa.ENTITIES
  assert answer_follows(ex)
  assert steps_chain(ex)
  answer = ex["answer"][len(entity) + len(" is a "):-1]
  assert 3 <= len(ex["steps"]) == hops(pairs, entity, answer) <= 6
  reach = closure(pairs)
  assert all(n not in reach[n] for n in reach)                 # acyclic
  assert len(set(sentences)) == len(sentences) == len(ex["edges"])
  sinks = {n for n in reach if not reach[n]}
  assert {a, b} <= sinks                                       # both options are sinks
  # The graph keys say what the text says.
  sym = ex["idx_to_symbol"]
  assert len(sym) == len(set(sym)) == 22 and set(reach) == set(sym)
  assert {(sym[u], sym[v]) for u, v in ex["edges"]} == set(pairs)
  assert (sym[ex["root"]], sym[ex["target"]]) == (entity, answer)
  assert {sym[ex["target"]], sym[ex["neg_target"]]} == {a, b}
  sources = {n for n in reach} - {v for _, v in pairs}
  assert sources == {s for s in sym if s in prosqa.ENTITIES} and len(sources) == 2
  assert all(s in prosqa.CONCEPTS for s in sym if s not in sources)
  assert any(sym[ex["neg_target"]] in reach[s] for s in sources - {entity})


def test_published_wording_and_shuffled_facts():
  ex = prosqa.generate_example(1)
  assert re.search(r" Is [A-Z][a-z]+ a [a-z]+ or [a-z]+\?$", ex["question"])
  firsts, orders, depths = set(), set(), set()
  for seed in range(60):
    ex = prosqa.generate_example(seed)
    _, sentences, _, a, _ = parse_question(ex["question"])
    firsts.add(sentences.index(ex["steps"][0]))
    orders.add(ex["answer"].endswith(f" {a}."))
    depths.add(len(ex["steps"]))
  assert len(firsts) > 10 and orders == {True, False} and depths == {3, 4, 5, 6}


def test_determinism_per_seed():
  assert prosqa.generate_example(5) == prosqa.generate_example(5)
  assert prosqa.generate_example((1, 2)) == prosqa.generate_example((1, 2))
  assert len({prosqa.generate_example(s)["question"] for s in range(20)}) == 20


def test_other_sizes_and_the_published_words():
  for seed in range(10):
    ex = prosqa.generate_example(seed, num_concepts=10, num_entities=3, depth_min=2,
                                 depth_max=4, num_words=38)
    assert answer_follows(ex) and steps_chain(ex) and 2 <= len(ex["steps"]) <= 4
    assert len(ex["idx_to_symbol"]) == 13
    assert set(ex["idx_to_symbol"][3:]) <= set(prosqa.CONCEPTS[:38])


def test_concept_words():
  assert len(prosqa.CONCEPTS) == len(set(prosqa.CONCEPTS)) >= 100
  assert all(re.fullmatch(r"[a-z]+pus", w) for w in prosqa.CONCEPTS)
  assert prosqa.CONCEPTS[:3] == ("bompus", "boompus", "brimpus")


@pytest.mark.parametrize("kwargs,match", [
    (dict(num_concepts=6), "num_concepts"),          # not more than depth_max
    (dict(num_concepts=30, num_words=20), "num_concepts"),
    (dict(num_entities=1), "num_entities"),
    (dict(depth_min=0), "depth_min"),
    (dict(depth_min=4, depth_max=3), "depth_max"),
    (dict(extra_parent_p=1.0), "extra_parent_p"),
    (dict(num_words=500), "num_words"),
])
def test_bad_knobs_raise(kwargs, match):
  with pytest.raises(ValueError, match=match):
    prosqa.generate_example(0, **kwargs)
  with pytest.raises(ValueError, match=match):
    prosqa.ProsQASource(4, **kwargs)


def test_response_text_is_the_gsm8k_aug_response():
  ex = prosqa.generate_example(2)
  text = prosqa.response_text(ex)
  assert text == "\n".join(ex["steps"]) + "\n### " + ex["answer"]
  assert text == sft.gsm8k_aug_response(ex) == sft.gsm8k_aug_response(prosqa.sft_record(ex))


def test_word_tokenizer_round_trip():
  tok = prosqa.tokenizer()
  assert tok is prosqa.tokenizer() and tok.vocab_size == 4 + len(prosqa.vocabulary())
  for seed in range(10):
    ex = prosqa.generate_example(seed)
    for text in (ex["question"], prosqa.response_text(ex)):
      ids = tok.encode(text)
      assert tok.decode(ids) == text and NEWLINE_ID not in ids[:1]
  for rec in PUBLIC_RECORDS:
    assert tok.decode(tok.encode(rec["question"])) == rec["question"]


def test_tokenize_example_layout():
  tok = prosqa.tokenizer()
  ex = prosqa.generate_example(3)
  out = prosqa.tokenize_example(ex)
  ids, tgt, cf = out["input_ids"], out["target_ids"], out["control_flow"]
  assert ids.dtype == tgt.dtype == cf.dtype == np.int32
  n_prompt = 1 + len(tok.encode(ex["question"])) + 1            # <bos> question "\n"
  response = tok.encode(prosqa.response_text(ex)) + [EOS_ID]
  assert ids[0] == BOS_ID and ids[n_prompt - 1] == NEWLINE_ID and ids[-1] == EOS_ID
  assert len(ids) == n_prompt + len(response)
  assert tok.decode(ids) == ex["question"] + "\n" + prosqa.response_text(ex)
  np.testing.assert_array_equal(tgt[:n_prompt - 1], -100)
  np.testing.assert_array_equal(tgt[n_prompt - 1:-1], response)
  assert tgt[-1] == -100
  np.testing.assert_array_equal(cf, [1] * n_prompt + [2] * len(response))
  rec = prosqa.tokenize_example(ex, recurrent_prompt=True)
  np.testing.assert_array_equal(rec["control_flow"], [1] + [2] * (len(ids) - 1))
  np.testing.assert_array_equal(rec["input_ids"], ids)


def test_score_response():
  ex = prosqa.generate_example(4)
  gold = prosqa.response_text(ex)
  both = dict(answer_correct=True, path_valid=True)
  assert prosqa.score_response(ex, gold) == both
  assert prosqa.score_response(ex, gold + "\n") == both
  neg = ex["idx_to_symbol"][ex["neg_target"]]
  wrong = gold.rsplit("\n", 1)[0] + f"\n### {ex['entity']} is a {neg}."
  assert prosqa.score_response(ex, wrong) == dict(answer_correct=False, path_valid=True)
  # "Every c1 is a c3." chains on but is no fact (c3 lies at distance 3, not 2).
  c1, c3 = ex["steps"][1].split()[1], ex["steps"][2].split()[-1][:-1]
  steps = [ex["steps"][0], f"Every {c1} is a {c3}."] + ex["steps"][3:]
  bad = "\n".join(steps + [f"### {ex['answer']}"])
  assert prosqa.score_response(ex, bad) == dict(answer_correct=True, path_valid=False)
  skipped = "\n".join(ex["steps"][1:] + [f"### {ex['answer']}"])   # skips the entity's fact
  assert not prosqa.score_response(ex, skipped)["path_valid"]
  assert prosqa.score_response(ex, "") == dict(answer_correct=False, path_valid=False)
  assert prosqa.score_response(ex, f"### {ex['answer']}") == dict(answer_correct=True,
                                                                    path_valid=False)


def test_source_is_random_access_and_pure():
  src = prosqa.ProsQASource(5, base_seed=7, num_concepts=10, depth_min=2, depth_max=4)
  assert len(src) == 5 and "base_seed=7" in repr(src) and "num_concepts" in repr(src)
  want = prosqa.tokenize_example(prosqa.generate_example(
      (7, 3), num_concepts=10, depth_min=2, depth_max=4))
  for key in want:
    np.testing.assert_array_equal(src[3][key], want[key])
  with pytest.raises(IndexError, match=r"allowed 0\.\.4"):
    src[5]
  rec = prosqa.ProsQASource(2, recurrent_prompt=True)
  assert rec[0]["control_flow"][1] == 2
  with pytest.raises(ValueError, match="num_examples"):
    prosqa.ProsQASource(0)


def test_read_prosqa_public_layout(tmp_path):
  path = tmp_path / "prosqa_valid.json"
  path.write_text(json.dumps(PUBLIC_RECORDS, indent=2))
  records = prosqa.read_prosqa(str(path))
  assert records == PUBLIC_RECORDS
  jsonl = tmp_path / "prosqa.jsonl"
  jsonl.write_text("".join(json.dumps(r) + "\n" for r in PUBLIC_RECORDS))
  assert prosqa.read_prosqa(str(jsonl)) == PUBLIC_RECORDS
  for rec in records:
    assert answer_follows(rec) and steps_chain(rec)
    assert prosqa.score_response(rec, prosqa.response_text(rec)) == dict(answer_correct=True,
                                                                         path_valid=True)
    prosqa.tokenize_example(rec)
  bad = tmp_path / "bad.json"
  bad.write_text(json.dumps([{"question": "x"}]))
  with pytest.raises(ValueError, match="record 0"):
    prosqa.read_prosqa(str(bad))


def test_read_prosqa_missing_file_says_where_to_get_it(tmp_path):
  with pytest.raises(FileNotFoundError, match="prosqa_train.json not found at .*coconut"):
    prosqa.read_prosqa(str(tmp_path / "prosqa_train.json"))


def test_write_sft_jsonl_is_deterministic_and_readable(tmp_path):
  a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
  prosqa.write_sft_jsonl(str(a), 4, seed=3, num_concepts=10, depth_min=2, depth_max=4)
  prosqa.write_sft_jsonl(str(b), 4, seed=3, num_concepts=10, depth_min=2, depth_max=4)
  assert a.read_text() == b.read_text()
  recs = sft.read_jsonl(str(a))
  exs = [prosqa.generate_example((3, i), num_concepts=10, depth_min=2, depth_max=4)
         for i in range(4)]
  assert recs == [prosqa.sft_record(ex) for ex in exs]
  assert all(sft.detect_format(r) == "gsm8k_aug" for r in recs)
  assert prosqa.read_prosqa(str(a)) == recs
  with pytest.raises(ValueError, match="num_examples"):
    prosqa.write_sft_jsonl(str(tmp_path / "c.jsonl"), 0, seed=0)
