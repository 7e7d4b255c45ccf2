"""GGUF import: a tiny Llama file the test writes (F32, F16, BF16, Q4_0, Q4_1, Q5_1, Q8_0
and raw Q4_K / Q6_K blocks, a byte-level BPE in the metadata) loads to transformers' own
GGUF loader's logits and tokenization; exports, retrofits and bad files."""

import os
import subprocess
import sys

import numpy as np
import pytest

from t2mlr_jax import T2MLRConfig, forward
from t2mlr_jax.convert.gguf import from_gguf
from t2mlr_jax.data.tokenizer import load_tokenizer

from _gguf_fixtures import CHAT_TEMPLATE, CORPUS, write_tiny_gguf

TEXTS = CORPUS[:4] + ["unseen text 987 <|im_end|> ✓", " leading space\n\nnew lines\ttab"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
  d = tmp_path_factory.mktemp("gguf")
  sd = write_tiny_gguf(d / "tiny.gguf")
  return str(d), "tiny.gguf", sd


def test_weights_config_and_tokenizer(tiny):
  d, name, sd = tiny
  cfg, params, tok = from_gguf(os.path.join(d, name))
  assert (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.d_ff) == (2, 64, 4, 2, 256)
  assert cfg.tie_embeddings and cfg.vocab_size == 320 and cfg.max_seq_len == 128
  # every weight equals what the file encodes (Q/K permutation undone, every type)
  for i in range(2):
    h = f"model.layers.{i}."
    for ours, theirs in (("q", "self_attn.q_proj"), ("k", "self_attn.k_proj"),
                         ("v", "self_attn.v_proj"), ("o", "self_attn.o_proj")):
      np.testing.assert_array_equal(params["layers"]["attn"][ours]["kernel"][i],
                                    sd[h + theirs + ".weight"].T)
    np.testing.assert_array_equal(params["layers"]["mlp"]["down"]["kernel"][i],
                                  sd[h + "mlp.down_proj.weight"].T)
  np.testing.assert_array_equal(params["embed"]["embedding"], sd["model.embed_tokens.weight"])
  assert (tok.bos_id, tok.eos_id, tok.pad_id) == (1, 2, 0)
  assert tok.chat_template == CHAT_TEMPLATE
  assert tok.encode("<|im_end|>") == [2]                  # control tokens stay whole


def test_matches_transformers_gguf_loader(tiny):
  import torch  # test extras: torch, transformers, accelerate (its GGUF loader)
  from transformers import AutoModelForCausalLM, AutoTokenizer
  d, name, _ = tiny
  cfg, params, tok = from_gguf(os.path.join(d, name))
  model = AutoModelForCausalLM.from_pretrained(d, gguf_file=name, dtype=torch.float32)
  ref_tok = AutoTokenizer.from_pretrained(d, gguf_file=name)
  for text in TEXTS:
    assert tok.encode(text) == ref_tok(text, add_special_tokens=False)["input_ids"], text
  ids = np.array([tok.encode(" ".join(TEXTS))])
  with torch.no_grad():
    want = model(torch.tensor(ids)).logits.numpy()
  got = np.asarray(forward(params, cfg, ids, mode="parallel"))
  assert np.abs(got - want).max() < 1e-4


def test_export_cli_round_trip_and_retrofit(tiny, tmp_path):
  """The CLI writes an export with tokenizer files the library reloads; a T2MLR retrofit
  (γ = 0) computes the base model's logits in exact mode; bf16 parameters load."""
  d, name, _ = tiny
  out = str(tmp_path / "export")
  run = subprocess.run([sys.executable, "-m", "t2mlr_jax.convert", "--from-gguf",
                        os.path.join(d, name), "--to", out], capture_output=True, text=True,
                       timeout=300)
  assert run.returncode == 0, run.stderr[-2000:]
  cfg, params, tok = from_gguf(os.path.join(d, name))
  reloaded = load_tokenizer(out)
  for text in TEXTS:
    assert reloaded.encode(text) == tok.encode(text)
  messages = [{"role": "user", "content": "hi"}]
  assert reloaded.apply_chat_template(messages) == tok.apply_chat_template(messages)
  assert reloaded.eos_id == tok.eos_id
  ids = np.array([tok.encode(TEXTS[0])])
  base = np.asarray(forward(params, cfg, ids, mode="parallel"))
  rcfg, rparams, _ = from_gguf(os.path.join(d, name),
                               recurrence=T2MLRConfig(l_start=0, l_end=0, gate_gain=1e-2))
  assert np.abs(np.asarray(forward(rparams, rcfg, ids, mode="exact")) - base).max() < 1e-5
  _, bf, _ = from_gguf(os.path.join(d, name), dtype="bfloat16")
  assert bf["embed"]["embedding"].dtype.name == "bfloat16"


def test_bad_files(tiny, tmp_path):
  import gguf
  d, name, _ = tiny
  with pytest.raises(ValueError, match="does not exist"):
    from_gguf(str(tmp_path / "missing.gguf"))
  data = open(os.path.join(d, name), "rb").read()
  for cut in (5000, len(data) - 100):           # in the metadata, in the tensor data
    truncated = tmp_path / f"truncated{cut}.gguf"
    truncated.write_bytes(data[:cut])
    with pytest.raises(ValueError, match="not a readable GGUF file"):
      from_gguf(str(truncated))
  other = tmp_path / "other.gguf"
  w = gguf.GGUFWriter(str(other), "gpt2")
  w.add_block_count(1)
  w.add_tensor("token_embd.weight", np.zeros((4, 32), np.float32))
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  with pytest.raises(ValueError, match="architecture 'gpt2' is not supported: allowed"):
    from_gguf(str(other))
  with pytest.raises(ValueError, match="dtype='float16' is invalid"):
    from_gguf(os.path.join(d, name), dtype="float16")


def test_unknown_quantisation_type_is_named(tmp_path):
  """A tensor of a type gguf cannot dequantize (Q8_K) is refused with its name."""
  path = tmp_path / "q8k.gguf"
  write_tiny_gguf(path, k_quants=("Q8_K",))
  with pytest.raises(ValueError, match="'blk.0.ffn_down.weight' has quantisation type Q8_K"):
    from_gguf(str(path))
