"""What the configs' `tiny` variants read from disk, made in seconds with no download:
`python -m t2mlr_jax.data.tiny [--out=data/tiny]` (main makes the missing parts itself
when a config names them).

  data/tiny/lm_byte32/     a prepared byte-level dataset (blocks of 32) of a synthetic
                           corpus: lm_gutenberg.py:tiny, fineweb_135m.py:tiny
  data/tiny/base/          a Hugging Face directory of a random 4-layer Llama with a
                           byte-level BPE tokenizer: the retrofit configs' tiny
                           model.init_from
  data/tiny/va_sft.jsonl   Variable Assignment SFT records: their tiny data.path
  data/tiny/hotpotqa_sft.jsonl  HotpotQA-format records of the synthetic corpus, as SFT
                           records: hotpotqa.py:tiny

The S5 and Variable Assignment tasks generate their data on the fly and need none of it.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Optional

import numpy as np
from absl import flags
from safetensors.numpy import save_file

from t2mlr_jax import cli, paths
from t2mlr_jax.data import hotpotqa, lm, prepare, variable_assignment as va

ROOT = os.path.join("data", "tiny")
LM_DATA, BASE, SFT_DATA = "lm_byte32", "base", "va_sft.jsonl"
HOTPOT_DATA = "hotpotqa_sft.jsonl"
PARTS = (LM_DATA, BASE, SFT_DATA, HOTPOT_DATA)
COMMAND = "python -m t2mlr_jax.data.tiny"
# the config fields that may name a part
FIELDS = ("data.path", "data.tokenizer", "model.init_from")

_WORDS = ("the cat dog bird fox owl sees finds keeps leaves a red small quiet old bright "
          "stone tree river hill garden near over under and then").split()


def corpus(num_documents: int, seed: int) -> list[str]:
  """Synthetic English-like documents (a few sentences each) from `seed`."""
  rng = np.random.default_rng(seed)
  docs = []
  for _ in range(num_documents):
    sentences = [" ".join(rng.choice(_WORDS, size=rng.integers(4, 9))).capitalize() + "."
                 for _ in range(rng.integers(2, 5))]
    docs.append(" ".join(sentences))
  return docs


def _write_jsonl(path: str, docs: list[str]) -> None:
  with open(path, "w") as f:
    f.writelines(json.dumps({"text": d}) + "\n" for d in docs)


def _make_lm_data(out: str) -> None:
  tmp = out + ".text"
  os.makedirs(tmp, exist_ok=True)
  try:
    _write_jsonl(os.path.join(tmp, "train.jsonl"), corpus(256, seed=0))
    _write_jsonl(os.path.join(tmp, "validation.jsonl"), corpus(32, seed=1))
    prepare.prepare(os.path.join(tmp, "train.jsonl"), out,
                    validation=os.path.join(tmp, "validation.jsonl"), block_size=32,
                    progress=False)
  finally:
    shutil.rmtree(tmp, ignore_errors=True)


def _sft_records(num: int) -> list[dict]:
  """Short Variable Assignment records (4 base variables, 2 distractors): each fits the
  tiny retrofits' seq_len of 128 tokens."""
  return [va.sft_record(va.generate_example((0, i), num_base=4, num_distractors=2))
          for i in range(num)]


def _make_sft_data(out: str) -> None:
  paths.write_text(out, "".join(json.dumps(r) + "\n" for r in _sft_records(64)))


def hotpot_records(num: int, seed: int = 0) -> list[dict]:
  """HotpotQA-layout records of the synthetic corpus: two titled paragraphs, the question
  asks which word the first paragraph's first sentence ends with (the cited fact)."""
  rng = np.random.default_rng(seed)
  out = []
  for i, (a, b) in enumerate(zip(corpus(num, seed), corpus(num, seed + 1))):
    first = a.split(". ")[0].rstrip(".")
    answer = first.split()[-1]
    sentences = [(" " if j else "") + x.strip().rstrip(".") + "."    # as the public files:
                 for j, x in enumerate(a.split(". "))]                # a space before each next
    titles = [f"Doc {i}", f"Note {int(rng.integers(1000))}"]
    out.append({"_id": f"tiny{i}", "question": f"Which word ends: {' '.join(first.split()[:-1])}?",
                "answer": answer, "supporting_facts": [[titles[0], 0]],
                "context": [[titles[0], sentences], [titles[1], [b]]]})
  return out


def _make_hotpot_data(out: str) -> None:
  hotpotqa.write_sft_jsonl(hotpot_records(64), out)


def _llama_weights(cfg: dict, seed: int) -> dict:
  """Random weights of a Llama in the Hugging Face layout (linear weights [out, in],
  tied embeddings): normal(0, 0.02), norms 1."""
  rng = np.random.default_rng(seed)
  d, f, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
  hd = d // cfg["num_attention_heads"]
  q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
  shapes = {"self_attn.q_proj": (q, d), "self_attn.k_proj": (kv, d),
            "self_attn.v_proj": (kv, d), "self_attn.o_proj": (d, q),
            "mlp.gate_proj": (f, d), "mlp.up_proj": (f, d), "mlp.down_proj": (d, f)}
  weights = {"model.embed_tokens.weight": rng.normal(0, 0.02, (v, d)),
             "model.norm.weight": np.ones(d)}
  for i in range(cfg["num_hidden_layers"]):
    for name, shape in shapes.items():
      weights[f"model.layers.{i}.{name}.weight"] = rng.normal(0, 0.02, shape)
    for norm in ("input_layernorm", "post_attention_layernorm"):
      weights[f"model.layers.{i}.{norm}.weight"] = np.ones(d)
  return {k: w.astype(np.float32) for k, w in weights.items()}


def _make_base(out: str) -> None:
  """A Hugging Face directory (config.json, model.safetensors, tokenizer.json) of a random
  4-layer Llama with a BPE trained on the corpus and the SFT records; built beside `out`
  and renamed into place (never half made)."""
  tmp = f"{out}.tmp-{os.getpid()}"
  shutil.rmtree(tmp, ignore_errors=True)
  texts = corpus(256, seed=0) + [r["prompt"] + r["response"] for r in _sft_records(64)]
  try:
    tok = lm.train_bpe(texts, 512, tmp)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 32,
           "num_hidden_layers": 4, "num_attention_heads": 2, "num_key_value_heads": 2,
           "intermediate_size": 64, "vocab_size": tok.vocab_size, "hidden_act": "silu",
           "max_position_embeddings": 256, "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
           "tie_word_embeddings": True, "torch_dtype": "float32"}
    with open(os.path.join(tmp, "config.json"), "w") as f:
      json.dump(cfg, f, indent=2)
    save_file(_llama_weights(cfg, seed=0), os.path.join(tmp, "model.safetensors"))
    os.rename(tmp, out)
  finally:
    shutil.rmtree(tmp, ignore_errors=True)


def make(out: str = ROOT) -> list[str]:
  """Make the parts `out` lacks; returns the paths made."""
  made = []
  os.makedirs(out, exist_ok=True)
  for part, maker in ((LM_DATA, _make_lm_data), (BASE, _make_base),
                      (SFT_DATA, _make_sft_data), (HOTPOT_DATA, _make_hotpot_data)):
    path = os.path.join(out, part)
    if not os.path.exists(path):
      maker(path)
      made.append(path)
  return made


def missing(config, root: str = ROOT) -> list[str]:
  """The config fields (FIELDS) that name a part under `root` not made yet."""
  prefix = os.path.normpath(root) + os.sep
  out = []
  for field in FIELDS:
    group, name = field.split(".")
    value: Optional[str] = config.get(group, {}).get(name)
    if value and os.path.normpath(value).startswith(prefix) and not os.path.exists(value):
      out.append(field)
  return out


def main(argv=None):
  """The command line; flags are defined here so importing this module defines none."""
  out = flags.DEFINE_string("out", ROOT, "where to write (the tiny configs read data/tiny)")

  def run(argv):
    del argv
    made = make(out.value)
    print(f"made {', '.join(made)}" if made else f"{out.value} holds every part already")
  cli.run(run, argv)


if __name__ == "__main__":
  main()
