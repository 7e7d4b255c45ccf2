"""HotpotQA answer scoring: the official answer metrics (EM, token F1, precision, recall)
and the answer a model's completion gives.

The metrics are those of the official `hotpot_evaluate_v1.py` (Yang et al. 2018), written
here anew; pure Python (no jax, no numpy), like `answers`:

* `normalize_answer` — in the official order: lower case; remove every character of
  `string.punctuation`; replace the whole-word articles `\\b(a|an|the)\\b` by a space;
  collapse whitespace (split and rejoin with single spaces).
* `exact_match` — the normalized strings are equal (so "" vs "" is a match).
* `f1` — (f1, precision, recall) over the normalized whitespace tokens, common tokens
  counted as a multiset. Official special case: when either normalized side is one of
  "yes", "no", "noanswer" and the two differ, all three are 0 (so "yes it is" vs "yes"
  scores 0, not 2/3). No common token (an empty side included) also gives 0, so "" vs ""
  is EM true but F1 0, as in the official script.
* `HotpotQAMetrics` — means over the examples scored, as the official script averages.
* `extract_answer` — **[ours]** how a completion of `data.hotpotqa.format_prompt`'s prompt
  (which ends in "Answer:") is read; see the function.
"""

from __future__ import annotations

import re
import string
from typing import Optional

__all__ = [
  "normalize_answer",
  "exact_match",
  "f1",
  "extract_answer",
  "HotpotQAMetrics",
  "ANSWER_MARKER",
]

ANSWER_MARKER = "Answer:"
_PUNCTUATION = str.maketrans("", "", string.punctuation)
_ARTICLES_RE = re.compile(r"\b(a|an|the)\b")
_SPECIAL = ("yes", "no", "noanswer")


def normalize_answer(s: str) -> str:
  """Official normalization: lower → remove punctuation → remove articles → collapse spaces."""
  s = s.lower()
  s = s.translate(_PUNCTUATION)
  s = _ARTICLES_RE.sub(" ", s)
  return " ".join(s.split())


def exact_match(prediction: str, gold: str) -> bool:
  """True when the normalized prediction equals the normalized gold answer."""
  return normalize_answer(prediction) == normalize_answer(gold)


def _common_count(pred_tokens: list[str], gold_tokens: list[str]) -> int:
  """Size of the multiset intersection: each gold token can be matched once."""
  left: dict[str, int] = {}
  for t in gold_tokens:
    left[t] = left.get(t, 0) + 1
  same = 0
  for t in pred_tokens:
    if left.get(t, 0) > 0:
      left[t] -= 1
      same += 1
  return same


def f1(prediction: str, gold: str) -> tuple[float, float, float]:
  """Official token-level (f1, precision, recall); 0s for a yes/no/noanswer mismatch."""
  pred, ref = normalize_answer(prediction), normalize_answer(gold)
  if (pred in _SPECIAL or ref in _SPECIAL) and pred != ref:
    return 0.0, 0.0, 0.0
  pred_tokens, gold_tokens = pred.split(), ref.split()
  same = _common_count(pred_tokens, gold_tokens)
  if same == 0:
    return 0.0, 0.0, 0.0
  precision = same / len(pred_tokens)
  recall = same / len(gold_tokens)
  return 2 * precision * recall / (precision + recall), precision, recall


def extract_answer(generated_text: str, eos: Optional[str] = None) -> str:
  """The answer a completion gives: after the last "Answer:", its first non-empty line.

  In order: cut at the first `eos` string when given (decoded text may still hold
  it); if "Answer:" (case-sensitive) occurs, keep only what follows its last
  occurrence (a completion that reasons first, then answers); then take the first
  line that is not blank, stripped. "" when nothing is left. " Paris\\nQuestion: ..."
  -> "Paris"; "Both are.\\nAnswer: yes" -> "yes"; "\\n\\n  42 \\n" -> "42".
  """
  text = generated_text
  if eos:
    text = text.split(eos, 1)[0]
  if ANSWER_MARKER in text:
    text = text.rsplit(ANSWER_MARKER, 1)[1]
  for line in text.splitlines():
    if line.strip():
      return line.strip()
  return ""


class HotpotQAMetrics:
  """Running HotpotQA answer metrics: `update` per example, `result` for the means."""

  def __init__(self):
    self.n = 0
    self._sums = {"em": 0.0, "f1": 0.0, "precision": 0.0, "recall": 0.0}

  def update(self, prediction_text: str, gold: str) -> dict:
    """Score one predicted answer (already extracted, see `extract_answer`) against the
    gold; returns that example's {"em", "f1", "precision", "recall"}."""
    f, p, r = f1(prediction_text, gold)
    scores = {"em": float(exact_match(prediction_text, gold)), "f1": f, "precision": p,
              "recall": r}
    for k, v in scores.items():
      self._sums[k] += v
    self.n += 1
    return scores

  def result(self) -> dict:
    """{"em", "f1", "precision", "recall"}: means over the examples (0.0 when none),
    and "num_examples"."""
    n = max(self.n, 1)
    return {**{k: v / n for k, v in self._sums.items()}, "num_examples": self.n}
