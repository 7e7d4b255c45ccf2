"""ProsQA scoring by generation: the model writes its chain and `### answer` greedily under
the exact recurrence (decoding), and each completion is scored as the release scores it:
the answer line names the right concept (`answer_acc`), and the chain is made of the
question's facts leading from the entity to it (`path_valid_acc`). Teacher-forced exact
match is stricter: another valid chain to the right answer counts here, not there."""

from __future__ import annotations

from collections import defaultdict
from typing import Sequence

from t2mlr_jax.data import prosqa
from t2mlr_jax.eval.downstream import generate_texts
from t2mlr_jax.eval.sequence import SequenceMetrics


class SizedMetrics(SequenceMetrics):
  """SequenceMetrics plus `seq_acc_by_concepts`: the eval rows come in blocks of `per_size`
  examples, one block per graph size of `sizes`, in order (filler rows only at the end)."""

  def __init__(self, sizes: Sequence[int], per_size: int):
    super().__init__()
    self.sizes, self.per_size, self.seen = list(sizes), int(per_size), 0
    self.right, self.total = defaultdict(int), defaultdict(int)

  def update_rows(self, right, supervised, rows, batch) -> None:
    """Count each row under its block's graph size."""
    for b in rows:
      n = self.sizes[self.seen // self.per_size]
      self.seen += 1
      self.total[n] += 1
      self.right[n] += int(right[b].all())

  def result(self) -> dict:
    """SequenceMetrics' result and `seq_acc_by_concepts` ({size: exact match})."""
    out = super().result()
    out["seq_acc_by_concepts"] = {str(n): self.right[n] / self.total[n] for n in self.sizes
                                  if self.total[n]}
    return out


def generation_scores(params, cfg, tokenizer, examples: Sequence[dict], *, prompt_cf: int = 1,
                      batch_size: int = 16, max_new_tokens: int = 48) -> dict:
  """{answer_acc, path_valid_acc, num_examples} of greedy completions of each example's
  question (prompt: <bos> question newline, control flow `prompt_cf`)."""
  prompts = [ex["question"] + "\n" for ex in examples]
  texts = generate_texts(params, cfg, tokenizer, prompts, max_new_tokens=max_new_tokens,
                         batch_size=batch_size, prompt_control_flow=prompt_cf, add_bos=True)
  right = valid = 0
  for ex, text in zip(examples, texts):
    score = prosqa.score_response(ex, text)
    right += int(score["answer_correct"])
    valid += int(score["path_valid"])
  n = max(len(examples), 1)
  return {"answer_acc": right / n, "path_valid_acc": valid / n, "num_examples": len(examples)}
