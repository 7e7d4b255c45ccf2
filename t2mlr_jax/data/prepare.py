"""Tokenise and pack a text source into ArrayRecord shards for pretraining.

    python -m t2mlr_jax.data.prepare --train='corpus/train.jsonl' \\
        --validation='corpus/validation.jsonl' --out=data/corpus_byte --block_size=256
    python -m t2mlr_jax.data.prepare --train=... --out=... --train_tokenizer --vocab_size=4096

Sources: see `t2mlr_jax.data.text` (.txt / .jsonl / .parquet globs, tfds:NAME:SPLIT).
Tokenizer: `byte` (default, no file), a directory with `tokenizer.json`, or a byte-level
BPE trained on the training split (`--train_tokenizer --vocab_size=N`, deterministic).
The output directory holds `{split}-NNNNN-of-NNNNN.array_record` shards of packed blocks
(`t2mlr_jax.data.lm`), `token_bytes.npy`, the tokenizer's copy under `tokenizer/`, and
`manifest.json` (documents, tokens, UTF-8 bytes, blocks and shards per split; block
size; tokenizer kind, hash, vocabulary and special ids). It is written beside the
destination and moved into place at the end, so an interrupted run leaves nothing.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import time
from typing import Optional

import numpy as np
from absl import app, flags
from array_record.python.array_record_module import ArrayRecordWriter
from tqdm import tqdm

from t2mlr_jax import cli
from t2mlr_jax.data import lm, text

ENCODE_BATCH = 64          # documents per tokenizer call


def _batched(iterable, n):
  it = iter(iterable)
  while chunk := list(itertools.islice(it, n)):
    yield chunk


def _write_split(name: str, spec: str, tokenizer: lm.LMTokenizer, out: str, *,
                 block_size: int, blocks_per_shard: int, text_field: str,
                 tfds_data_dir: Optional[str], progress: bool) -> dict:
  stats = {"documents": 0, "tokens": 0, "text_tokens": 0, "bytes": 0}

  def wrapped_documents():
    docs = text.iter_documents(spec, text_field=text_field, tfds_data_dir=tfds_data_dir)
    bar = tqdm(desc=f"{name}: documents", unit=" docs", disable=not progress)
    for chunk in _batched(docs, ENCODE_BATCH):
      for doc, ids in zip(chunk, tokenizer.encode_batch(chunk)):
        wrapped = lm.document_tokens(ids, tokenizer.bos_id, tokenizer.eos_id)
        stats["documents"] += 1
        stats["bytes"] += len(doc.encode("utf-8"))
        stats["text_tokens"] += len(ids)
        stats["tokens"] += len(wrapped)
        yield wrapped
      bar.update(len(chunk))
    bar.close()

  shards, writer, count = [], None, 0
  for block in lm.pack_documents(wrapped_documents(), block_size):
    if count % blocks_per_shard == 0:
      if writer is not None:
        writer.close()
      shards.append(os.path.join(out, f"{name}-{len(shards):05d}.array_record"))
      writer = ArrayRecordWriter(shards[-1], "group_size:1")
    writer.write(lm.encode_record(block))
    count += 1
  if writer is not None:
    writer.close()
  if not count:
    raise ValueError(f"{name} source {spec!r} gives no block (too little text)")
  names = []
  for i, path in enumerate(shards):       # final names carry the shard count
    final = f"{name}-{i:05d}-of-{len(shards):05d}.array_record"
    os.rename(path, os.path.join(out, final))
    names.append(final)
  return {"source": spec, **stats, "blocks": count, "shards": names}


def prepare(train: str, out: str, *, validation: Optional[str] = None,
            tokenizer: str = "byte", train_tokenizer: bool = False,
            vocab_size: Optional[int] = None, block_size: int = 256,
            blocks_per_shard: int = 8192, text_field: str = "text",
            tfds_data_dir: Optional[str] = None, overwrite: bool = False,
            progress: bool = True) -> dict:
  """Write a prepared dataset to `out` (see the module docstring); returns its manifest."""
  if block_size < 1:
    raise ValueError(f"block_size={block_size} is invalid: allowed >= 1")
  if blocks_per_shard < 1:
    raise ValueError(f"blocks_per_shard={blocks_per_shard} is invalid: allowed >= 1")
  if os.path.exists(out) and not overwrite:
    raise ValueError(f"output directory {out!r} exists: pass --overwrite to replace it")
  if train_tokenizer and not vocab_size:
    raise ValueError("--train_tokenizer needs --vocab_size=N")
  if vocab_size and not train_tokenizer:
    raise ValueError("--vocab_size applies only with --train_tokenizer")
  splits = {"train": train, **({"validation": validation} if validation else {})}
  for spec in splits.values():           # fail on a bad path before any work
    if not spec.startswith(text.TFDS_PREFIX):
      text.expand(spec)
  parent = os.path.dirname(os.path.abspath(out))
  os.makedirs(parent, exist_ok=True)
  tmp = os.path.join(parent, f".{os.path.basename(os.path.abspath(out))}.tmp-{os.getpid()}")
  shutil.rmtree(tmp, ignore_errors=True)
  os.makedirs(tmp)
  try:
    tok_dir = os.path.join(tmp, lm.TOKENIZER_DIR)
    if train_tokenizer:
      docs = text.iter_documents(train, text_field=text_field, tfds_data_dir=tfds_data_dir)
      tok = lm.train_bpe(docs, vocab_size, tok_dir)
    else:
      tok = lm.get_tokenizer(tokenizer)
      if tok.path is not None:
        os.makedirs(tok_dir)
        for name in ("tokenizer.json", "tokenizer_config.json"):
          if os.path.isfile(os.path.join(tok.path, name)):
            shutil.copy(os.path.join(tok.path, name), tok_dir)
    np.save(os.path.join(tmp, lm.TOKEN_BYTES), tok.token_bytes)
    info = {name: _write_split(name, spec, tok, tmp, block_size=block_size,
                               blocks_per_shard=blocks_per_shard, text_field=text_field,
                               tfds_data_dir=tfds_data_dir, progress=progress)
            for name, spec in splits.items()}
    manifest = {
        "format": lm.FORMAT, "block_size": block_size, "text_field": text_field,
        "created": time.strftime("%Y-%m-%d %H:%M:%S"),
        "tokenizer": {"kind": "bpe_trained" if train_tokenizer else tok.format,
                      "source": None if train_tokenizer else tokenizer,
                      "sha256": tok.sha256, "vocab_size": tok.vocab_size,
                      "bos_id": tok.bos_id, "eos_id": tok.eos_id, "pad_id": tok.pad_id},
        "splits": info}
    with open(os.path.join(tmp, lm.MANIFEST), "w") as f:
      json.dump(manifest, f, indent=2)
    if os.path.exists(out):
      shutil.rmtree(out)
    os.rename(tmp, out)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  return manifest


def main(argv=None):
  """The command line; flags are defined here so importing this module defines none."""
  f = flags
  train = f.DEFINE_string("train", None, "training text source (glob of .txt/.jsonl/"
                          ".parquet, or tfds:NAME:SPLIT)")
  validation = f.DEFINE_string("validation", None, "held-out text source (optional)")
  out = f.DEFINE_string("out", None, "output directory")
  tokenizer = f.DEFINE_string("tokenizer", "byte", "'byte' or a directory with tokenizer.json")
  train_tok = f.DEFINE_bool("train_tokenizer", False, "train a byte-level BPE on the "
                            "training split")
  vocab = f.DEFINE_integer("vocab_size", None, "vocabulary of the trained BPE")
  block = f.DEFINE_integer("block_size", 256, "tokens per training example (train.seq_len)")
  per_shard = f.DEFINE_integer("blocks_per_shard", 8192, "blocks per ArrayRecord shard")
  field = f.DEFINE_string("text_field", "text", "the text field of .jsonl/.parquet/TFDS")
  tfds_dir = f.DEFINE_string("tfds_data_dir", None, "TFDS data_dir for tfds: sources")
  overwrite = f.DEFINE_bool("overwrite", False, "replace an existing output directory")

  def run(argv):
    del argv
    if not train.value or not out.value:
      raise app.UsageError("--train and --out are required")
    manifest = prepare(train.value, out.value, validation=validation.value,
                       tokenizer=tokenizer.value, train_tokenizer=train_tok.value,
                       vocab_size=vocab.value, block_size=block.value,
                       blocks_per_shard=per_shard.value, text_field=field.value,
                       tfds_data_dir=tfds_dir.value, overwrite=overwrite.value)
    for name, info in manifest["splits"].items():
      print(f"{name}: {info['documents']} documents, {info['tokens']} tokens, "
            f"{info['bytes']} bytes -> {info['blocks']} blocks of {manifest['block_size']} "
            f"in {len(info['shards'])} shard(s)")
    print(f"wrote {out.value}")
  cli.run(run, argv)


if __name__ == "__main__":
  main()
