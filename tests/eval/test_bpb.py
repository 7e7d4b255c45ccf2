"""Bits per byte: nanochat's rule (docs/pretraining.md, "Bits per byte")."""

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

  from t2mlr_jax.data.token_bytes import hf_token_lengths
  from t2mlr_jax.data.tokenizer import load_tokenizer
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


# --- evaluate_bpb on a model whose every logit is known ------------------------------

def copy_model(V=16, scale=0.5, shift=1):
  """A one-layer transformer computing logits in closed form: its block writes nothing
  (W_o = W_down = 0), the embedding is the identity (d_model = V) and the head reads
  e_i into `scale`·e_{(i + shift) mod V}. After the final RMSNorm (unit gain) every
  position predicts (token + shift) mod V with logit a = scale / sqrt(1/V + ε), the other
  V − 1 logits 0. Returns (cfg, params, a)."""
  import jax
  import jax.numpy as jnp

  from t2mlr_jax import ModelConfig, init_params
  cfg = ModelConfig(vocab_size=V, d_model=V, n_layers=1, n_heads=2, d_ff=16, max_seq_len=16)
  params = init_params(cfg, jax.random.PRNGKey(0))
  layers = params["layers"]
  layers["attn"]["o"]["kernel"] = jnp.zeros_like(layers["attn"]["o"]["kernel"])
  layers["mlp"]["down"]["kernel"] = jnp.zeros_like(layers["mlp"]["down"]["kernel"])
  params["embed"]["embedding"] = jnp.eye(V, dtype=jnp.float32)
  params["lm_head"]["kernel"] = jnp.asarray(
      scale * np.roll(np.eye(V, dtype=np.float32), shift, axis=1))
  return cfg, params, scale / math.sqrt(1.0 / V + cfg.rms_norm_eps)


def copy_model_nll(a, V, right):
  """−log p of a copy_model position: its predicted id when `right`, another otherwise."""
  lse = math.log(math.exp(a) + V - 1)
  return lse - a if right else lse


def test_evaluate_bpb_known_values():
  """evaluate_bpb end to end: a uniform model (zero head) scores log2 V bits per token
  with bytes, so bpb = log2 V · (tokens with bytes) / bytes; the copy model, right at
  even positions and wrong at odd ones, scores its closed-form NLLs. Ignored labels and
  0-byte (special) tokens leave the byte sums; 'loss' and 'tokens' count every label."""
  from t2mlr_jax.eval.bpb import evaluate_bpb
  V = 16
  cfg, params, a = copy_model(V)
  token_bytes = np.arange(V) % 4                      # ids 0, 4, 8, 12: specials
  inputs = np.array([[3, 1, 4, 1, 5, 9, 2, 6], [5, 3, 5, 8, 9, 7, 9, 3]], np.int32)
  right = np.broadcast_to(np.arange(8) % 2 == 0, inputs.shape)
  targets = np.where(right, (inputs + 1) % V, (inputs + 2) % V).astype(np.int32)
  targets[0, 3] = targets[1, 7] = -1                  # not predicted
  batches = [{"input_ids": inputs[:1], "target_ids": targets[:1]},
             {"input_ids": inputs[1:], "target_ids": targets[1:]}]
  sup = targets >= 0
  nbytes = token_bytes[np.where(sup, targets, 0)] * sup
  assert 0 < (sup & (nbytes == 0)).sum() and sup.sum() == 14     # a special is predicted

  uniform = {**params, "lm_head": {"kernel": np.zeros((V, V), np.float32)}}
  r = evaluate_bpb(uniform, cfg, batches, token_bytes)
  assert r["tokens"] == 14 and r["bytes"] == nbytes.sum()
  assert r["loss"] == pytest.approx(math.log(V), rel=1e-6)
  assert r["bpb"] == pytest.approx(math.log2(V) * (nbytes > 0).sum() / nbytes.sum(), rel=1e-6)

  nll = np.vectorize(lambda ok: copy_model_nll(a, V, ok))(right)
  r = evaluate_bpb(params, cfg, batches, token_bytes)
  assert r["tokens"] == 14 and r["bytes"] == nbytes.sum()
  assert r["loss"] == pytest.approx(nll[sup].mean(), rel=1e-5)
  assert r["bpb"] == pytest.approx((nll * (nbytes > 0))[sup].sum() / (math.log(2) * nbytes.sum()),
                                   rel=1e-5)
