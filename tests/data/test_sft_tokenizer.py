"""HF tokenizers + chat templates without transformers at run time; SFT examples and packing."""

import json

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")

from t2mlr_jax.data import sft  # noqa: E402
from t2mlr_jax.data.tokenizer import load_tokenizer  # noqa: E402

from _hf_fixtures import gsm8k_aug_records, make_tokenizer_dir  # noqa: E402


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
  return make_tokenizer_dir(str(tmp_path_factory.mktemp("tok")))


def test_tokenizer_matches_transformers(tok_dir):
  ours = load_tokenizer(tok_dir)
  theirs = transformers.AutoTokenizer.from_pretrained(tok_dir)
  text = "how many is 3 + 4 ?\n<< 3 + 4 = 7 >>\n### 7"
  assert ours.encode(text) == theirs.encode(text, add_special_tokens=False)
  assert ours.eos_id == theirs.eos_token_id and ours.vocab_size == len(theirs)
  messages = [{"role": "user", "content": "what is 2 + 2 ?"}]
  assert ours.apply_chat_template(messages) == theirs.apply_chat_template(
      messages, tokenize=False, add_generation_prompt=True)
  assert ours.decode(ours.encode("the answer is 7")) == "the answer is 7"


def test_sft_example_masks(tok_dir):
  tok = load_tokenizer(tok_dir)
  record = gsm8k_aug_records(1)[0]
  prompt, response = sft.prompt_and_response(record)
  assert prompt == record["question"] + "\n\n"
  assert response == "\n".join(record["steps"]) + "\n### " + record["answer"]
  ex = sft.tokenize_record(record, tok)
  p, r = tok.encode(prompt), tok.encode(response) + [tok.eos_id]
  np.testing.assert_array_equal(ex["input_ids"], p + r)
  np.testing.assert_array_equal(ex["control_flow"], [1] * len(p) + [2] * len(r))
  supervised = np.nonzero(ex["target_ids"] != -100)[0]
  assert supervised[0] == len(p) - 1 and supervised[-1] == len(p) + len(r) - 2
  np.testing.assert_array_equal(ex["target_ids"][supervised], r)     # response + EOS only
  chat = sft.tokenize_record(record, tok, chat=True)
  assert tok.decode(chat["input_ids"], skip_special_tokens=False).startswith("<|im_start|>")


def test_packing(tok_dir):
  tok = load_tokenizer(tok_dir)
  long = {"question": "how many is 1 + 2 + 3 + 4 + 5 ?", "steps": ["<< 15 >>"], "answer": "15"}
  examples = [sft.tokenize_record(r, tok) for r in gsm8k_aug_records(7) + [long]]
  lengths = [len(e["input_ids"]) for e in examples]
  assert len(set(lengths)) > 1
  seq_len = max(lengths) * 2 + 1
  rows = sft.pack(examples, seq_len)
  assert len(rows) < len(examples)
  total = 0
  for row in rows:
    for s in range(row["segment_ids"].max() + 1):
      where = np.nonzero(row["segment_ids"] == s)[0]
      np.testing.assert_array_equal(row["positions"][where], np.arange(len(where)))
      total += len(where)
    pad = row["segment_ids"] < 0
    assert (row["control_flow"][pad] == 0).all() and (row["target_ids"][pad] == -100).all()
  assert total == sum(lengths)
  with pytest.raises(ValueError, match="seq_len"):
    sft.pack(examples, min(lengths) - 1)
  kept = sft.pack(examples, max(lengths) - 1, too_long="drop")
  assert sum(int((row["segment_ids"] >= 0).sum()) for row in kept) == sum(lengths) - max(lengths)


def test_jsonl_formats_and_errors(tmp_path, tok_dir):
  path = tmp_path / "d.jsonl"
  path.write_text("\n".join(json.dumps(r) for r in
                            [{"prompt": "what is 1 + 1 ?", "response": "2"},
                             *gsm8k_aug_records(2)]))
  src = sft.SFTSource(str(path), load_tokenizer(tok_dir), seq_len=64, packed=False)
  assert len(src) == 3
  bad = tmp_path / "bad.jsonl"
  bad.write_text('{"text": "x"}\n')
  with pytest.raises(ValueError, match="matches no format"):
    sft.SFTSource(str(bad), load_tokenizer(tok_dir), seq_len=64)
  broken = tmp_path / "broken.jsonl"
  broken.write_text('{"prompt": \n')
  with pytest.raises(ValueError, match="broken.jsonl:1"):
    sft.read_jsonl(str(broken))


def _prepare_tfds(data_dir: str, records: list[dict]) -> None:
  """A tiny GSM8K-Aug-shaped TFDS dataset, prepared locally in the ArrayRecord format."""
  import tensorflow_datasets as tfds

  class TinyGsm8kAug(tfds.core.GeneratorBasedBuilder):
    VERSION = tfds.core.Version("1.0.0")
    # a builder as a script defines it: tfds looks for a dotted module's files (this test's
    # is `data.test_sft_tokenizer`) through importlib_resources, which it does not install
    __module__ = "tiny_gsm8k_aug"

    def _info(self):
      return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
          "question": tfds.features.Text(), "answer": tfds.features.Text(),
          "steps": tfds.features.Sequence(tfds.features.Text())}))

    def _split_generators(self, dl_manager):
      return {"train": self._generate_examples()}

    def _generate_examples(self):
      yield from enumerate(records)

  TinyGsm8kAug(data_dir=data_dir, file_format="array_record").download_and_prepare()


def test_tfds_records_equal_the_jsonl_ones(tmp_path, tok_dir):
  records = gsm8k_aug_records(4, seed=3)
  data_dir = str(tmp_path / "tfds")
  _prepare_tfds(data_dir, records)
  read = sft.read_records("tfds:tiny_gsm8k_aug:train", data_dir)
  assert sorted(read, key=lambda r: r["question"]) == sorted(records, key=lambda r: r["question"])
  path = tmp_path / "d.jsonl"
  path.write_text("\n".join(json.dumps(r) for r in read))
  tok = load_tokenizer(tok_dir)
  from_tfds = sft.SFTSource("tfds:tiny_gsm8k_aug:train[:3]", tok, seq_len=128,
                            tfds_data_dir=data_dir)
  from_jsonl = sft.SFTSource(str(path), tok, seq_len=128, limit=3)
  assert from_tfds.num_records == 3 and len(from_tfds) == len(from_jsonl)
  for i in range(len(from_tfds)):
    for key in from_tfds[i]:
      np.testing.assert_array_equal(from_tfds[i][key], from_jsonl[i][key])
  with pytest.raises(ValueError, match="cannot read TFDS dataset 'no_such_set'"):
    sft.read_records("tfds:no_such_set:train", data_dir)
  with pytest.raises(ValueError, match="tfds:NAME:SPLIT"):
    sft.read_records("tfds:train", data_dir)


def test_a_json_list_file_reads_as_records_and_the_prompt_may_be_recurrent(tok_dir, tmp_path):
  """Coconut's ProsQA files are one JSON list: `.json` paths read as such (a file that is
  not a list of objects is one line saying so); prompt_cf=2 marks the prompt recurrent, as
  the release's CONTROL_FLOW_ALL_RECURRENT does."""
  from t2mlr_jax.data import prosqa
  records = [prosqa.sft_record(prosqa.generate_example(i, num_concepts=8, depth_min=2,
                                                        depth_max=3)) for i in range(3)]
  path = tmp_path / "prosqa_train.json"
  path.write_text(json.dumps(records))
  assert sft.read_records(str(path)) == records
  (tmp_path / "bad.json").write_text(json.dumps({"question": "q"}))
  with pytest.raises(ValueError, match="is not a JSON list of objects"):
    sft.read_records(str(tmp_path / "bad.json"))
  tok = load_tokenizer(tok_dir)
  plain = sft.tokenize_record(records[0], tok)
  recurrent = sft.tokenize_record(records[0], tok, prompt_cf=2)
  assert (plain["control_flow"] == 1).sum() > 0 and set(recurrent["control_flow"]) == {2}
  np.testing.assert_array_equal(plain["input_ids"], recurrent["input_ids"])
  with pytest.raises(ValueError, match=r"prompt_cf=3 is invalid: allowed 1 or 2"):
    sft.tokenize_record(records[0], tok, prompt_cf=3)
