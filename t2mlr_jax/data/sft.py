"""Supervised fine-tuning data: GSM8K-Aug and {prompt, response} records, from JSONL
files, `.json` files of one list (Coconut's ProsQA), or prepared TensorFlow Datasets
(`tfds:NAME:SPLIT`).

A record becomes one example: the prompt is non-recurrent (cf 1), the response
and its EOS recurrent (cf 2), and only the response (with EOS) is supervised
(next-token targets). GSM8K-Aug (docs/experiments.md#tasks): {question, steps, answer}
with response = steps joined by newlines + "\\n### " + answer, prompt = question +
"\\n\\n", or the tokenizer's chat template with the question as the user turn.

Packing puts several examples (documents) in one row: per-document position ids restart
at 0 (which also resets the recurrent state) and attention stays inside a document.
"""

from __future__ import annotations

import json
import os
from typing import Optional, Sequence

import numpy as np
import tensorflow_datasets as tfds

from t2mlr_jax.losses import IGNORE

FORMATS = ("auto", "gsm8k_aug", "prompt_response")


def read_jsonl(path: str) -> list[dict]:
  """The records (one JSON object per line) of a local JSONL file."""
  if not os.path.isfile(path):
    raise ValueError(f"data file {path!r} does not exist")
  records = []
  with open(path) as f:
    for n, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        records.append(json.loads(line))
      except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{n}: not valid JSON ({e})") from e
  if not records:
    raise ValueError(f"{path} holds no records")
  return records


TFDS_PREFIX = "tfds:"


def _to_text(value):
  """tfds yields Text features as bytes (and sequences as lists/arrays of bytes)."""
  if isinstance(value, bytes):
    return value.decode("utf-8")
  if isinstance(value, np.ndarray):
    return _to_text(value.tolist()) if value.dtype.kind in "OSU" else value
  if isinstance(value, (list, tuple)):
    return [_to_text(v) for v in value]
  if isinstance(value, dict):
    return {k: _to_text(v) for k, v in value.items()}
  return value


def open_tfds(spec: str, data_dir: Optional[str] = None):
  """(random-access source, name, split) of a prepared TFDS dataset: spec = "NAME:SPLIT"
  (NAME may carry /config and :version; SPLIT takes TFDS slicing, e.g. train[:1000]).
  Read through `tfds.data_source` (ArrayRecord, no TensorFlow); nothing is downloaded."""
  head, bracket, slicing = spec.partition("[")      # slicing may hold ':' itself
  name, sep, split = head.rpartition(":")
  split += bracket + slicing
  if not sep or not name or not split:
    raise ValueError(f"data path {TFDS_PREFIX + spec!r} is invalid: allowed "
                     f"'{TFDS_PREFIX}NAME:SPLIT', e.g. 'tfds:gsm8k:train'")
  try:
    source = tfds.data_source(name, split=split, data_dir=data_dir, download=False)
  except Exception as e:     # tfds raises several types; all mean "not readable here"
    raise ValueError(f"cannot read TFDS dataset {name!r} split {split!r} from data_dir="
                     f"{data_dir or 'the TFDS default'}: {str(e).splitlines()[0]} (prepare it "
                     "with tfds build, in the ArrayRecord format)") from e
  return source, name, split


def read_tfds(spec: str, data_dir: Optional[str] = None) -> list[dict]:
  """Records of a prepared TFDS dataset (see `open_tfds`), as Python values."""
  source, name, split = open_tfds(spec, data_dir)
  records = [_to_text(dict(source[i])) for i in range(len(source))]
  if not records:
    raise ValueError(f"TFDS dataset {name!r} split {split!r} holds no records")
  return records


def read_json_list(path: str) -> list[dict]:
  """The records of a local file holding one JSON list of objects (Coconut's ProsQA files,
  HotpotQA's)."""
  if not os.path.isfile(path):
    raise ValueError(f"data file {path!r} does not exist")
  with open(path) as f:
    try:
      records = json.load(f)
    except json.JSONDecodeError as e:
      raise ValueError(f"{path}: not valid JSON ({e}); allowed a JSON list of records, or "
                       "JSONL under another extension") from e
  if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
    raise ValueError(f"{path} is not a JSON list of objects: allowed a list of records")
  if not records:
    raise ValueError(f"{path} holds no records")
  return records


def read_records(path: str, tfds_data_dir: Optional[str] = None) -> list[dict]:
  """Records from a JSONL file, a `.json` file holding one list of them, or, for paths
  'tfds:NAME:SPLIT', a prepared TFDS dataset."""
  if path.startswith(TFDS_PREFIX):
    return read_tfds(path[len(TFDS_PREFIX):], tfds_data_dir)
  if path.endswith(".json"):
    return read_json_list(path)
  return read_jsonl(path)


def detect_format(record: dict) -> str:
  """"gsm8k_aug" ({question, answer[, steps]}) or "prompt_response" ({prompt, response})."""
  if {"question", "answer"} <= set(record):
    return "gsm8k_aug"
  if {"prompt", "response"} <= set(record):
    return "prompt_response"
  raise ValueError(f"record with keys {sorted(record)} matches no format: allowed "
                   "{question, steps, answer} (GSM8K-Aug) or {prompt, response}")


def gsm8k_aug_response(record: dict) -> str:
  """The training response of a GSM8K-Aug record: its steps, one per line, then `### answer`."""
  steps = record.get("steps") or []
  if isinstance(steps, str):
    steps = [steps]
  return "\n".join(list(steps) + [f"### {record['answer']}"])


def prompt_and_response(record: dict, fmt: str = "auto", tokenizer=None,
                        chat: bool = False) -> tuple[str, str]:
  """The (prompt text, response text) of a record (chat template applied if asked)."""
  if fmt not in FORMATS:
    raise ValueError(f"format={fmt!r} is invalid: allowed one of {FORMATS}")
  fmt = detect_format(record) if fmt == "auto" else fmt
  if fmt == "gsm8k_aug":
    question, response = record["question"], gsm8k_aug_response(record)
  else:
    question, response = record["prompt"], record["response"]
  if chat:
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": question}],
                                           add_generation_prompt=True)
  else:
    prompt = question + "\n\n" if fmt == "gsm8k_aug" else question
  return prompt, response


def tokenize_record(record: dict, tokenizer, *, fmt: str = "auto", chat: bool = False,
                    add_bos: bool = False, prompt_cf: int = 1) -> dict[str, np.ndarray]:
  """input_ids, target_ids (response + EOS only) and control_flow (prompt `prompt_cf`: 1
  non-recurrent, 2 recurrent as the release's CONTROL_FLOW_ALL_RECURRENT; response 2)."""
  if prompt_cf not in (1, 2):
    raise ValueError(f"prompt_cf={prompt_cf!r} is invalid: allowed 1 or 2")
  if tokenizer.eos_id is None:
    raise ValueError("the tokenizer has no eos_token: SFT responses end with EOS")
  prompt, response = prompt_and_response(record, fmt, tokenizer, chat)
  p = tokenizer.encode(prompt)
  if add_bos and tokenizer.bos_id is not None:
    p = [tokenizer.bos_id] + p
  r = tokenizer.encode(response) + [tokenizer.eos_id]
  if not p:
    raise ValueError("a record has an empty prompt")
  ids = np.asarray(p + r, np.int32)
  targets = np.full(len(ids), IGNORE, np.int32)
  targets[len(p) - 1:-1] = r
  cf = np.asarray([prompt_cf] * len(p) + [2] * len(r), np.int32)
  return dict(input_ids=ids, target_ids=targets, control_flow=cf)


def pack(examples: Sequence[dict], seq_len: int, *,
         too_long: str = "error") -> list[dict[str, np.ndarray]]:
  """First-fit packing into rows of seq_len with segment_ids and per-document positions.

  too_long: "error" (default: nothing is silently truncated) or "drop" (skip
  examples longer than seq_len). Unused slots are padding (cf 0, target -100,
  segment_ids -1).
  """
  if too_long not in ("error", "drop"):
    raise ValueError(f"too_long={too_long!r} is invalid: allowed 'error' or 'drop'")
  rows: list[list[dict]] = []
  space: list[int] = []
  for i, ex in enumerate(examples):
    n = len(ex["input_ids"])
    if n > seq_len:
      if too_long == "drop":
        continue
      raise ValueError(f"example {i} has {n} tokens > seq_len={seq_len}: raise seq_len or "
                       "pass too_long='drop' (examples are never truncated)")
    for r, free in enumerate(space):
      if free >= n:
        rows[r].append(ex)
        space[r] -= n
        break
    else:
      rows.append([ex])
      space.append(seq_len - n)
  return [_pack_row(row, seq_len) for row in rows]


def _pack_row(row: list[dict], seq_len: int) -> dict[str, np.ndarray]:
  out = {"input_ids": np.zeros(seq_len, np.int32),
         "target_ids": np.full(seq_len, IGNORE, np.int32),
         "control_flow": np.zeros(seq_len, np.int32),
         "positions": np.zeros(seq_len, np.int32),
         "segment_ids": np.full(seq_len, -1, np.int32)}
  at = 0
  for s, ex in enumerate(row):
    n = len(ex["input_ids"])
    for key in ("input_ids", "target_ids", "control_flow"):
      out[key][at:at + n] = ex[key]
    out["positions"][at:at + n] = np.arange(n)
    out["segment_ids"][at:at + n] = s
    at += n
  return out


class SFTSource:
  """Random-access source of tokenized (optionally packed) SFT examples from a JSONL
  file or a TFDS dataset (`read_records`)."""

  def __init__(self, path: str, tokenizer, *, seq_len: int, fmt: str = "auto",
               chat: bool = False, add_bos: bool = False, packed: bool = True,
               too_long: str = "error", limit: Optional[int] = None,
               tfds_data_dir: Optional[str] = None, prompt_cf: int = 1):
    records = read_records(path, tfds_data_dir)[:limit]
    examples = [tokenize_record(r, tokenizer, fmt=fmt, chat=chat, add_bos=add_bos,
                                prompt_cf=prompt_cf) for r in records]
    if packed:
      self.items = pack(examples, seq_len, too_long=too_long)
    else:   # one example per row (padded by the pipeline); same length rule as packing
      fits = [ex for ex in examples if len(ex["input_ids"]) <= seq_len]
      if len(fits) < len(examples) and too_long == "error":
        longest = max(len(ex["input_ids"]) for ex in examples)
        raise ValueError(f"{path}: an example has {longest} tokens > seq_len={seq_len} "
                         "(examples are never truncated; pass too_long='drop' to skip them)")
      self.items = fits
    self.num_records = len(records)

  def __len__(self) -> int:
    return len(self.items)

  def __getitem__(self, index: int) -> dict[str, np.ndarray]:
    return self.items[index]


def repeat(source, num_examples: int):
  """A view of `source` cycled to num_examples items (epochs for a fixed step budget)."""
  return _Repeated(source, num_examples)


class _Repeated:
  def __init__(self, source, n):
    if len(source) == 0:
      raise ValueError("the data source is empty")
    self.source, self.n = source, n

  def __len__(self):
    return self.n

  def __getitem__(self, index):
    return self.source[index % len(self.source)]

