"""A tiny Llama GGUF file written with gguf.GGUFWriter, as llama.cpp's converter would
write it: HF-layout weights with Q/K rows permuted, mixed quantisation types, and a
byte-level BPE tokenizer (trained here) in the metadata."""

import json
import os

import numpy as np

from t2mlr_jax.convert.loading import load_model_and_tokenizer

CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                 "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
                 "{% endif %}")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = ["The quick brown fox jumps over the lazy dog.", "Numbers 1 22 333 and 4444.",
          "naïve café — déjà vu", "To be, or not to be: that is the question."] * 10


def train_tokenizer():
  """(tokens by id, merges as 'a b' strings): a SmolLM-style byte-level BPE."""
  from tokenizers import Tokenizer, models, pre_tokenizers, trainers
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.Sequence([
      pre_tokenizers.Digits(individual_digits=True),
      pre_tokenizers.ByteLevel(add_prefix_space=False)])
  tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
      vocab_size=320, special_tokens=SPECIALS,
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
  spec = json.loads(tok.to_str())
  vocab = spec["model"]["vocab"]
  tokens = [None] * len(vocab)
  for t, i in vocab.items():
    tokens[i] = t
  merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
  return tokens, merges


def permute(w, n_head):
  """llama.cpp's convert_hf_to_gguf permutation of Q/K rows."""
  return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
          .swapaxes(1, 2).reshape(w.shape))


def _k_quant_blocks(rng, qtype, n_blocks):
  """Random raw K-quant blocks with small, finite fp16 scales (gguf cannot quantize these)."""
  import gguf
  block, size = gguf.GGML_QUANT_SIZES[qtype]
  raw = rng.integers(0, 256, (n_blocks, size), dtype=np.uint8)
  scale = np.frombuffer(np.float16(0.002).tobytes(), np.uint8)
  if qtype == gguf.GGMLQuantizationType.Q6_K:
    raw[:, -2:] = scale                                   # d at the end
  else:                                                   # Q2_K..Q5_K: d, dmin first
    offset = 16 + 64 if qtype == gguf.GGMLQuantizationType.Q2_K else 0
    raw[:, offset:offset + 2] = scale
    raw[:, offset + 2:offset + 4] = scale
  return raw, block


def write_tiny_gguf(path, *, arch="llama", n_layers=2, d_model=64, n_heads=4, n_kv_heads=2,
                    d_ff=256, seed=0, k_quants=("Q4_K", "Q6_K")):
  """Write the file; returns the HF-layout fp32 state dict it encodes (Q/K unpermuted,
  quantised tensors as their dequantized values)."""
  import gguf
  Q = gguf.GGMLQuantizationType
  rng = np.random.default_rng(seed)
  tokens, merges = train_tokenizer()
  V, hd = len(tokens), d_model // n_heads
  w = gguf.GGUFWriter(str(path), arch)
  w.add_context_length(128)
  w.add_embedding_length(d_model)
  w.add_block_count(n_layers)
  w.add_feed_forward_length(d_ff)
  w.add_head_count(n_heads)
  w.add_head_count_kv(n_kv_heads)
  w.add_rope_freq_base(10000.0)
  w.add_rope_dimension_count(hd)
  w.add_layer_norm_rms_eps(1e-5)
  w.add_vocab_size(V)
  w.add_tokenizer_model("gpt2")
  w.add_tokenizer_pre("smollm")
  w.add_token_list(tokens)
  w.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
  w.add_token_merges(merges)
  w.add_bos_token_id(1)
  w.add_eos_token_id(2)
  w.add_pad_token_id(0)
  w.add_add_bos_token(False)
  w.add_chat_template(CHAT_TEMPLATE)
  sd = {}

  def add(name, hf_name, value, qtype=Q.F32, q_heads=None):
    value = value.astype(np.float32)
    stored = permute(value, q_heads) if q_heads else value
    if qtype in (Q.F32,):
      w.add_tensor(name, stored)
      deq = stored
    elif qtype == Q.F16:
      w.add_tensor(name, stored.astype(np.float16))
      deq = stored.astype(np.float16).astype(np.float32)
    else:
      data = gguf.quants.quantize(stored, qtype)
      w.add_tensor(name, data, raw_dtype=qtype)
      deq = gguf.quants.dequantize(data, qtype).reshape(stored.shape)
    sd[hf_name] = permute_back(deq, q_heads) if q_heads else deq

  def permute_back(x, n):
    return x.reshape(n, x.shape[0] // n // 2, 2, *x.shape[1:]).swapaxes(1, 2).reshape(x.shape)

  normal = lambda *shape: rng.normal(0, 0.05, shape)
  add("token_embd.weight", "model.embed_tokens.weight", normal(V, d_model), Q.Q8_0)
  add("output_norm.weight", "model.norm.weight", 1 + normal(d_model))
  types = [Q.Q4_1, Q.F16, Q.Q8_0, Q.Q4_0, Q.BF16, Q.Q5_1]
  for i in range(n_layers):
    p, h = f"blk.{i}.", f"model.layers.{i}."
    add(p + "attn_norm.weight", h + "input_layernorm.weight", 1 + normal(d_model))
    add(p + "ffn_norm.weight", h + "post_attention_layernorm.weight", 1 + normal(d_model))
    add(p + "attn_q.weight", h + "self_attn.q_proj.weight", normal(d_model, d_model),
        types[i % 6], q_heads=n_heads)
    add(p + "attn_k.weight", h + "self_attn.k_proj.weight", normal(n_kv_heads * hd, d_model),
        types[(i + 1) % 6], q_heads=n_kv_heads)
    add(p + "attn_v.weight", h + "self_attn.v_proj.weight", normal(n_kv_heads * hd, d_model),
        types[(i + 2) % 6])
    add(p + "attn_output.weight", h + "self_attn.o_proj.weight", normal(d_model, d_model),
        types[(i + 3) % 6])
    add(p + "ffn_gate.weight", h + "mlp.gate_proj.weight", normal(d_ff, d_model),
        types[(i + 4) % 6])
    add(p + "ffn_up.weight", h + "mlp.up_proj.weight", normal(d_ff, d_model), types[(i + 5) % 6])
    if k_quants:        # ffn_down has 256 inputs: one K-quant block per row
      qtype = Q[k_quants[i % len(k_quants)]]
      raw, block = _k_quant_blocks(rng, qtype, d_model * d_ff // 256)
      w.add_tensor(p + "ffn_down.weight", raw.reshape(d_model, -1), raw_dtype=qtype)
      if qtype.name in {t.name for t in gguf.quants._type_traits}:
        sd[h + "mlp.down_proj.weight"] = gguf.quants.dequantize(raw, qtype).reshape(d_model,
                                                                                   d_ff)
    else:
      add(p + "ffn_down.weight", h + "mlp.down_proj.weight", normal(d_model, d_ff), Q.Q8_0)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  return sd


def tiny_gguf_model(directory):
  """(cfg, params, tokenizer) of a tiny GGUF written in `directory`, as a server loads it."""
  path = os.path.join(directory, "tiny.gguf")
  write_tiny_gguf(path)
  cfg, params, found = load_model_and_tokenizer(path)
  return cfg, params, found.tokenizer
