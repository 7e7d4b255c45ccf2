"""ProsQA scoring by generation: the model writes its chain and `### answer` greedily under
the exact recurrence (decoding), and each completion is scored as the release scores it:
the answer line names the right concept (`answer_acc`), and the chain is made of the
question's facts leading from the entity to it (`path_valid_acc`). Teacher-forced exact
match is stricter: another valid chain to the right answer counts here, not there."""

from __future__ import annotations

from typing import Sequence

from t2mlr_jax.data import prosqa
from t2mlr_jax.eval.downstream import generate_texts


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
