"""Tiny Hugging Face artefacts the tests build themselves (no downloads)."""

import os

import numpy as np

CHAT_TEMPLATE = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + "
                 "message['content'] + '<|im_end|>' + '\n' }}{% endfor %}"
                 "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
WORDS = ("the a of and to in is was for on with as by at it be are from this that "
         "question answer how many what if then so total each more less 0 1 2 3 4 5 6 7 8 9 "
         "+ - * = << >> ### #### , . ? ! : \n").split(" ")


def make_tokenizer_dir(path: str, chat_template: bool = True) -> str:
  """A word-level fast tokenizer with <|endoftext|>/<|im_start|>/<|im_end|> specials."""
  import transformers
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers
  specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>"]
  vocab = {t: i for i, t in enumerate(specials)}
  for w in WORDS + [c for c in "abcdefghijklmnopqrstuvwxyz"] + ["\n", "assistant", "user"]:
    vocab.setdefault(w, len(vocab))
  tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
  tok.pre_tokenizer = pre_tokenizers.Sequence(
      [pre_tokenizers.Split("\n", "isolated"), pre_tokenizers.WhitespaceSplit()])
  tok.decoder = decoders.WordPiece(prefix="##")
  fast = transformers.PreTrainedTokenizerFast(
      tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|im_start|>",
      unk_token="<unk>", pad_token="<|endoftext|>",
      additional_special_tokens=["<|im_start|>", "<|im_end|>"])
  if chat_template:
    fast.chat_template = CHAT_TEMPLATE
  os.makedirs(path, exist_ok=True)
  fast.save_pretrained(path)
  return path


def make_llama_dir(path: str, vocab_size: int, seed: int = 0, tied: bool = True) -> str:
  import torch
  import transformers
  torch.manual_seed(seed)
  config = transformers.LlamaConfig(
      vocab_size=vocab_size, hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
      num_key_value_heads=2, intermediate_size=64, max_position_embeddings=256,
      tie_word_embeddings=tied, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
  transformers.LlamaForCausalLM(config).save_pretrained(path)
  return path


def gsm8k_aug_records(n: int, seed: int = 0) -> list[dict]:
  rng = np.random.RandomState(seed)
  out = []
  for _ in range(n):
    a, b = rng.randint(1, 9, 2)
    out.append({"question": f"how many is {a} + {b} ?",
                "steps": [f"<< {a} + {b} = {a + b} >>"], "answer": str(a + b)})
  return out
