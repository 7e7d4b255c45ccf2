"""Bits per byte: nanochat's rule (SPEC §5)."""

import math

import numpy as np
import pytest

from t2mlr_jax.data.byte_tokenizer import TOKENIZER, VOCAB_SIZE
from t2mlr_jax.data.token_bytes import byte_tokenizer_lengths
from t2mlr_jax.eval.bpb import bits_per_byte, bpb_sums


def test_uniform_model_on_bytes_is_log2_of_the_vocabulary():
  ids = np.array([TOKENIZER.encode("héllo")], np.int32)          # 6 bytes (é is 2)
  logits = np.zeros((1, ids.shape[1], VOCAB_SIZE), np.float32)
  nats, nbytes = bpb_sums(logits, ids, byte_tokenizer_lengths())
  assert int(nbytes) == 6
  assert bits_per_byte(nats, nbytes) == pytest.approx(math.log2(VOCAB_SIZE), rel=1e-6)


def test_special_tokens_and_ignored_labels_leave_both_sums():
  V = 8
  token_bytes = np.array([0, 1, 2, 3, 1, 1, 1, 1])               # id 0: a special token
  logits = np.random.RandomState(0).randn(1, 5, V).astype(np.float32)
  labels = np.array([[3, 0, 2, -100, 1]], np.int32)
  nats, nbytes = bpb_sums(logits, labels, token_bytes)
  logp = logits[0] - np.log(np.exp(logits[0]).sum(-1, keepdims=True))
  want = -(logp[0, 3] + logp[2, 2] + logp[4, 1])                 # positions 1 (special), 3 skipped
  assert int(nbytes) == 3 + 2 + 1
  assert float(nats) == pytest.approx(float(want), rel=1e-5)
  assert bits_per_byte(nats, nbytes) == pytest.approx(float(want) / (math.log(2) * 6), rel=1e-5)
  assert math.isnan(bits_per_byte(0.0, 0))


def test_byte_level_bpe_lengths_add_up_to_the_text_bytes(tmp_path):
  """A byte-level BPE trained here: the lengths of a text's tokens sum to its UTF-8
  bytes, and special tokens have none."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
  from t2mlr_jax.data.tokenizer import load_tokenizer
  from t2mlr_jax.data.token_bytes import hf_token_lengths
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  corpus = ["Shall I compare thee to a summer’s day?", "naïve café — déjà vu", "日本語のテキスト"] * 20
  tok.train_from_iterator(corpus, trainers.BpeTrainer(
      vocab_size=300, special_tokens=["<|bos|>"],
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  tok.save(str(tmp_path / "tokenizer.json"))
  hf = load_tokenizer(str(tmp_path))
  lengths = hf_token_lengths(hf)
  assert lengths[tok.token_to_id("<|bos|>")] == 0
  for text in corpus[:3] + ["unseen: Ωmega ✓"]:
    ids = hf.encode(text)
    assert int(lengths[ids].sum()) == len(text.encode("utf-8")), text
