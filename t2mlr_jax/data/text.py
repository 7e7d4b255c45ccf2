"""Raw text behind one interface: documents (strings) from local files or a prepared TFDS
dataset, for tokenising and packing (`t2mlr_jax.data.prepare`).

A source spec is one of
  * a path or glob of `.txt` files (each file one document), `.jsonl` files (one record
    per line, the document in `text_field`) or `.parquet` files (one row per document,
    the column `text_field`); several globs separated by commas;
  * `tfds:NAME:SPLIT` — a TFDS dataset already prepared under `data_dir` (read with
    `tfds.data_source`, nothing downloaded), the document in `text_field`.
A path that matches nothing, a file without documents, or a missing field is an error
that says where it looked.
"""

from __future__ import annotations

import glob
import json
import os
from typing import Iterator, Optional

import pyarrow.parquet as pq

from t2mlr_jax.data.sft import _to_text, open_tfds

TEXT_SUFFIXES = (".txt", ".jsonl", ".parquet")
TFDS_PREFIX = "tfds:"


def _field(record: dict, field: str, where: str) -> str:
  if field not in record:
    raise ValueError(f"{where}: no text field {field!r} (the record has "
                     f"{sorted(record)}): pass text_field= one of them")
  value = record[field]
  if isinstance(value, bytes):
    value = value.decode("utf-8")
  if not isinstance(value, str):
    raise ValueError(f"{where}: field {field!r} holds {type(value).__name__}, not text")
  return value


def expand(spec: str) -> list[str]:
  """The files a comma-separated list of paths / globs names, sorted; an error if any
  part matches no file or names an unsupported type."""
  files = []
  for part in (p.strip() for p in spec.split(",")):
    if not part:
      continue
    matched = sorted(glob.glob(os.path.expanduser(part), recursive=True))
    matched = [f for f in matched if os.path.isfile(f)]
    if not matched:
      raise ValueError(f"text source {part!r} matches no file (looked for "
                       f"{os.path.abspath(os.path.expanduser(part))})")
    for f in matched:
      if not f.endswith(TEXT_SUFFIXES):
        raise ValueError(f"text source file {f!r} has an unsupported type: allowed "
                         f"{', '.join(TEXT_SUFFIXES)}")
    files.extend(matched)
  if not files:
    raise ValueError(f"text source {spec!r} names no file")
  return files


def _read_txt(path: str) -> Iterator[str]:
  with open(path, encoding="utf-8") as f:
    text = f.read()
  if text.strip():
    yield text


def jsonl_records(path) -> Iterator[tuple[int, dict]]:
  """(line number, record) for each non-blank line; ValueError on bad JSON / non-objects."""
  with open(path, encoding="utf-8") as f:
    for lineno, line in enumerate(f, start=1):
      if not line.strip():
        continue
      try:
        rec = json.loads(line)
      except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{lineno}: invalid JSON ({e.msg})") from None
      if not isinstance(rec, dict):
        raise ValueError(
            f"{path}:{lineno}: expected a JSON object, got {type(rec).__name__}")
      yield lineno, rec


def _read_jsonl(path: str, field: str) -> Iterator[str]:
  for n, record in jsonl_records(path):
    yield _field(record, field, f"{path}:{n}")


def _read_parquet(path: str, field: str) -> Iterator[str]:
  table = pq.ParquetFile(path)
  names = table.schema_arrow.names
  if field not in names:
    raise ValueError(f"{path}: no text column {field!r} (columns: {names}): pass "
                     "text_field= one of them")
  for batch in table.iter_batches(columns=[field]):
    for value in batch.column(0).to_pylist():
      if value is not None:
        yield value


def _read_tfds(spec: str, field: str, data_dir: Optional[str]) -> Iterator[str]:
  source, name, split = open_tfds(spec, data_dir)
  if len(source) == 0:
    raise ValueError(f"TFDS dataset {name!r} split {split!r} holds no records")
  for i in range(len(source)):
    yield _field(_to_text(dict(source[i])), field, f"tfds {name}:{split} record {i}")


def iter_documents(spec: str, *, text_field: str = "text",
                   tfds_data_dir: Optional[str] = None) -> Iterator[str]:
  """Every non-empty document of a source spec, in a fixed order (files sorted)."""
  if spec.startswith(TFDS_PREFIX):
    yield from (d for d in _read_tfds(spec[len(TFDS_PREFIX):], text_field, tfds_data_dir)
                if d.strip())
    return
  for path in expand(spec):
    found = False
    if path.endswith(".txt"):
      docs = _read_txt(path)
    elif path.endswith(".jsonl"):
      docs = _read_jsonl(path, text_field)
    else:
      docs = _read_parquet(path, text_field)
    for doc in docs:
      if doc.strip():
        found = True
        yield doc
    if not found:
      raise ValueError(f"text source file {path!r} holds no document (empty, or only "
                       "blank text)")
