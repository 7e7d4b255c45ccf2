"""Answer extraction and scoring for the math benchmarks (GSM8K-Aug, GSM8K, MATH500).

The T2MLR paper scores GSM8K-Aug by the text after the last `####`/`###` marker (else
the last line); beside it we report lm-evaluation-harness's two GSM8K extractions
(strict `#### N`, flexible "last number") and `\\boxed{}` extraction for MATH500
(docs/experiments.md#tasks). All of that is string processing, so this module is pure
Python (no jax, no numpy) and can score generations produced anywhere.

Conventions, and where they come from:

* `extract_gsm8k` — GSM8K-Aug's rule. A marker is a run of three or more '#', so `####`
  is one marker, never `###` + `#`. The answer is the first non-empty line of
  the text after the last marker **[ours: the first line, so that text the
  model appends after its answer line does not spoil the match]**, else the
  last non-empty line of the whole text; commas, `$` and trailing '.' removed.
* `extract_strict` / `extract_flexible` — lm-evaluation-harness
  `lm_eval/tasks/gsm8k/gsm8k.yaml` filter_list: strict-match is
  `regex_pattern: "#### (\\-?[0-9\\.\\,]+)"` with the default `group_select=0`
  (the FIRST match; `lm_eval/filters/extraction.py` RegexFilter), then
  `take_first`; flexible-extract is `(-?[$0-9.,]{2,})|(-?[0-9]+)` with
  `group_select: -1` (the LAST match, its non-empty group). Both are then
  normalised here by `_clean_number` (commas, `$`, trailing '.'), which is what
  lm-eval's exact_match `regexes_to_ignore` ("," "\\$" "\\.$") removes too.
  As in lm-eval, flexible takes the last match even when it is punctuation only
  (e.g. "..."); that cleans to "" and is reported as None.
* `gsm8k_match` — **[ours]** compares by `answers_equal`: numerically (both
  parse as decimals, |a − b| ≤ 1e-6, so "18.00" == "18") else by normalised
  string. lm-eval itself compares strings (case-insensitive), so "18.00" vs
  "18" would count as wrong there; that difference is deliberate (brief).
* `last_boxed` — hendrycks MATH `last_boxed_only_string` semantics (the last
  `\\boxed`, brace-matched, `\\fbox` too, and the `\\boxed 5` form read up to
  '$' or end of line), except that the last of `\\boxed`/`\\fbox` wins whichever
  it is, escaped braces `\\{ \\}` are not counted, and an unbalanced last box
  gives None.
* `normalize_math` — the `strip_string` of hendrycks MATH as shipped in
  lm-eval `lm_eval/tasks/hendrycks_math/utils.py`, step by step (see the
  function), made total (hendrycks's version raises on e.g. a trailing
  `\\sqrt` and then falls back to raw comparison; here those cases are simply
  left unchanged), plus **[ours]**: a plain '%' is removed as well as `\\%`, and
  a trailing '.' is removed.
* `math_match` — hendrycks `is_equiv` (equal normalised strings) on the last
  boxed answer of the prediction and of the gold (or the gold as given when it
  has no box), plus **[ours]** a numeric fallback: both plain numbers (commas
  only in thousands positions) within 1e-6.
  A prediction without a box scores False (MATH500 is scored by `\\boxed{}` extraction).
"""

from __future__ import annotations

import re

__all__ = [
  "extract_gsm8k",
  "extract_strict",
  "extract_flexible",
  "normalize_number",
  "answers_equal",
  "gsm8k_match",
  "last_boxed",
  "normalize_math",
  "math_match",
]

_MARKER_RE = re.compile(r"#{3,}")
_STRICT_RE = re.compile(r"#### (\-?[0-9\.\,]+)")
_FLEXIBLE_RE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")
_DECIMAL_RE = re.compile(r"-?(?:\d+(?:\.\d*)?|\.\d+)")
_NUM_TOLERANCE = 1e-6


# --- GSM8K ---------------------------------------------------------------------------

def _clean_number(s: str) -> str | None:
  """Strip, drop commas and '$', drop trailing '.'; None when nothing is left."""
  s = s.strip().replace(",", "").replace("$", "").strip()
  s = s.rstrip(".").strip()
  return s or None


def extract_gsm8k(text: str) -> str | None:
  """The GSM8K-Aug answer: after the last `###`/`####`, else the last line.

  "steps\\n#### 1,234." -> "1234"; "x ### 7 ### 8" -> "8"; "a\\nb = 5\\n" -> "b = 5"
  (no marker: the whole last non-empty line). None when nothing is left.
  """
  markers = list(_MARKER_RE.finditer(text))
  if markers:
    tail = text[markers[-1].end():]
    lines = [ln for ln in tail.splitlines() if ln.strip()]
    return _clean_number(lines[0]) if lines else None
  lines = [ln for ln in text.splitlines() if ln.strip()]
  return _clean_number(lines[-1]) if lines else None


def extract_strict(text: str) -> str | None:
  """lm-eval GSM8K strict-match: the FIRST `#### N` number, cleaned; None if absent."""
  m = _STRICT_RE.search(text)
  return _clean_number(m.group(1)) if m else None


def extract_flexible(text: str) -> str | None:
  """lm-eval GSM8K flexible-extract: the LAST number-like match, cleaned; None if absent."""
  matches = _FLEXIBLE_RE.findall(text)
  if not matches:
    return None
  last = next(g for g in matches[-1] if g)
  return _clean_number(last)


def normalize_number(s: str) -> str:
  """Canonical text of a numeric answer: "$+1,234.50." -> "1234.5", "18.00" -> "18".

  Removes '$', commas, all whitespace, trailing '.', a leading '+'; gives a bare
  leading '.' a zero (".5" -> "0.5"); drops trailing fractional zeros of a
  decimal; "-0" -> "0". Negatives are kept. Non-numbers come back with only the
  removals applied (so they can still be compared as strings).
  """
  s = re.sub(r"\s+", "", s).replace("$", "").replace(",", "")
  s = s.rstrip(".")
  if s.startswith("+"):
    s = s[1:]
  if not _DECIMAL_RE.fullmatch(s):
    return s
  neg = s.startswith("-")
  body = s[1:] if neg else s
  if body.startswith("."):
    body = "0" + body
  if "." in body:
    body = body.rstrip("0").rstrip(".")
  body = body.lstrip("0") or "0"
  if body.startswith("."):
    body = "0" + body
  if body == "0":
    neg = False
  return ("-" if neg else "") + body


def answers_equal(a: str | None, b: str | None) -> bool:
  """Numeric answers within 1e-6 are equal; otherwise compare `normalize_number` text."""
  if a is None or b is None:
    return False
  na, nb = normalize_number(a), normalize_number(b)
  if not na or not nb:
    return False
  if _DECIMAL_RE.fullmatch(na) and _DECIMAL_RE.fullmatch(nb):
    return abs(float(na) - float(nb)) <= _NUM_TOLERANCE
  return na == nb


def gsm8k_match(prediction_text: str, gold_answer: str) -> dict[str, bool]:
  """Score one generation against a GSM8K(-Aug) gold answer three ways.

  `gold_answer` is the GSM8K-Aug `answer` field (a number) or a full GSM8K
  solution ending in `#### N` (the gold is then `extract_gsm8k` of it).
  Returns {"spec": ..., "strict": ..., "flexible": ...}.
  """
  if "###" in gold_answer:
    gold = extract_gsm8k(gold_answer)
  else:
    gold = _clean_number(gold_answer)
  return {
    "spec": answers_equal(extract_gsm8k(prediction_text), gold),
    "strict": answers_equal(extract_strict(prediction_text), gold),
    "flexible": answers_equal(extract_flexible(prediction_text), gold),
  }


# --- MATH ----------------------------------------------------------------------------

_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")


def _is_escaped(text: str, i: int) -> bool:
  """True when text[i] is preceded by an odd number of backslashes."""
  n = 0
  j = i - 1
  while j >= 0 and text[j] == "\\":
    n += 1
    j -= 1
  return n % 2 == 1


def last_boxed(text: str) -> str | None:
  """Content of the last `\\boxed{...}` / `\\fbox{...}`, braces matched; else None.

  `\\boxed{\\frac{1}{2}}` -> `\\frac{1}{2}`. The brace-less form `\\boxed 5$`
  gives "5" (up to '$' or end of line). An unbalanced last box gives None.
  """
  boxes = list(_BOX_RE.finditer(text))
  if not boxes:
    return None
  i = boxes[-1].end()
  while i < len(text) and text[i] in " \t":
    i += 1
  if i >= len(text):
    return None
  if text[i] != "{":
    rest = re.split(r"[$\n]", text[i:], maxsplit=1)[0].strip()
    return rest or None
  depth = 0
  start = i + 1
  for j in range(i, len(text)):
    c = text[j]
    if c in "{}" and _is_escaped(text, j):
      continue
    if c == "{":
      depth += 1
    elif c == "}":
      depth -= 1
      if depth == 0:
        return text[start:j]
  return None


def _fix_fracs(s: str) -> str:
  """`\\frac12` -> `\\frac{1}{2}`, `\\frac1b` -> `\\frac{1}{b}`, `\\frac1{72}` -> ditto.

  As hendrycks: only one-character arguments are braced.
  """
  parts = s.split("\\frac")
  out = parts[0]
  for part in parts[1:]:
    out += "\\frac"
    if not part or part[0] == "{" or len(part) < 2:
      out += part
      continue
    a, b, rest = part[0], part[1], part[2:]
    if b != "{":
      out += "{" + a + "}{" + b + "}" + rest
    else:
      out += "{" + a + "}" + b + rest
  return out


def _fix_sqrt(s: str) -> str:
  """`\\sqrt2` -> `\\sqrt{2}` (one character argument, as hendrycks)."""
  parts = s.split("\\sqrt")
  out = parts[0]
  for part in parts[1:]:
    if part and part[0] != "{":
      out += "\\sqrt{" + part[0] + "}" + part[1:]
    else:
      out += "\\sqrt" + part
  return out


def _fix_a_slash_b(s: str) -> str:
  """`3/4` -> `\\frac{3}{4}` when both sides are plain integers."""
  m = re.fullmatch(r"(-?\d+)/(\d+)", s)
  if not m or s != f"{int(m.group(1))}/{int(m.group(2))}":
    return s
  return "\\frac{" + m.group(1) + "}{" + m.group(2) + "}"


def normalize_math(s: str) -> str:
  """Hendrycks MATH `strip_string`, in its order (lm-eval hendrycks_math/utils.py):

  1. drop newlines; drop `\\!`; `\\\\` -> `\\`;
  2. `tfrac`/`dfrac` -> `frac`; drop `\\left`, `\\right`;
  3. drop `^{\\circ}`, `^\\circ` (degrees); drop `\\$`;
  4. units: cut everything from the first `\\text{ ` (a text group opening with
     a space, as in `10\\text{ cm}`) on;
  5. drop `\\%` and **[ours]** '%';
  6. leading zero: " ." -> " 0.", "{." -> "{0.", a leading '.' gets a '0';
  7. `k = 5` -> `5`: a single '=' with at most two characters before it;
  8. `\\sqrt2` -> `\\sqrt{2}`; drop spaces; `\\frac12` -> `\\frac{1}{2}`;
  9. "0.5" -> `\\frac{1}{2}`; `a/b` (integers) -> `\\frac{a}{b}`;
  10. **[ours]** a trailing '.' is removed.
  """
  s = s.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
  s = s.replace("tfrac", "frac").replace("dfrac", "frac")
  s = s.replace("\\left", "").replace("\\right", "")
  s = s.replace("^{\\circ}", "").replace("^\\circ", "")
  s = s.replace("\\$", "")
  if "\\text{ " in s:
    s = s.split("\\text{ ")[0]
  s = s.replace("\\%", "").replace("%", "")
  s = s.replace(" .", " 0.").replace("{.", "{0.")
  if not s:
    return s
  if s[0] == ".":
    s = "0" + s
  sides = s.split("=")
  if len(sides) == 2 and len(sides[0]) <= 2:
    s = sides[1]
  s = _fix_sqrt(s)
  s = s.replace(" ", "")
  s = _fix_fracs(s)
  if s == "0.5":
    s = "\\frac{1}{2}"
  s = _fix_a_slash_b(s)
  if len(s) > 1 and s.endswith(".") and not _is_escaped(s, len(s) - 1):
    s = s[:-1]
  return s


def math_match(prediction_text: str, gold: str) -> bool:
  """MATH/MATH500 correctness: last boxed answer of the prediction vs the gold.

  `gold` is either a full solution containing `\\boxed{...}` (its last box is
  the answer) or the bare answer. Equal when the `normalize_math` forms are
  equal, or **[ours]** when both are plain numbers (thousands commas allowed)
  within 1e-6, so "18.0" matches "18" and "1,000" matches "1000".
  """
  pred = last_boxed(prediction_text)
  if pred is None:
    return False
  gold_ans = last_boxed(gold) if _BOX_RE.search(gold) else gold
  if gold_ans is None:
    return False
  np_, ng = normalize_math(pred), normalize_math(gold_ans)
  if np_ == ng:
    return True
  xp, xg = _math_number(np_), _math_number(ng)
  return xp is not None and xg is not None and abs(xp - xg) <= _NUM_TOLERANCE


_THOUSANDS_RE = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?")


def _math_number(s: str) -> float | None:
  """A plain decimal ("18.0", "-.5") or one with thousands commas ("1,000"); else None.

  Commas are only accepted in thousands positions, so "1,2" (a list of two
  answers) is not read as 12.
  """
  if _THOUSANDS_RE.fullmatch(s):
    s = s.replace(",", "")
  return float(s) if _DECIMAL_RE.fullmatch(s) else None
