"""HotpotQA loader and prompt: the public format on an invented four-record fixture,
its error messages, and the SFT JSONL read back by data.sft."""

from __future__ import annotations

import copy
import json
import os

import pytest

from t2mlr_jax.data import hotpotqa as H, sft

FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures",
                       "hotpotqa_small.json")


@pytest.fixture(scope="module")
def records():
  return H.read_hotpotqa(FIXTURE)


def _write(tmp_path, records, name="hotpot_dev_distractor_v1.json"):
  path = tmp_path / name
  path.write_text(json.dumps(records), encoding="utf-8")
  return str(path)


def test_fixture_loads(records):
  assert len(records) == 4
  assert [r["_id"][-1] for r in records] == ["1", "2", "3", "4"]
  assert {r["type"] for r in records} == {"bridge", "comparison"}
  assert records[2]["answer"] == "Élodie Brandt"


def test_limit(records):
  assert H.read_hotpotqa(FIXTURE, limit=2) == records[:2]
  assert H.read_hotpotqa(FIXTURE, limit=0) == []
  assert H.read_hotpotqa(FIXTURE, limit=10) == records
  with pytest.raises(ValueError, match="limit=-1"):
    H.read_hotpotqa(FIXTURE, limit=-1)


def test_prompt_text_exactly(records):
  r = records[3]
  assert H.format_prompt(r) == (
      "Title: The Lantern Keeper\nThe Lantern Keeper is a novel. It was released in 1988."
      "\n\nTitle: Grey Harbour\nGrey Harbour is a 1979 film directed by Oskar Lind."
      "\n\nQuestion: Which was released first, Grey Harbour or The Lantern Keeper?\nAnswer:")


def test_prompt_has_every_paragraph_in_order_and_ends_with_question(records):
  for r in records:
    prompt = H.format_prompt(r)
    at = 0
    for title, sentences in r["context"]:
      at = prompt.index(f"Title: {title}\n", at)
      for s in sentences:
        at = prompt.index(s, at) + len(s)
    assert prompt.endswith(f"\n\nQuestion: {r['question']}\nAnswer:")
    assert prompt.count("Title: ") == len(r["context"])
    # sentences keep the dataset's own spacing: no space added, none doubled
    assert "  " not in prompt and "\n " not in prompt


def test_supporting_sentences(records):
  assert H.supporting_sentences(records[0]) == [
      " It was invented by Hanna Ludvik in 1832.",
      "Ostrava Minor is the birthplace of Hanna Ludvik.",
      " The Velmar River flows through its centre."]
  assert H.supporting_sentences(records[1]) == [
      "The Quillon Lighthouse stands on a cliff in northern Norland.",
      "Tarn Point Light is a lighthouse on the east coast of Norland."]


def test_supporting_only_prompt_keeps_only_cited_paragraphs(records):
  r = records[0]
  prompt = H.format_prompt(r, supporting_only=True)
  assert prompt == (
      "Title: Brass kettle clock\nThe brass kettle clock is a water-driven timepiece. It was "
      "invented by Hanna Ludvik in 1832. Few examples survive."
      "\n\nTitle: Ostrava Minor\nOstrava Minor is the birthplace of Hanna Ludvik. The town "
      "has about 4,000 inhabitants. The Velmar River flows through its centre."
      f"\n\nQuestion: {r['question']}\nAnswer:")
  for s in H.supporting_sentences(r):
    assert s in prompt
  # context order, not supporting-fact order
  p2 = H.format_prompt(records[1], supporting_only=True)
  assert p2.index("Tarn Point Light") < p2.index("Quillon Lighthouse")
  assert "Marrow Bay" not in p2


@pytest.mark.parametrize("fact, match", [
  (["No Such Title", 0], "names a title not in its context"),
  (["Grey Harbour", 1], r"points past the paragraph's 1 sentences"),
  (["Grey Harbour", -1], "points past"),
])
def test_bad_supporting_fact_is_a_clear_error(records, fact, match):
  r = copy.deepcopy(records[3])
  r["supporting_facts"].append(fact)
  with pytest.raises(ValueError, match=match):
    H.supporting_sentences(r)
  with pytest.raises(ValueError, match=match):
    H.format_prompt(r, supporting_only=True)
  H.format_prompt(r)                                 # the full prompt does not need them


def test_missing_file_names_where_to_put_it(tmp_path):
  path = tmp_path / "hotpot_train_v1.1.json"
  with pytest.raises(FileNotFoundError) as e:
    H.read_hotpotqa(str(path))
  msg = str(e.value)
  assert msg == (f"hotpot_train_v1.1.json not found at {path}: download it from "
                 "hotpotqa.github.io and pass data.path")
  assert "\n" not in msg


@pytest.mark.parametrize("key", H.REQUIRED_KEYS)
def test_missing_key_names_key_and_index(tmp_path, records, key):
  bad = copy.deepcopy(records)
  del bad[2][key]
  path = _write(tmp_path, bad)
  with pytest.raises(ValueError, match=f"record 2 .*has no '{key}' key"):
    H.read_hotpotqa(path)
  assert len(H.read_hotpotqa(path, limit=2)) == 2      # only the kept records are checked


def test_malformed_files(tmp_path, records):
  path = tmp_path / "broken.json"
  path.write_text("[{", encoding="utf-8")
  with pytest.raises(ValueError, match="not valid JSON"):
    H.read_hotpotqa(str(path))
  with pytest.raises(ValueError, match="a JSON list"):
    H.read_hotpotqa(_write(tmp_path, {"data": records}))
  bad = copy.deepcopy(records)
  bad[1]["context"][0] = "just a string"
  with pytest.raises(ValueError, match=r"record 1 .*\[title, \[sentences\]\]"):
    H.read_hotpotqa(_write(tmp_path, bad))


def test_sft_record(records):
  r = records[1]
  assert H.sft_record(r) == {"prompt": H.format_prompt(r), "response": " yes",
                             "answer": "yes", "id": r["_id"]}
  assert H.sft_record(r, supporting_only=True)["prompt"] == H.format_prompt(
      r, supporting_only=True)


def test_sft_jsonl_reads_back_through_sft(tmp_path, records):
  path = str(tmp_path / "hotpot_sft.jsonl")
  assert H.write_sft_jsonl(records, path) == 4
  with open(path, "rb") as f:
    f.read().decode("ascii")                       # escaped: readable in any locale
  back = sft.read_jsonl(path)
  assert back == [H.sft_record(r) for r in records]
  for r, b in zip(records, back):
    want = (H.format_prompt(r), " " + r["answer"])
    assert sft.prompt_and_response(b, "prompt_response") == want
    assert sft.prompt_and_response(b) == want       # auto-detected as prompt_response
