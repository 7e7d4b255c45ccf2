"""The built-in verifiable rewards of RL (`rl.reward`; registry.Reward): each scores one
sampled completion against its example's gold response, 1.0 right and 0.0 wrong (HotpotQA:
the answer's F1). A user's file registers its own with `REWARDS.register(Reward(...))`.
"""

from __future__ import annotations

import re

from t2mlr_jax.eval import answers, hotpotqa
from t2mlr_jax.registry import REWARDS, Reward

_FINAL_MARKED = re.compile(r"^#{3,}\s*(.+?)\s*$")


def _words(text: str) -> list[str]:
  return text.split()


def exact(completion: str, record: dict) -> float:
  """The completion equals the gold response up to whitespace (Pathfinding: the shortest
  path is unique, so this is the release's `pathfinding` reward)."""
  return float(_words(completion) == _words(record["response"]))


def gsm8k(completion: str, record: dict) -> float:
  """The number after the completion's last `###`/`####` (GSM8K-Aug's and Variable
  Assignment's marker; without one, its last line: answers.extract_gsm8k, the GSM8K-Aug
  evaluation's rule) equals the gold response's."""
  return float(answers.gsm8k_match(completion, record["response"])["spec"])


def math(completion: str, record: dict) -> float:
  """The completion's last \\boxed{} answer equals the gold's (MATH's normalisation)."""
  gold = answers.last_boxed(record["response"]) or record["response"]
  return float(answers.math_match(completion, gold))


def _final_line(text: str):
  marked = [m.group(1) for line in text.splitlines()
            if (m := _FINAL_MARKED.match(line.strip()))]
  return _words(marked[-1].rstrip(".")) if marked else None


def prosqa(completion: str, record: dict) -> float:
  """The completion's last `###` line names the gold's entity and concept (ProsQA's
  answer accuracy; the reasoning lines before it are free)."""
  got = _final_line(completion)
  return float(got is not None and got == _final_line(record["response"]))


def hotpotqa_f1(completion: str, record: dict) -> float:
  """The official F1 of the completion's answer (after the last "Answer:", its first line)
  against the gold response's."""
  return hotpotqa.f1(hotpotqa.extract_answer(completion),
                     hotpotqa.extract_answer(record["response"]))[0]


for _name, _fn in (("exact", exact), ("gsm8k", gsm8k), ("math", math), ("prosqa", prosqa),
                   ("hotpotqa", hotpotqa_f1)):
  REWARDS.register(Reward(name=_name, fn=_fn, source=__name__))
