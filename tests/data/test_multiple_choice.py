"""Zero-shot multiple-choice readers (ARC, HellaSwag, PIQA) and acc / acc_norm scoring."""

import json

import pytest

from t2mlr_jax.data import multiple_choice as mc


def _write_jsonl(path, records):
  lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
  path.write_text("\n".join(lines) + "\n", encoding="utf-8")
  return path


# --- ARC -----------------------------------------------------------------------------

ARC_AI2 = {
  "id": "Mercury_7175875",
  "question": {
    "stem": "An astronomer observes that a planet rotates faster after a meteorite "
            "impact. Which is the most likely effect of this increase in rotation?",
    "choices": [
      {"text": "Planetary density will decrease.", "label": "A"},
      {"text": "Planetary years will become longer.", "label": "B"},
      {"text": "Planetary days will become shorter.", "label": "C"},
      {"text": "Planetary gravity will become stronger.", "label": "D"},
    ],
  },
  "answerKey": "C",
}
ARC_HF = {
  "id": "x1",
  "question": "Which gas do plants take in?",
  "choices": {"text": ["oxygen", "carbon dioxide", "helium"], "label": ["1", "2", "3"]},
  "answerKey": "2",
}


def test_arc_both_forms(tmp_path):
  path = _write_jsonl(tmp_path / "arc.jsonl", [ARC_AI2, "", ARC_HF])  # blank line skipped
  ex = mc.read_arc(path)
  assert len(ex) == 2
  assert ex[0].context == ("Question: " + ARC_AI2["question"]["stem"] + "\nAnswer:")
  assert ex[0].choices[2] == "Planetary days will become shorter."
  assert ex[0].label == 2
  assert ex[1] == mc.MCExample("Question: Which gas do plants take in?\nAnswer:",
                               ["oxygen", "carbon dioxide", "helium"], 1)


@pytest.mark.parametrize("labels, key, want", [
  (["A", "B", "C", "D"], "D", 3),
  (["1", "2", "3", "4"], "4", 3),
  (["A", "B", "C", "D"], "2", 1),        # digit key, letter labels: a position
  (["1", "2", "3", "4", "5"], "E", 4),   # letter key, digit labels: a position
])
def test_arc_answer_keys(tmp_path, labels, key, want):
  rec = {"question": "q?", "choices": {"text": [f"c{i}" for i in range(len(labels))],
                                       "label": labels}, "answerKey": key}
  assert mc.read_arc(_write_jsonl(tmp_path / "a.jsonl", [rec]))[0].label == want


@pytest.mark.parametrize("bad, match", [
  ({**ARC_HF, "answerKey": "Z"}, r"answerKey.*A-E or 1-5"),
  ({**ARC_HF, "answerKey": "4"}, r"answerKey.*past the 3 choices"),
  ({**ARC_HF, "answerKey": ""}, r"answerKey"),
  ({k: v for k, v in ARC_HF.items() if k != "answerKey"}, r"answerKey"),
  ({k: v for k, v in ARC_HF.items() if k != "question"}, r"missing field 'question'"),
  ({**ARC_HF, "question": 5}, r"field 'question' must be str or dict"),
  ({**ARC_HF, "choices": {"text": ["a", "b"], "label": ["A"]}}, r"choices.label"),
  ({**ARC_HF, "choices": {"text": [], "label": []}}, r"choices.text"),
  ({**ARC_AI2, "question": {"stem": "s", "choices": [{"label": "A"}]}},
   r"missing field 'text'"),
])
def test_arc_malformed_names_file_and_line(tmp_path, bad, match):
  path = _write_jsonl(tmp_path / "arc.jsonl", [ARC_HF, "", bad])
  with pytest.raises(ValueError, match=match) as err:
    mc.read_arc(path)
  assert f"{path}:3" in str(err.value)


def test_invalid_json_names_file_and_line(tmp_path):
  path = _write_jsonl(tmp_path / "arc.jsonl", [ARC_HF, '{"question": "q", '])
  with pytest.raises(ValueError, match=r"arc.jsonl:2: invalid JSON"):
    mc.read_arc(path)
  path = _write_jsonl(tmp_path / "list.jsonl", ["[1, 2]"])
  with pytest.raises(ValueError, match=r"list.jsonl:1: expected a JSON object"):
    mc.read_arc(path)


# --- HellaSwag -----------------------------------------------------------------------

HS_ORIG = {
  "ind": 24, "activity_label": "Roof shingle removal",
  "ctx_a": "A man is sitting on a roof.", "ctx_b": "he",
  "ctx": "A man is sitting on a roof. he",
  "endings": ["is using wrap to wrap a pair of skis.",
              "is ripping level tiles off.",
              "is holding a rubik's cube.",
              "starts pulling up roofing on a roof."],
  "label": 3, "split": "val",
}
HS_WIKIHOW = {
  "activity_label": "Home and Garden",
  "ctx_a": "[header] How to clean a sink [title] Gather supplies.",
  "ctx_b": "[step] get A sponge",
  "endings": ["  Wet the   sponge [substeps] first. ", "Leave."],
  "label": "0",   # HF rows carry the label as a string
}


def test_hellaswag_preprocess_matches_lm_eval():
  # " [title]" -> ". " then "  " -> " ": "a [title] b" -> "a.  b" -> "a. b"
  assert mc.hellaswag_preprocess(" a [title] b ") == "a. b"
  assert mc.hellaswag_preprocess("x [header] y") == "x y"
  assert mc.hellaswag_preprocess("keep [a] and [b] out") == "keep and out"


def test_hellaswag_original_and_hf(tmp_path):
  ex = mc.read_hellaswag(_write_jsonl(tmp_path / "hs.jsonl", [HS_ORIG, HS_WIKIHOW]))
  assert ex[0].context == "Roof shingle removal: A man is sitting on a roof. He"
  assert ex[0].choices == HS_ORIG["endings"]
  assert ex[0].label == 3
  # activity_label prefix; "[step] get A sponge".capitalize() leaves "[" first and
  # lower-cases the rest ("A" -> "a"); " [title]" -> ". "; [..] removed; one pass
  # of "  " -> " ".
  assert ex[1].context == ("Home and Garden: How to clean a sink. Gather supplies. "
                           "get a sponge")
  assert ex[1].choices == ["Wet the  sponge first.", "Leave."]
  assert ex[1].label == 0


def test_hellaswag_ctx_only_record(tmp_path):
  rec = {"ctx": "A cat sits. it", "endings": ["purrs.", "barks."], "label": 0}
  ex = mc.read_hellaswag(_write_jsonl(tmp_path / "hs.jsonl", [rec]))[0]
  assert ex == mc.MCExample("A cat sits. it", ["purrs.", "barks."], 0)


@pytest.mark.parametrize("bad, match", [
  ({**HS_ORIG, "label": ""}, r"missing field 'label'"),
  ({**HS_ORIG, "label": 4}, r"'label' must be an integer in 0\.\.3, got 4"),
  ({**HS_ORIG, "label": "two"}, r"'label' must be an integer in 0\.\.3"),
  ({**HS_ORIG, "endings": "one"}, r"'endings' must be a non-empty list"),
  ({k: v for k, v in HS_ORIG.items() if k not in ("ctx_a", "ctx_b", "ctx")},
   r"missing field 'ctx_a'"),
  ({k: v for k, v in HS_ORIG.items() if k != "ctx_b"}, r"missing field 'ctx_b'"),
])
def test_hellaswag_malformed(tmp_path, bad, match):
  path = _write_jsonl(tmp_path / "hs.jsonl", [bad])
  with pytest.raises(ValueError, match=match) as err:
    mc.read_hellaswag(path)
  assert f"{path}:1" in str(err.value)


# --- PIQA ----------------------------------------------------------------------------

PIQA = [
  {"goal": "How do I ready a guinea pig cage for its new occupants?",
   "sol1": "Provide the guinea pig with a cage full of a few inches of bedding.",
   "sol2": "Provide the guinea pig with a cage full of a few inches of jeans."},
  {"goal": "dresser", "sol1": "replace drawer with bobby pin", "sol2": "finish, woodgrain"},
]


def test_piqa_labels_file(tmp_path):
  path = _write_jsonl(tmp_path / "valid.jsonl", PIQA)
  labels = tmp_path / "valid-labels.lst"
  labels.write_text("0\n1\n\n")                     # trailing blank line allowed
  ex = mc.read_piqa(path, labels_path=labels)
  assert ex[0].context == f"Question: {PIQA[0]['goal']}\nAnswer:"
  assert ex[0].choices == [PIQA[0]["sol1"], PIQA[0]["sol2"]]
  assert [e.label for e in ex] == [0, 1]


def test_piqa_inline_labels_and_dispatch(tmp_path):
  recs = [{**PIQA[0], "label": 1}, {**PIQA[1], "label": "0"}]
  path = _write_jsonl(tmp_path / "p.jsonl", recs)
  assert [e.label for e in mc.read_task("piqa", path)] == [1, 0]
  with pytest.raises(ValueError, match=r"task must be one of"):
    mc.read_task("winogrande", path)


def test_piqa_label_errors(tmp_path):
  path = _write_jsonl(tmp_path / "p.jsonl", PIQA)
  with pytest.raises(ValueError, match=r"p.jsonl:1: missing field 'label'.*labels_path"):
    mc.read_piqa(path)
  short = tmp_path / "short.lst"
  short.write_text("1\n")
  with pytest.raises(ValueError, match=r"1 labels for 2 records"):
    mc.read_piqa(path, labels_path=short)
  bad = tmp_path / "bad.lst"
  bad.write_text("0\n2\n")
  with pytest.raises(ValueError, match=r"bad.lst:2: field 'label' must be an integer in 0\.\.1"):
    mc.read_piqa(path, labels_path=bad)
  clash = _write_jsonl(tmp_path / "c.jsonl", [{**PIQA[0], "label": 1}, PIQA[1]])
  ok = tmp_path / "ok.lst"
  ok.write_text("0\n1\n")
  with pytest.raises(ValueError, match=r"c.jsonl:1: field 'label' is 1 but .*ok.lst:1 says 0"):
    mc.read_piqa(clash, labels_path=ok)
  nosol = _write_jsonl(tmp_path / "n.jsonl", [{"goal": "g", "sol1": "a"}])
  with pytest.raises(ValueError, match=r"n.jsonl:1: missing field 'sol2'"):
    mc.read_piqa(nosol)


# --- scoring -------------------------------------------------------------------------

def test_scoring_requests_prepend_space():
  ex = mc.MCExample("Question: q\nAnswer:", ["yes", "no"], 0)
  assert mc.scoring_requests(ex) == [("Question: q\nAnswer:", " yes"),
                                     ("Question: q\nAnswer:", " no")]


def test_score_choices_acc_and_acc_norm_differ():
  # Sum log-lik favours the short choice; per character the long one wins:
  # -4/2 = -2.0 vs -6/12 = -0.5.
  choices = ["ok", "a long reply"]
  assert len(choices[1]) == 12
  out = mc.score_choices([-4.0, -6.0], choices)
  assert out == {"pred": 0, "pred_norm": 1}


def test_score_choices_agree_and_ties_pick_first():
  assert mc.score_choices([-1.0, -3.0, -2.0], ["aa", "bb", "cc"]) == {"pred": 0, "pred_norm": 0}
  assert mc.score_choices([-2.0, -2.0], ["xy", "zw"]) == {"pred": 0, "pred_norm": 0}
  assert mc.score_choices([-9.0, -3.0, -3.0], ["a", "bbb", "ccc"]) == {"pred": 1, "pred_norm": 1}


def test_score_choices_normalises_by_characters_not_bytes_or_space():
  # "é" is 2 UTF-8 bytes but 1 character. Per character: -3/3 = -1 vs -2.2/2 = -1.1,
  # so choice 0 wins; per byte (-3/6 vs -2.2/2) or with the " " counted
  # (-3/4 = -0.75 vs -2.2/3 = -0.733) choice 1 would.
  out = mc.score_choices([-3.0, -2.2], ["ééé", "ab"])
  assert out["pred_norm"] == 0
  assert out["pred"] == 1


def test_score_choices_errors():
  with pytest.raises(ValueError, match=r"logliks has 1 entries but choices has 2"):
    mc.score_choices([-1.0], ["a", "b"])
  with pytest.raises(ValueError, match=r"non-empty"):
    mc.score_choices([], [])
  with pytest.raises(ValueError, match=r"choices\[1\] is empty"):
    mc.score_choices([-1.0, -2.0], ["a", ""])
