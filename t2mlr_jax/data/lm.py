"""Language-model data: tokenizers, packing documents into fixed blocks, and the
prepared-dataset format (`python -m t2mlr_jax.data.prepare` writes it).

Packing: each document becomes [BOS] tokens [EOS] (a tokenizer without BOS starts a
document after the previous EOS) and the documents are concatenated into one stream,
cut into blocks of T+1 tokens with stride T. Block i's inputs are stream[iT : iT+T] and
its targets stream[iT+1 : iT+T+1], so every token is an input exactly once and a target
exactly once; the last block is padded. A block is stored as int32 [2, T+1]: the tokens
(-1 for padding) and a 0/1 row marking document starts.

A decoded block (`decode_block`) carries per-document positions (0 at each document
start and at the block start), which also reset the recurrent state there (T2MLR and
LRT read zero where the position id is 0), and, with mask_documents, segment ids that
keep attention inside a document. A target that is a document's first token (the next
document's BOS) is not predicted.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Iterable, Iterator, NamedTuple, Optional, Sequence

import grain
import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from t2mlr_jax.data import byte_tokenizer as bt
from t2mlr_jax.data.token_bytes import byte_tokenizer_lengths, hf_token_lengths
from t2mlr_jax.data.tokenizer import load_tokenizer
from t2mlr_jax.losses import IGNORE

FORMAT = "t2mlr_jax.packed_lm/1"
MANIFEST = "manifest.json"
TOKENIZER_DIR = "tokenizer"          # a prepared dataset's own copy of its tokenizer
TOKEN_BYTES = "token_bytes.npy"      # [V] UTF-8 bytes per token id (bits per byte)
SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>")    # a trained BPE's ids 0, 1, 2


class LMTokenizer(NamedTuple):
  """What packing and bits per byte need from a tokenizer."""
  format: str                    # "byte" or "tokenizer.json" (the manifest's tokenizer.kind)
  encode_batch: object           # list[str] -> list[list[int]] (no special tokens)
  bos_id: Optional[int]
  eos_id: int
  pad_id: int
  vocab_size: int
  token_bytes: np.ndarray        # [V] int32
  sha256: str                    # of tokenizer.json ("byte" for the byte tokenizer)
  path: Optional[str]            # the directory holding tokenizer.json


def byte_tokenizer() -> LMTokenizer:
  def encode_batch(texts):
    return [(np.frombuffer(t.encode("utf-8"), np.uint8).astype(np.int32) + bt.OFFSET)
            for t in texts]
  return LMTokenizer("byte", encode_batch, bt.BOS_ID, bt.EOS_ID, bt.PAD_ID, bt.VOCAB_SIZE,
                     byte_tokenizer_lengths(), "byte", None)


def file_sha256(path: str) -> str:
  with open(path, "rb") as f:
    return hashlib.sha256(f.read()).hexdigest()


def hf_lm_tokenizer(path: str) -> LMTokenizer:
  """A byte-level BPE `tokenizer.json` (directory or file) for language modelling."""
  directory = os.path.dirname(path) if os.path.isfile(path) else path
  if not os.path.isfile(os.path.join(directory, "tokenizer.json")):
    raise ValueError(f"tokenizer {path!r}: no tokenizer.json there (allowed: 'byte', a "
                     "directory with tokenizer.json, or --train_tokenizer)")
  tok = load_tokenizer(directory)
  eos = tok.eos_id if tok.eos_id is not None else tok.bos_id
  if eos is None:
    raise ValueError(f"tokenizer {path!r} has neither eos_token nor bos_token in "
                     "tokenizer_config.json: documents need a separator token")
  pad = tok.pad_id if tok.pad_id is not None else eos

  def encode_batch(texts):
    return [e.ids for e in tok.tokenizer.encode_batch(list(texts), add_special_tokens=False)]
  return LMTokenizer("tokenizer.json", encode_batch, tok.bos_id, eos, pad, tok.vocab_size,
                     hf_token_lengths(tok), file_sha256(os.path.join(directory,
                                                                     "tokenizer.json")),
                     directory)


def get_tokenizer(spec: str) -> LMTokenizer:
  """'byte' or a directory with tokenizer.json."""
  return byte_tokenizer() if spec == "byte" else hf_lm_tokenizer(spec)


def train_bpe(documents: Iterable[str], vocab_size: int, out_dir: str) -> LMTokenizer:
  """Train a byte-level BPE on `documents` with the `tokenizers` trainer (as nanochat
  trains its own) and save tokenizer.json + tokenizer_config.json in out_dir. Ids 0-2
  are <pad> <bos> <eos>. The same documents and vocab_size give the same file."""
  minimum = len(SPECIAL_TOKENS) + 256
  if vocab_size < minimum:
    raise ValueError(f"vocab_size={vocab_size} is too small: allowed >= {minimum} "
                     "(the 256 byte symbols and 3 special tokens)")
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                show_progress=False)
  tok.train_from_iterator(documents, trainer=trainer)
  os.makedirs(out_dir, exist_ok=True)
  tok.save(os.path.join(out_dir, "tokenizer.json"))
  pad, bos, eos = SPECIAL_TOKENS
  with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
    json.dump({"bos_token": bos, "eos_token": eos, "pad_token": pad,
               "tokenizer_class": "PreTrainedTokenizerFast"}, f, indent=2)
  return hf_lm_tokenizer(out_dir)


# ----------------------------------------------------------------------------- packing


def document_tokens(ids: Sequence[int], bos_id: Optional[int], eos_id: int) -> np.ndarray:
  """[BOS] ids [EOS] (no BOS when the tokenizer has none)."""
  head = [] if bos_id is None else [bos_id]
  return np.concatenate([np.asarray(head, np.int32), np.asarray(ids, np.int32),
                         np.asarray([eos_id], np.int32)])


def pack_documents(docs: Iterable[np.ndarray], block_size: int) -> Iterator[np.ndarray]:
  """Blocks int32 [2, T+1] (tokens, document-start flags) from documents already wrapped
  by `document_tokens`; stride T (one token of overlap: inputs and targets each cover the
  stream exactly once). The last block is padded with token -1."""
  if block_size < 1:
    raise ValueError(f"block_size={block_size} is invalid: allowed >= 1")
  width = block_size + 1
  tokens, starts = np.zeros(0, np.int32), np.zeros(0, np.int32)
  for doc in docs:
    flags = np.zeros(len(doc), np.int32)
    flags[0] = 1
    tokens, starts = np.concatenate([tokens, doc]), np.concatenate([starts, flags])
    n_full = (len(tokens) - 1) // block_size
    for i in range(n_full):
      lo = i * block_size
      yield np.stack([tokens[lo:lo + width], starts[lo:lo + width]])
    if n_full:
      cut = n_full * block_size
      tokens, starts = tokens[cut:], starts[cut:]
  if len(tokens) >= 2:              # at least one target left
    pad = width - len(tokens)
    yield np.stack([np.concatenate([tokens, np.full(pad, -1, np.int32)]),
                    np.concatenate([starts, np.zeros(pad, np.int32)])])


DOCUMENTS = ("separate", "stream")     # data.documents: how a block's documents meet


def check_documents(documents: str, mask_documents: bool) -> None:
  """Refuse a document handling `decode_block` cannot apply (named, with what is allowed)."""
  if documents not in DOCUMENTS:
    raise ValueError(f"documents={documents!r} is invalid: allowed one of {DOCUMENTS}")
  if documents == "stream" and mask_documents:
    raise ValueError("data.documents='stream' attends across documents: allowed only with "
                     "data.mask_documents=False")


def decode_block(block: np.ndarray, *, pad_id: int = 0, mask_documents: bool = True,
                 documents: str = "separate") -> dict[str, np.ndarray]:
  """A stored block [2, T+1] -> a training example of T positions: input_ids,
  target_ids (IGNORE at padding and where the target opens a document), control_flow
  (2, 0 at padding), positions (restart at document starts and at the block start) and,
  with mask_documents, segment_ids (-1 at padding). documents="stream" reads the block
  as nanochat and the LRT release do: positions count from the block start (the memory
  resets at t = 0 only), every target is predicted, no segment ids (attention crosses
  documents; mask_documents must be False)."""
  check_documents(documents, mask_documents)
  tokens, starts = np.asarray(block[0], np.int32), np.asarray(block[1], np.int32)
  inputs, targets = tokens[:-1], tokens[1:].copy()
  real = inputs >= 0
  opens = starts[:-1].copy()
  opens[0] = 1
  if documents == "stream":
    opens[1:] = 0
  targets[(targets < 0) | ((starts[1:] == 1) & (documents == "separate")) | ~real] = IGNORE
  document = np.cumsum(opens) - 1
  first = np.flatnonzero(opens)
  positions = np.arange(len(inputs)) - first[document]
  out = {"input_ids": np.where(real, inputs, pad_id).astype(np.int32),
         "target_ids": targets.astype(np.int32),
         "control_flow": np.where(real, 2, 0).astype(np.int32),
         "positions": np.where(real, positions, 0).astype(np.int32)}
  if mask_documents:
    out["segment_ids"] = np.where(real, document, -1).astype(np.int32)
  return out


def encode_record(block: np.ndarray) -> bytes:
  return np.ascontiguousarray(block, "<i4").tobytes()


def decode_record(record: bytes) -> np.ndarray:
  return np.frombuffer(record, "<i4").reshape(2, -1)


# ----------------------------------------------------------------------- prepared data


def read_manifest(directory: str) -> dict:
  path = os.path.join(directory, MANIFEST)
  if not os.path.isfile(path):
    raise ValueError(f"{directory!r} is not a prepared dataset (no {MANIFEST}; make one with "
                     "python -m t2mlr_jax.data.prepare)")
  with open(path) as f:
    manifest = json.load(f)
  if manifest.get("format") != FORMAT:
    raise ValueError(f"{path}: format {manifest.get('format')!r} is not {FORMAT!r}")
  return manifest


def dataset_tokenizer(directory: str) -> LMTokenizer:
  """The tokenizer a prepared dataset was made with (its own copy)."""
  manifest = read_manifest(directory)
  if manifest["tokenizer"]["kind"] == "byte":
    return byte_tokenizer()
  return hf_lm_tokenizer(os.path.join(directory, TOKENIZER_DIR))


def token_bytes(directory: str) -> np.ndarray:
  return np.load(os.path.join(directory, TOKEN_BYTES))


class BlockSource:
  """Random access to one split of a prepared dataset: decoded blocks (`decode_block`)."""

  def __init__(self, directory: str, split: str, *, mask_documents: bool = True,
               documents: str = "separate"):
    check_documents(documents, mask_documents)       # before any file is read
    manifest = read_manifest(directory)
    if split not in manifest["splits"]:
      raise ValueError(f"{directory!r} has no split {split!r}: allowed "
                       f"{sorted(manifest['splits'])}")
    info = manifest["splits"][split]
    paths = [os.path.join(directory, s) for s in info["shards"]]
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
      raise ValueError(f"{directory!r}: shard {missing[0]!r} named by {MANIFEST} is missing")
    self.block_size = manifest["block_size"]
    self.pad_id = manifest["tokenizer"]["pad_id"]
    self.mask_documents = mask_documents
    self.documents = documents
    self.records = grain.sources.ArrayRecordDataSource(paths)
    if len(self.records) != info["blocks"]:
      raise ValueError(f"{directory!r}: split {split!r} holds {len(self.records)} blocks, "
                       f"{MANIFEST} says {info['blocks']}")

  def __len__(self) -> int:
    return len(self.records)

  def __getitem__(self, index: int) -> dict[str, np.ndarray]:
    return decode_block(decode_record(self.records[index]), pad_id=self.pad_id,
                        mask_documents=self.mask_documents, documents=self.documents)


def spread(source, n: Optional[int]) -> list:
  """n items spread evenly over a random-access source (all of them when n is None or
  not smaller than it): a fixed held-out set that samples every document."""
  if n is not None and n < 1:
    raise ValueError(f"number of blocks {n} is invalid: allowed None (all) or >= 1")
  picks = (range(len(source)) if n is None or n >= len(source)
           else np.unique(np.linspace(0, len(source) - 1, n).round().astype(int)))
  return [source[int(i)] for i in picks]
