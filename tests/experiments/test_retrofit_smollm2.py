"""experiments/retrofit_smollm2.py: each task's arms are its config's variants; the ProsQA
data are the from-scratch graph size, held out from training, and fit the config's seq_len;
the lenient score reads which of the two concepts is named last; accuracies carry their
standard error."""

import json
import math

import pytest

from t2mlr_jax.data import prosqa

from _util import load_file


@pytest.fixture(scope="module")
def script():
  return load_file("experiments", "retrofit_smollm2.py")


def test_each_tasks_trained_arms_are_its_configs_variants(script):
  for name, task in script.TASKS.items():
    assert task.arms[0] == "zero_shot", name
    for arm, variant in task.variants.items():
      config = script._config(task, variant, "EXPORT", "train.jsonl", "eval.jsonl", 7)
      assert config.model.init_from == "EXPORT" and config.data.path == "train.jsonl"
      assert (config.train.num_steps, config.train.eval_every) == (7, 7)
      want = "none" if arm.startswith("transformer") else "t2mlr"
      assert config.model.recurrence.type == want, (name, arm)
  pro = {arm: script._config(script.TASKS["prosqa"], v, "E", "t", "e", 7)
         for arm, v in script.TASKS["prosqa"].variants.items()}
  # the two arms differ in the recurrence alone
  a, b = (pro[arm].to_dict() for arm in ("t2mlr", "transformer"))
  a["model"]["recurrence"].pop("type"), b["model"]["recurrence"].pop("type")
  a.pop("name"), b.pop("name")
  assert a == b


def test_prosqa_data_are_held_out_deterministic_and_of_the_from_scratch_size(script, tmp_path):
  task = script.TASKS["prosqa"]
  train, held = script.ensure_data(task, str(tmp_path), "t2mlr", 24, 8)
  again = tmp_path / "again.jsonl"
  task.write_data(str(again), 24, script.TRAIN_SEED, "transformer")
  assert again.read_text() == open(train).read()        # both arms read the same records
  records = [json.loads(line) for line in open(train)]
  assert len(records) == 24 and len({r["question"] for r in records}) == 24
  for r in records:
    assert set(r) == {"question", "steps", "answer"}
    assert 2 <= len(r["steps"]) <= 4
    assert prosqa.score_response(r, "\n".join(r["steps"] + [f"### {r['answer']}"])) == {
        "answer_correct": True, "path_valid": True}
  # a training set that contains a held-out question is refused
  with open(train, "a") as f:
    f.write(open(held).readline())
  with pytest.raises(SystemExit, match="1 held-out prompts also occur in the training data"):
    script.ensure_data(task, str(tmp_path), "t2mlr", 24, 8)


def test_the_lenient_score_is_the_concept_named_last(script):
  record = {"question": "Tom is a wumpus. Every wumpus is a zumpus. Is Tom a yumpus or zumpus?",
            "answer": "Tom is a zumpus."}
  assert script.last_named(record, "Tom is a wumpus, so Tom is a zumpus.")
  assert not script.last_named(record, "It is not a zumpus; Tom is a yumpus.")
  assert not script.last_named(record, "I cannot tell.")
  assert not script.last_named(record, "Tom is a zumpuses.")     # whole words only
  with pytest.raises(ValueError, match="does not end 'Is X a A or B\\?'"):
    script.last_named({"question": "Tom is a wumpus.", "answer": "Tom is a wumpus."}, "x")


def test_accuracies_carry_their_standard_error(script):
  assert script.standard_error(0.5, 200) == round(math.sqrt(0.25 / 200), 4) == 0.0354
  assert script.standard_error(1.0, 200) == 0.0
  assert math.isnan(script.standard_error(0.0, 0))
