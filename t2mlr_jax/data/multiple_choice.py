"""Zero-shot multiple-choice data (ARC, HellaSwag, PIQA) in lm-evaluation-harness's conventions.

The T2MLR paper compares T2MLR and the baseline transformer on zero-shot multiple
choice the way lm-evaluation-harness does (docs/experiments.md#tasks): each choice is
scored by sum log p(" " + choice | context); acc takes the argmax, acc_norm the argmax
of that score divided by the choice's character length. Reproducing the
published numbers needs lm-eval's exact contexts and choice strings, so the
readers below rebuild them from the datasets' local JSONL files. Pure Python
(no jax, no numpy): records in, `MCExample`s out.

Conventions, verified against EleutherAI/lm-evaluation-harness:

* ARC (`lm_eval/tasks/arc/arc_easy.yaml`, arc_challenge includes it):
  doc_to_text "Question: {{question}}\\nAnswer:", doc_to_choice
  `choices.text`, doc_to_target `choices.label.index(answerKey)`. Read here from
  the AI2 release form {"question": {"stem", "choices": [{"text", "label"}]},
  "answerKey"} and the HF `ai2_arc` form {"question": str, "choices": {"text":
  [...], "label": [...]}, "answerKey"}. A key that is not among the labels but
  is a letter A-E or a digit 1-5 is read as a position (A = 1 = first), the
  old lm-eval rule (num_to_letter) for the few ARC items labelled 1-4.
* HellaSwag (`lm_eval/tasks/hellaswag/utils.py`): query =
  preprocess(activity_label + ": " + ctx_a + " " + ctx_b.capitalize()),
  choices = [preprocess(e) for e in endings], where preprocess strips, turns
  " [title]" into ". ", deletes any "[...]" (non-greedy) and replaces "  " by
  " " once. Both the HF `hellaswag` rows and the original rowanz JSONL carry
  ctx_a/ctx_b; a record with only `ctx` uses it as given (its ctx_b part is
  then not re-capitalised), and the "activity_label: " prefix is added only
  when the record has one. Note `str.capitalize()` also lower-cases the rest
  of ctx_b — lm-eval does that, so do we.
* PIQA (`lm_eval/tasks/piqa/piqa.yaml`): doc_to_text "Question: {{goal}}\\nAnswer:",
  choices [sol1, sol2], target `label`. The original release keeps the labels
  in a separate `*-labels.lst` file, one 0/1 per line: pass `labels_path`.
* acc_norm (`lm_eval/api/task.py`, multiple_choice process_results):
  `completion_len = [float(len(i)) for i in choices]` over doc_to_choice's
  strings — the character length of the choice WITHOUT the " " target
  delimiter (Python `len`, characters not bytes), and `np.argmax` (first index
  on ties). `score_choices` does the same; the scored continuation itself is
  " " + choice (`continuation`).
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any, Callable

from t2mlr_jax.data.text import jsonl_records

__all__ = [
  "MCExample",
  "continuation",
  "scoring_requests",
  "hellaswag_preprocess",
  "read_arc",
  "read_hellaswag",
  "read_piqa",
  "read_task",
  "score_choices",
  "TASK_READERS",
]

PathLike = str | os.PathLike

_LETTERS = "ABCDE"
_DIGITS = "12345"


@dataclasses.dataclass(frozen=True)
class MCExample:
  """One multiple-choice item: the context, the choice strings, the gold index."""
  context: str
  choices: list[str]
  label: int


def continuation(choice: str) -> str:
  """The string scored after the context: lm-eval's target_delimiter " " + choice."""
  return " " + choice


def scoring_requests(example: MCExample) -> list[tuple[str, str]]:
  """(context, continuation) pairs, one per choice, in choice order."""
  return [(example.context, continuation(c)) for c in example.choices]


# --- JSONL plumbing ------------------------------------------------------------------

_records = jsonl_records     # (line number, record) per non-blank line


def _field(rec: dict[str, Any], name: str, types: type | tuple[type, ...],
           where: str) -> Any:
  """rec[name], checked to be of `types`; ValueError naming the field otherwise."""
  if name not in rec:
    raise ValueError(f"{where}: missing field {name!r}")
  value = rec[name]
  if not isinstance(value, types):
    names = " or ".join(t.__name__ for t in (types if isinstance(types, tuple) else (types,)))
    raise ValueError(
      f"{where}: field {name!r} must be {names}, got {type(value).__name__}")
  return value


def _str_list(value: Any, name: str, where: str) -> list[str]:
  if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
    raise ValueError(f"{where}: field {name!r} must be a non-empty list of strings")
  return list(value)


def _int_label(value: Any, n: int, name: str, where: str) -> int:
  """An int (or a string of digits) in [0, n); ValueError naming the allowed values."""
  if isinstance(value, bool):
    value = None
  if isinstance(value, str) and re.fullmatch(r"\s*\d+\s*", value):
    value = int(value)
  if not isinstance(value, int) or not 0 <= value < n:
    raise ValueError(
      f"{where}: field {name!r} must be an integer in 0..{n - 1}, got {value!r}")
  return value


# --- ARC -----------------------------------------------------------------------------

def _arc_label(key: Any, labels: list[str], where: str) -> int:
  if not isinstance(key, str) or key.strip() == "":
    raise ValueError(
      f"{where}: field 'answerKey' must be one of A-E or 1-5, got {key!r}")
  key = key.strip()
  if key in labels:
    return labels.index(key)
  if key in _LETTERS:
    pos = _LETTERS.index(key)
  elif key in _DIGITS:
    pos = _DIGITS.index(key)
  else:
    raise ValueError(
      f"{where}: field 'answerKey' must be one of A-E or 1-5 (or one of the "
      f"choice labels {labels}), got {key!r}")
  if pos >= len(labels):
    raise ValueError(
      f"{where}: field 'answerKey' {key!r} points past the {len(labels)} choices "
      f"(labels {labels})")
  return pos


def _arc_example(rec: dict[str, Any], where: str) -> MCExample:
  q = _field(rec, "question", (str, dict), where)
  if isinstance(q, dict):  # AI2 release: {"stem", "choices": [{"text", "label"}]}
    stem = _field(q, "stem", str, where + " (question)")
    raw = _field(q, "choices", list, where + " (question)")
    texts, labels = [], []
    for i, ch in enumerate(raw):
      if not isinstance(ch, dict):
        raise ValueError(
          f"{where}: question.choices[{i}] must be an object with 'text' and 'label'")
      texts.append(_field(ch, "text", str, f"{where} (question.choices[{i}])"))
      labels.append(str(_field(ch, "label", (str, int), f"{where} (question.choices[{i}])")))
  else:  # HF ai2_arc: {"question": str, "choices": {"text": [...], "label": [...]}}
    stem = q
    ch = _field(rec, "choices", dict, where)
    texts = _str_list(ch.get("text"), "choices.text", where)
    labels = [str(x) for x in (ch.get("label") or [])]
    if len(labels) != len(texts):
      raise ValueError(
        f"{where}: 'choices.label' has {len(labels)} entries, 'choices.text' {len(texts)}")
  if not texts:
    raise ValueError(f"{where}: field 'choices' is empty")
  label = _arc_label(rec.get("answerKey"), labels, where)
  return MCExample(f"Question: {stem}\nAnswer:", texts, label)


def read_arc(path: PathLike) -> list[MCExample]:
  """ARC-Easy / ARC-Challenge JSONL (AI2 release or HF form) -> lm-eval examples."""
  return [_arc_example(rec, f"{path}:{ln}") for ln, rec in _records(path)]


# --- HellaSwag -----------------------------------------------------------------------

def hellaswag_preprocess(text: str) -> str:
  """lm-eval's HellaSwag cleanup (WikiHow artefacts): see the module docstring."""
  text = text.strip()
  text = text.replace(" [title]", ". ")
  text = re.sub(r"\[.*?\]", "", text)
  return text.replace("  ", " ")


def _hellaswag_example(rec: dict[str, Any], where: str) -> MCExample:
  if "ctx_a" in rec or "ctx_b" in rec:
    ctx = (_field(rec, "ctx_a", str, where) + " "
           + _field(rec, "ctx_b", str, where).capitalize())
  elif "ctx" in rec:
    ctx = _field(rec, "ctx", str, where)
  else:
    raise ValueError(f"{where}: missing field 'ctx_a'/'ctx_b' (or 'ctx')")
  if "activity_label" in rec:
    ctx = _field(rec, "activity_label", str, where) + ": " + ctx
  endings = _str_list(rec.get("endings"), "endings", where)
  if "label" not in rec or rec["label"] in ("", None):
    raise ValueError(f"{where}: missing field 'label' (HellaSwag's test split is unlabelled)")
  label = _int_label(rec["label"], len(endings), "label", where)
  return MCExample(hellaswag_preprocess(ctx),
                   [hellaswag_preprocess(e) for e in endings], label)


def read_hellaswag(path: PathLike) -> list[MCExample]:
  """HellaSwag JSONL (HF rows or the original release) -> lm-eval examples."""
  return [_hellaswag_example(rec, f"{path}:{ln}") for ln, rec in _records(path)]


# --- PIQA ----------------------------------------------------------------------------

def _read_labels(labels_path: PathLike) -> list[tuple[int, int]]:
  """(line number, 0/1) per line of a PIQA *-labels.lst; blank lines only at the end."""
  with open(labels_path, encoding="utf-8") as f:
    lines = f.read().splitlines()
  while lines and not lines[-1].strip():
    lines.pop()
  out = []
  for ln, line in enumerate(lines, start=1):
    out.append((ln, _int_label(line.strip(), 2, "label", f"{labels_path}:{ln}")))
  return out


def read_piqa(path: PathLike, labels_path: PathLike | None = None) -> list[MCExample]:
  """PIQA JSONL -> lm-eval examples; labels in the records or in `labels_path`.

  With `labels_path`, line i of the labels file labels the i-th record; the
  counts must agree, and a record's own `label`, if any, must agree with it.
  """
  records = list(_records(path))
  file_labels = _read_labels(labels_path) if labels_path is not None else None
  if file_labels is not None and len(file_labels) != len(records):
    raise ValueError(
      f"{labels_path}: {len(file_labels)} labels for {len(records)} records in {path}")
  out = []
  for i, (ln, rec) in enumerate(records):
    where = f"{path}:{ln}"
    goal = _field(rec, "goal", str, where)
    sols = [_field(rec, "sol1", str, where), _field(rec, "sol2", str, where)]
    own = None
    if "label" in rec:
      own = _int_label(rec["label"], 2, "label", where)
    if file_labels is not None:
      label = file_labels[i][1]
      if own is not None and own != label:
        raise ValueError(
          f"{where}: field 'label' is {own} but {labels_path}:{file_labels[i][0]} says {label}")
    elif own is None:
      raise ValueError(f"{where}: missing field 'label' (pass labels_path for *-labels.lst)")
    else:
      label = own
    out.append(MCExample(f"Question: {goal}\nAnswer:", sols, label))
  return out


TASK_READERS: dict[str, Callable[..., list[MCExample]]] = {
  "arc_easy": read_arc,
  "arc_challenge": read_arc,
  "hellaswag": read_hellaswag,
  "piqa": read_piqa,
}


def read_task(task: str, path: PathLike, **kwargs: Any) -> list[MCExample]:
  """Dispatch on the lm-eval task name (arc_easy, arc_challenge, hellaswag, piqa)."""
  if task not in TASK_READERS:
    raise ValueError(f"task must be one of {sorted(TASK_READERS)}, got {task!r}")
  return TASK_READERS[task](path, **kwargs)


# --- scoring -------------------------------------------------------------------------

def score_choices(logliks: list[float], choices: list[str]) -> dict[str, int]:
  """lm-eval's acc / acc_norm predictions from per-choice log-likelihoods.

  `logliks[i]` = sum log p(" " + choices[i] | context). pred = argmax logliks;
  pred_norm = argmax logliks[i] / len(choices[i]) (characters, no leading
  space). Ties go to the first index, as np.argmax.
  """
  if len(logliks) != len(choices):
    raise ValueError(
      f"logliks has {len(logliks)} entries but choices has {len(choices)}")
  if not choices:
    raise ValueError("choices must be non-empty")
  for i, c in enumerate(choices):
    if len(c) == 0:
      raise ValueError(f"choices[{i}] is empty: acc_norm divides by its length")
  norm = [float(ll) / len(c) for ll, c in zip(logliks, choices)]
  pred = max(range(len(logliks)), key=lambda i: (float(logliks[i]), -i))
  pred_norm = max(range(len(norm)), key=lambda i: (norm[i], -i))
  return {"pred": pred, "pred_norm": pred_norm}
