"""The reasoning tasks as training tasks (train/tasks.py): Pathfinding and ProsQA train from
their tiny configs and evaluate (per backbone length, per graph size, by generation),
HotpotQA trains as SFT and is scored by the official EM/F1; their checks name the field."""

import json
import os

import numpy as np
import pytest

from t2mlr_jax import checkpoint
from t2mlr_jax.data import pathfinding, prosqa, tiny
from t2mlr_jax.eval import jobs, prosqa as prosqa_eval
from t2mlr_jax.eval.pathfinding import PathfindingMetrics
from t2mlr_jax.train import config as config_lib, loop, tasks
from t2mlr_jax.train.metrics import read_metrics

from _util import TESTS_DIR, config_file, prosqa_distractor_response


def _eval_record(workdir):
  return read_metrics(workdir, "eval")[-1]


def test_pathfinding_trains_and_scores_each_backbone_length(tmp_path):
  """configs/pathfinding.py:tiny trains; its evaluation gives exact match per backbone
  length (the gold path's `->` count), as `evaluate --workdir` does from the checkpoint."""
  wd = str(tmp_path / "pf")
  config = config_file("pathfinding", "tiny", **{"data.pf_eval_lengths": "3,5"})
  loop.train(config, wd, progress=False)
  logged = _eval_record(wd)
  assert set(logged["seq_acc_by_length"]) == {"3", "5"}
  assert 0.0 <= logged["seq_acc"] <= 1.0 and logged["num_examples"] == 8
  again = tasks.evaluate_checkpoint(wd)
  assert again["seq_acc_by_length"] == logged["seq_acc_by_length"]
  cfg, params = checkpoint.load(wd)[:2]
  assert cfg.vocab_size == 64 and params is not None


def test_pathfinding_metrics_count_per_path_length():
  """Rows are grouped by the `->` tokens of their gold path after the last `|`; a row is
  right when every supervised token is."""
  tok = pathfinding.TOKENIZER
  metrics = PathfindingMetrics(tok.token_to_id["->"], tok.token_to_id["|"])
  rows = []
  for i, n in enumerate((3, 3, 5)):
    ex = pathfinding.generate_example(i, path_min=n, path_max=n, lanes=1, extra_max=1,
                                      names="pool", random_walk=bool(i == 2))
    rows.append(pathfinding.tokenize_example(ex, tok))
  T = max(len(r["input_ids"]) for r in rows)
  targets = np.full((3, T), -100, np.int32)
  for b, r in enumerate(rows):
    targets[b, :len(r["target_ids"])] = r["target_ids"]
  assert metrics.path_lengths(targets).tolist() == [3, 3, 5]
  pred = np.where(targets >= 0, targets, 0)
  first = np.argmax(targets[1] >= 0)
  pred[1, first] = (pred[1, first] + 1) % tok.vocab_size     # row 1 wrong at one token
  metrics.update(pred, {"target_ids": targets})
  out = metrics.result()
  assert out["seq_acc_by_length"] == {"3": 0.5, "5": 1.0}
  assert out["seq_acc"] == pytest.approx(2 / 3)


def test_a_vocabulary_larger_than_the_model_is_named(tmp_path):
  """The graphs evaluated need more node names than model.vocab_size holds: one line naming
  the field and the vocabulary, before anything compiles."""
  config = config_file("pathfinding", "tiny", **{"data.pf_eval_lengths": "3,12"})
  with pytest.raises(ValueError, match=r"model\.vocab_size=64 is invalid: allowed >= \d+, "
                                       r"the vocabulary of data\.task=pathfinding"):
    loop.train(config, str(tmp_path / "wd"), progress=False)


def test_eval_lengths_too_long_for_the_model_are_named_before_the_first_step(tmp_path):
  """The evaluated graphs are built before training: lengths whose examples exceed
  model.max_seq_len are one error naming the field, and no step has been spent."""
  wd = tmp_path / "wd"
  config = config_file("pathfinding", "tiny", **{"data.pf_eval_lengths": "3,16",
                                                 "model.vocab_size": 256})
  with pytest.raises(ValueError, match=r"data\.pf_eval_lengths='3,16' is invalid: allowed "
                                       r"lengths whose examples fit model\.max_seq_len=128 "
                                       r"\(the longest needs \d+\)"):
    loop.train(config, str(wd), progress=False)
  assert not (wd / "metrics.jsonl").exists() or read_metrics(str(wd)) == []


def test_training_examples_respect_the_token_limit():
  config = config_file("pathfinding", "tiny")
  src = tasks.get_task(config).train_source(config, 64)
  assert max(len(src[i]["input_ids"]) for i in range(64)) <= config.data.pf_max_tokens
  assert tasks.get_task(config).max_train_len(config) == config.data.pf_max_tokens
  config = config_file("prosqa", "tiny", **{"data.prosqa_max_tokens": None})
  with pytest.raises(ValueError, match=r"data\.prosqa_max_tokens=None is invalid: allowed a "
                                       "token limit"):
    tasks.validate_data(config, tasks.get_task(config))


def test_prosqa_trains_and_scores_answers_it_generates(tmp_path):
  """configs/prosqa.py:tiny trains; the exact-mode evaluation adds the answers and chains
  the model writes itself, per graph size and over all."""
  wd = str(tmp_path / "prosqa")
  config = config_file("prosqa", "tiny", **{"data.prosqa_eval_concepts": "7,8"})
  loop.train(config, wd, progress=False)
  logged = _eval_record(wd)
  for key in ("seq_acc", "answer_acc", "path_valid_acc"):
    assert set(logged[f"{key}_by_concepts"]) == {"7", "8"}, key
  assert 0.0 <= logged["answer_acc"] <= 1.0 and logged["num_examples"] == 8


def test_generation_scores_read_what_the_model_writes(monkeypatch):
  """The prompts handed to decoding are the questions; a completion equal to the gold
  response scores 1 on both, one naming the distractor 0 on the answer."""
  examples = [prosqa.generate_example(i, num_concepts=8, depth_min=2, depth_max=3)
              for i in range(4)]
  seen = {}

  def fake(params, cfg, tokenizer, prompts, **kwargs):
    seen.update(prompts=prompts, kwargs=kwargs)
    return [prosqa.response_text(ex) for ex in examples[:3]] + [
        prosqa_distractor_response(examples[3])]
  monkeypatch.setattr(prosqa_eval, "generate_texts", fake)
  scores = prosqa_eval.generation_scores(None, None, prosqa.tokenizer(), examples, prompt_cf=1)
  assert seen["prompts"] == [ex["question"] + "\n" for ex in examples]
  assert seen["kwargs"]["add_bos"] and seen["kwargs"]["prompt_control_flow"] == 1
  assert scores == {"answer_acc": 0.75, "path_valid_acc": 1.0, "num_examples": 4}


@pytest.mark.slow       # 11 s: fine-tunes data/tiny's base model
def test_hotpotqa_trains_as_sft_and_is_scored_by_em_and_f1(tmp_path, monkeypatch):
  """configs/hotpotqa.py:tiny fine-tunes the tiny base on HotpotQA-layout records (every
  token recurrent, as the release); `evaluate --task=hotpotqa` reads the public JSON
  layout and scores the first line the model writes by the official EM and F1."""
  monkeypatch.chdir(tmp_path)
  tiny.make()
  config = config_file("hotpotqa", "tiny")
  config_lib.validate(config)
  src = tasks.get_task(config).train_source(config, 4)
  assert 2 in src[0]["control_flow"] and 1 not in set(src[0]["control_flow"].tolist()) - {0}
  loop.train(config, "wd", progress=False)
  summary, rows = jobs.evaluate_downstream(
      "hotpotqa", os.path.join(TESTS_DIR, "data", "fixtures", "hotpotqa_small.json"), "wd",
      max_new_tokens=8, batch_size=2, prompt_control_flow=2)
  assert summary["task"] == "hotpotqa" and summary["num_examples"] == len(rows) == 4
  assert {"em", "f1", "precision", "recall"} <= set(summary)
  with open(os.path.join(TESTS_DIR, "data", "fixtures", "hotpotqa_small.json")) as f:
    gold = [r["answer"] for r in json.load(f)]
  assert [r["gold"] for r in rows] == gold


def test_one_evaluation_pass_counts_each_graph_size_by_its_block():
  """ProsQA's eval rows come in blocks of eval_examples_per_length per size: one pass over
  all batches gives each size's exact match (filler rows at the end counted nowhere)."""
  metrics = prosqa_eval.SizedMetrics([7, 9], per_size=3)
  targets = np.full((4, 5), -100, np.int32)
  targets[:, 2] = 5
  first = {"target_ids": targets}
  pred = np.where(targets >= 0, targets, 0)
  pred[1, 2] = 6                                   # size 7: row 1 of 3 wrong
  metrics.update(pred, first)                      # rows 0-2: size 7, row 3: size 9
  second = {"target_ids": targets.copy()}
  second["target_ids"][2:] = -100                  # two filler rows
  metrics.update(np.where(second["target_ids"] >= 0, 5, 0), second)
  out = metrics.result()
  assert out["seq_acc_by_concepts"] == {"7": pytest.approx(2 / 3), "9": 1.0}
  assert out["num_examples"] == 6
