"""Llama-architecture GGUF files (llama.cpp's format) -> our config, parameters and
tokenizer, read with the `gguf` package (llama.cpp's own reader and dequantizers).

    cfg, params, tokenizer = from_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")

Metadata `llama.*` gives the shape (context length, widths, heads, KV heads, RoPE base,
RMS ε, vocabulary; no `output.weight` tensor means a tied head). Tensors are
dequantized to fp32 (every type `gguf.quants` dequantizes: F32, F16, BF16, Q4_0/1,
Q5_0/1, Q8_0, the K-quants, IQ-types, ...); llama.cpp's converter permutes the rows of
Q and K for its RoPE layout, which is undone here. The tokenizer is rebuilt from
`tokenizer.ggml.*` (byte-level BPE: tokens, merges, the pre-tokenizer named by
`tokenizer.ggml.pre`, control tokens as special tokens) with the file's chat template
and BOS/EOS/PAD, as the library's `HFTokenizer` (`tokenizer.save(dir)` exports
tokenizer.json and tokenizer_config.json).
"""

from __future__ import annotations

import os
from typing import Any

import gguf
import jax
import jax.numpy as jnp
import numpy as np
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

from t2mlr_jax import checkpoint
from t2mlr_jax.config import ModelConfig
from t2mlr_jax.convert import hf
from t2mlr_jax.data.tokenizer import HFTokenizer

ARCHITECTURES = ("llama",)
_LAYER = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
          "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
          "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
          "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
_GLOBAL = {"token_embd.weight": "model.embed_tokens.weight",
           "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}

# Split patterns of byte-level BPE pre-tokenizers (llama.cpp's `tokenizer.ggml.pre`).
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# pre type -> (split digits one by one first, split pattern)
PRE_TOKENIZERS = {"default": (False, _GPT2), "gpt2": (False, _GPT2),
                  "smollm": (True, _GPT2), "llama-bpe": (False, _LLAMA3),
                  "llama3": (False, _LLAMA3), "qwen2": (False, _QWEN2)}
CONTROL = 3                           # tokenizer.ggml.token_type of special tokens


class _Reader(gguf.GGUFReader):
  """gguf's reader over a plain ndarray view of its memory map (the same bytes, no copy):
  its ~250k small slices of an `np.memmap`, a subclass, took 4.7 of SmolLM2's 8.6 s load."""

  @property
  def data(self):
    return self._data

  @data.setter
  def data(self, value):
    self._data = np.asarray(value)        # an ndarray over the same mapping, no copy


def _open(path: str):
  if not os.path.isfile(path):
    raise ValueError(f"GGUF file {path!r} does not exist")
  try:
    return _Reader(path, "r")
  except Exception as e:       # the reader raises several types on a damaged file
    raise ValueError(f"{path!r} is not a readable GGUF file (truncated or corrupt?): "
                     f"{type(e).__name__}: {e}") from e


def read_metadata(reader) -> dict[str, Any]:
  """Every metadata field as a Python value (strings, numbers, lists)."""
  out = {}
  for name, field in reader.fields.items():
    if name.startswith("GGUF."):
      continue
    out[name] = field.contents()
  return out


def _rope_scaling(meta: dict, arch: str) -> None:
  scaling = meta.get(f"{arch}.rope.scaling.type", "none")
  if scaling not in ("none", None):
    raise ValueError(f"rope scaling type {scaling!r} in the GGUF metadata is not supported: "
                     "allowed none (refusing to load with wrong positions)")
  return None


def config_from_gguf(meta: dict, **overrides) -> ModelConfig:
  """ModelConfig from a GGUF file's metadata (`llama.*` keys)."""
  arch = meta.get("general.architecture")
  if arch not in ARCHITECTURES:
    raise ValueError(f"GGUF architecture {arch!r} is not supported: allowed {ARCHITECTURES}")
  key = lambda k: f"{arch}.{k}"
  missing = [k for k in ("block_count", "embedding_length", "feed_forward_length",
                         "attention.head_count") if key(k) not in meta]
  if missing:
    raise ValueError(f"GGUF metadata lacks {[key(k) for k in missing]}")
  d_model, n_heads = int(meta[key("embedding_length")]), int(meta[key("attention.head_count")])
  vocab = meta.get(key("vocab_size"))
  if vocab is None:
    vocab = len(meta.get("tokenizer.ggml.tokens") or [])
  head_dim = meta.get(key("attention.key_length"), d_model // n_heads)
  fields = dict(
      vocab_size=int(vocab), d_model=d_model, n_layers=int(meta[key("block_count")]),
      n_heads=n_heads, n_kv_heads=int(meta.get(key("attention.head_count_kv"), n_heads)),
      d_ff=int(meta[key("feed_forward_length")]), head_dim=int(head_dim),
      max_seq_len=int(meta.get(key("context_length"), 2048)),
      rope_theta=float(meta.get(key("rope.freq_base"), 10000.0)),
      rope_scaling=_rope_scaling(meta, arch),
      rms_norm_eps=float(meta.get(key("attention.layer_norm_rms_epsilon"), 1e-5)))
  return ModelConfig(**{**fields, **overrides})


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
  """Undo llama.cpp's convert_hf_to_gguf `permute` of Q/K rows ([out, in])."""
  return (w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:])
          .swapaxes(1, 2).reshape(w.shape))


def _dequantize(tensor) -> np.ndarray:
  qtype = tensor.tensor_type
  try:
    values = gguf.quants.dequantize(tensor.data, qtype)
  except NotImplementedError:
    raise ValueError(f"tensor {tensor.name!r} has quantisation type {qtype.name}, which the "
                     "gguf package cannot dequantize: allowed F32, F16, "
                     f"{', '.join(sorted(t.name for t in gguf.quants._type_traits))}") from None
  shape = tuple(int(n) for n in reversed(tensor.shape))      # GGML [ne0, ne1] -> [ne1, ne0]
  return np.asarray(values, np.float32).reshape(shape)


def state_dict_from_gguf(reader, cfg: ModelConfig) -> dict[str, np.ndarray]:
  """Hugging Face-named fp32 weights ([out, in]) of a llama GGUF file."""
  sd = {}
  for tensor in reader.tensors:
    name = tensor.name
    if name == "rope_freqs.weight":
      raise ValueError("per-frequency RoPE factors (rope_freqs.weight, Llama 3.1 style) are "
                       "not supported: allowed files without RoPE scaling")
    if name in _GLOBAL:
      hf_name = _GLOBAL[name]
    else:
      parts = name.split(".")
      if (len(parts) != 4 or parts[0] != "blk" or parts[2] not in _LAYER
          or not parts[1].isdigit()):
        raise ValueError(f"GGUF tensor {name!r} is not part of a llama model")
      if int(parts[1]) >= cfg.n_layers:
        raise ValueError(f"GGUF tensor {name!r} is beyond the {cfg.n_layers} layers the "
                         "metadata declares")
      hf_name = f"model.layers.{parts[1]}.{_LAYER[parts[2]]}.{parts[3]}"
    w = _dequantize(tensor)
    if name.endswith(("attn_q.weight", "attn_q.bias")):
      w = _unpermute(w, cfg.n_heads)
    elif name.endswith(("attn_k.weight", "attn_k.bias")):
      w = _unpermute(w, cfg.n_kv_heads)
    sd[hf_name] = w
  return sd


def tokenizer_from_gguf(meta: dict, path: str = ""):
  """The file's tokenizer as an `HFTokenizer` (byte-level BPE only)."""
  model = meta.get("tokenizer.ggml.model")
  if model is None or "tokenizer.ggml.tokens" not in meta:
    raise ValueError(f"{path!r} has no tokenizer in its metadata (tokenizer.ggml.*): pass a "
                     "tokenizer directory instead")
  if model != "gpt2":
    raise ValueError(f"GGUF tokenizer model {model!r} is not supported: allowed 'gpt2' "
                     "(byte-level BPE)")
  pre = meta.get("tokenizer.ggml.pre", "default")
  if pre not in PRE_TOKENIZERS:
    raise ValueError(f"GGUF pre-tokenizer {pre!r} is not supported: allowed "
                     f"{sorted(PRE_TOKENIZERS)}")
  tokens = list(meta["tokenizer.ggml.tokens"])
  merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
  tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges,
                             ignore_merges=pre in ("llama-bpe", "llama3")))
  digits, pattern = PRE_TOKENIZERS[pre]
  steps = [pre_tokenizers.Digits(individual_digits=True)] if digits else []
  steps += [pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
  tok.pre_tokenizer = pre_tokenizers.Sequence(steps)
  tok.decoder = decoders.ByteLevel()
  types = meta.get("tokenizer.ggml.token_type") or []
  tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                          for t, token_type in zip(tokens, types) if token_type == CONTROL])
  name = lambda key: (tokens[int(meta[key])] if key in meta and int(meta[key]) < len(tokens)
                      else None)
  config = {"bos_token": name("tokenizer.ggml.bos_token_id"),
            "eos_token": name("tokenizer.ggml.eos_token_id"),
            "pad_token": name("tokenizer.ggml.padding_token_id"),
            "unk_token": name("tokenizer.ggml.unknown_token_id"),
            "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
            "chat_template": meta.get("tokenizer.chat_template"),
            "tokenizer_class": "PreTrainedTokenizerFast"}
  return HFTokenizer.from_objects(tok, config, path)


def from_gguf(path: str, *, recurrence=None, dtype: str = "float32", seed: int = 0):
  """(ModelConfig, params, tokenizer) of a Llama-architecture GGUF file.

  recurrence: a recurrence to add (a type that declares `retrofit`: T2MLR, LRT with
  init="identity", a user's), with fresh parameters that keep the GGUF model's function
  exactly (T2MLR: γ = 0). dtype: the
  parameters' dtype ("float32" or "bfloat16"; they are dequantized in fp32 first).
  """
  if dtype not in ("float32", "bfloat16"):
    raise ValueError(f"dtype={dtype!r} is invalid: allowed 'float32' or 'bfloat16'")
  recurrence = hf.check_retrofit(recurrence, "from_gguf")
  reader = _open(path)
  meta = read_metadata(reader)
  names = {t.name for t in reader.tensors}
  cfg = config_from_gguf(meta, tie_embeddings="output.weight" not in names,
                         qkv_bias="blk.0.attn_q.bias" in names, recurrence=recurrence)
  tokenizer = tokenizer_from_gguf(meta, path)
  sd = state_dict_from_gguf(reader, cfg)
  params = hf.retrofit(cfg, hf.base_params_from_state_dict(sd, cfg), seed)
  if dtype == "bfloat16":
    params = jax.tree.map(lambda x: np.asarray(jnp.asarray(x, jnp.bfloat16)), params)
  return cfg, params, tokenizer


def export_gguf(path: str, out: str, *, recurrence=None, dtype: str = "float32"):
  """`from_gguf`, written as a parameter export at `out` (what training's
  `model.init_from` reads) with tokenizer.json / tokenizer_config.json beside it.
  Returns (cfg, the tokenizer files written)."""
  cfg, params, tokenizer = from_gguf(path, recurrence=recurrence, dtype=dtype)
  checkpoint.export(cfg, params, out)
  return cfg, tokenizer.save(out)
