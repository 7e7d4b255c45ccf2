"""One loader for every source (t2mlr_jax/convert/loading.py): the kind of model a path
holds, the tokenizer it came with (beside the weights, a training run's prepared data or
its config's directories, or the one given), `step` for training runs only, and errors
naming the argument that gave the path and every place looked at."""

import json
import os

import jax
import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from t2mlr_jax import checkpoint, init_params
from t2mlr_jax.checkpoint import Checkpointer
from t2mlr_jax.convert import loading
from t2mlr_jax.data import lm
from t2mlr_jax.data.byte_tokenizer import ByteTokenizer
from t2mlr_jax.data.s5_group import S5Tokenizer
from t2mlr_jax.train import tasks

from _util import config_file, tiny_cfg
from test_checkpoint import data_iterator, train_state


def _tokenizer_dir(path):
  """A directory holding a tiny word-level tokenizer.json."""
  os.makedirs(path, exist_ok=True)
  tok = Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1, "b": 2}, unk_token="[UNK]"))
  tok.pre_tokenizer = pre_tokenizers.Whitespace()
  tok.save(os.path.join(path, "tokenizer.json"))
  return str(path)


def _workdir(path, config):
  """A training workdir with one step of a tiny model that saved `config`."""
  cfg = tiny_cfg()
  ckpt = Checkpointer(str(path), async_save=False)
  ckpt.save(1, train_state(cfg, 1), data_iterator(), config, cfg)
  ckpt.close()
  return str(path)


@pytest.fixture(scope="module")
def export(tmp_path_factory):
  """A parameter export of a tiny model, no tokenizer beside it."""
  cfg = tiny_cfg()
  params = init_params(cfg, jax.random.PRNGKey(0))
  path = str(tmp_path_factory.mktemp("loading") / "export")
  checkpoint.export(cfg, params, path)
  return path, cfg, params


def test_the_loader_names_the_model_kinds_it_takes(tmp_path):
  """chat, evaluate, lm_eval and convert open models through `loading`; its errors name
  the argument that gave the path."""
  from t2mlr_jax.convert import loading
  (tmp_path / "empty").mkdir()
  for path, what in [(tmp_path / "empty", "is a directory with no checkpoints/"),
                     (tmp_path / "nope", "does not exist")]:
    with pytest.raises(ValueError, match=f"--model='{path}' {what}") as e:
      loading.load_model_and_tokenizer(str(path), field="--model")
    assert "allowed a GGUF file (*.gguf), a Hugging Face directory" in str(e.value)


def test_kinds_are_told_apart_and_only_a_run_takes_a_step(export, tmp_path):
  path, cfg, params = export
  loaded_cfg, loaded = loading.load_model(path)
  assert loaded_cfg == cfg
  jax.tree.map(np.testing.assert_array_equal, loaded, params)
  with pytest.raises(ValueError, match=r"step=1 is invalid for .*export' \(export\): allowed "
                                       "only with a training workdir"):
    loading.load_model(path, step=1)
  (tmp_path / "hf").mkdir()
  (tmp_path / "hf" / "config.json").write_text("{}")
  with pytest.raises(ValueError, match=r"step=2 is invalid for .*hf' \(hf\)"):
    loading.load_model(str(tmp_path / "hf"), step=2)
  (tmp_path / "a_file").write_text("not a model\n")
  with pytest.raises(ValueError, match=r"path='.*a_file' is a file, not a model: allowed a "
                                       "GGUF file"):
    loading.load_model(str(tmp_path / "a_file"))
  with pytest.raises(ValueError, match=r"path='.*none.gguf' does not exist"):
    loading.load_model_and_tokenizer(str(tmp_path / "none.gguf"))


def test_the_tokenizer_beside_the_weights_or_the_one_given(export, tmp_path):
  """An export without tokenizer.json is refused naming where it looked and the flag to
  pass; `tokenizer=` is taken before the weights are read, and refused without
  tokenizer.json; tokenizer files beside the weights are found."""
  path, cfg, _ = export
  with pytest.raises(ValueError, match=rf"no tokenizer found for '{path}': looked at "
                                       rf"{path}/tokenizer.json; pass tokenizer=DIR"):
    loading.find_tokenizer(path)
  with pytest.raises(ValueError, match="; pass --tokenizer=DIR"):
    loading.load_model_and_tokenizer(path, field="--model")
  with pytest.raises(ValueError, match=rf"--tokenizer='{tmp_path}' is invalid: allowed a "
                                       "directory with tokenizer.json"):
    loading.load_model_and_tokenizer(path, tokenizer=str(tmp_path), field="--model")
  words = _tokenizer_dir(tmp_path / "words")
  loaded_cfg, _, found = loading.load_model_and_tokenizer(path, tokenizer=words)
  assert loaded_cfg == cfg and found.source == words and not found.documents_start_with_bos
  assert found.tokenizer.encode("a b") == [1, 2]
  beside = str(tmp_path / "beside")
  checkpoint.export(cfg, init_params(cfg, jax.random.PRNGKey(0)), beside)
  _tokenizer_dir(beside)
  assert loading.find_tokenizer(beside).source == beside


def test_a_training_run_finds_the_tokenizer_its_config_names(tmp_path):
  """An lm run's prepared data with a byte tokenizer (its documents start with BOS);
  otherwise `data.tokenizer` or `model.init_from` of the saved config, each named when
  nothing is there."""
  data = tmp_path / "data"
  data.mkdir()
  (data / lm.MANIFEST).write_text(json.dumps(
      {"format": lm.FORMAT, "tokenizer": {"kind": "byte", "bos_id": 1}}))
  run = _workdir(tmp_path / "lm_run", {"data": {"task": "lm", "path": str(data)}})
  found = loading.find_tokenizer(run)
  assert isinstance(found.tokenizer, ByteTokenizer)
  assert found.source == "byte" and found.documents_start_with_bos
  words = _tokenizer_dir(tmp_path / "words")
  run = _workdir(tmp_path / "tuned", {"data": {"task": "s5_retrieval", "tokenizer": None},
                                      "model": {"init_from": words}})
  assert loading.find_tokenizer(run, step=1).source == words
  run = _workdir(tmp_path / "bare", {"data": {"task": "s5_retrieval",
                                              "tokenizer": str(tmp_path / "gone")}})
  with pytest.raises(ValueError, match=r"looked at .*bare/tokenizer.json, .*gone/tokenizer"
                                       r"\.json \(data\.tokenizer\); pass tokenizer=DIR"):
    loading.find_tokenizer(run)


def test_a_run_of_a_task_with_its_own_vocabulary_reads_its_tokens(tmp_path):
  """A workdir of the default job (S5, no tokenizer.json anywhere) gets its task's own
  vocabulary when the caller passes `own` (as chat does), which encodes and decodes an S5
  prompt; without it, the one-line reason; an lm task has no vocabulary of its own."""
  run = _workdir(tmp_path / "s5", config_file("s5_retrieval", "tiny").to_dict())
  with pytest.raises(ValueError, match=r"no tokenizer found for .*; pass --tokenizer=DIR"):
    loading.load_model_and_tokenizer(run, field="--model")
  _, _, found = loading.load_model_and_tokenizer(run, field="--model",
                                                 own=tasks.own_tokenizer)
  tok = found.tokenizer
  assert isinstance(tok, S5Tokenizer) and found.source == "data.task=s5_retrieval"
  prompt = "ab|cd|<A_21345><A_12354>|"
  assert tok.decode(tok.encode(prompt)) == prompt
  assert (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 2, 3)
  assert tasks.own_tokenizer({"data": {"task": "lm"}}) is None


def test_a_downstream_evaluation_of_a_run_with_its_own_vocabulary(tmp_path):
  """`evaluate --task` passes the task's own vocabulary as chat does: a variable-assignment
  run (byte vocabulary, no tokenizer.json) is scored on GSM8K-format records, its
  completions decoded by the byte tokenizer; without `own`, the one-line reason."""
  from t2mlr_jax.eval import jobs
  config = config_file("variable_assignment", "tiny").to_dict()
  cfg = tiny_cfg(vocab_size=259)                    # the byte vocabulary
  ckpt = Checkpointer(str(tmp_path / "va"), async_save=False)
  ckpt.save(1, train_state(cfg, 1), data_iterator(), config, cfg)
  ckpt.close()
  run = str(tmp_path / "va")
  data = tmp_path / "gsm8k.jsonl"
  data.write_text("".join(json.dumps({"question": q, "answer": a}) + "\n"
                          for q, a in [("x=3\nx=___", "3"), ("y=1\ny=___", "1")]))
  with pytest.raises(ValueError, match=r"no tokenizer found for .*; pass --tokenizer=DIR"):
    jobs.evaluate_downstream("gsm8k", str(data), run, max_new_tokens=4)
  summary, rows = jobs.evaluate_downstream("gsm8k", str(data), run, max_new_tokens=4,
                                           batch_size=2, own=tasks.own_tokenizer)
  assert summary["num_examples"] == 2 and len(rows) == 2
  tok = ByteTokenizer()
  for row in rows:      # decoded by the byte tokenizer: its text re-encodes to byte ids
    assert all(3 <= i < 259 for i in tok.encode(row["completion"]))
