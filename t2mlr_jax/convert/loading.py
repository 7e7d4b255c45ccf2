"""Load any model the library reads together with its tokenizer, from one path.

    cfg, params, tokenizer = load_model_and_tokenizer("workdirs/lm")      # latest step
    cfg, params, tokenizer = load_model_and_tokenizer("model.gguf")

The sources: a GGUF file (its own tokenizer, rebuilt from the metadata), a Hugging Face
directory or a parameter export (the tokenizer files beside the weights), a training
workdir (its task's own vocabulary when `own` is given: S5's, from
`train.tasks.own_tokenizer`, which the commands chat, serve, evaluate and lm_eval pass;
an lm run's prepared-data copy of its tokenizer; else `data.tokenizer` or `model.init_from` of its saved config). `tokenizer=`
overrides the search; a model without a tokenizer is an error naming every place that
was looked at.

One loader for every command: `chat`, `evaluate`, the lm-evaluation-harness adapter
(`t2mlr_jax.lm_eval`) and `convert --to-hf` open models here. `field` names the argument
that gave the path in error messages (`--model` on the command line). Parameters come
back on the device whatever the source (a GGUF's and a Hugging Face directory's are read
as numpy arrays: a jitted step given those copies every weight to the device at each
call, 2.5 times SmolLM2's decode time on a CPU).
"""

from __future__ import annotations

import os
from typing import Callable, NamedTuple, Optional

import jax

from t2mlr_jax import checkpoint
from t2mlr_jax.convert import hf
from t2mlr_jax.convert.gguf import _open, from_gguf, read_metadata, tokenizer_from_gguf
from t2mlr_jax.data import lm
from t2mlr_jax.data.byte_tokenizer import ByteTokenizer
from t2mlr_jax.data.tokenizer import load_tokenizer

MODEL_SOURCES = ("allowed a GGUF file (*.gguf), a Hugging Face directory (config.json and "
                 "*.safetensors), a parameter export (python -m t2mlr_jax.convert) or a "
                 "training workdir (with checkpoints/)")


class FoundTokenizer(NamedTuple):
  """A tokenizer and what the search learned about it."""
  tokenizer: object            # HFTokenizer or the byte tokenizer (data.byte_tokenizer)
  source: str                  # where it came from ("byte" for the byte tokenizer)
  documents_start_with_bos: bool   # an lm workdir: packing put BOS before every document


def _source_format(path: str, field: str = "path") -> str:
  """'gguf', 'hf', 'export' or 'workdir' (ValueError naming the allowed sources)."""
  if path.endswith(".gguf"):
    if not os.path.isfile(path):
      raise ValueError(f"{field}={path!r} does not exist: {MODEL_SOURCES}")
    return "gguf"
  if not os.path.exists(path):
    raise ValueError(f"{field}={path!r} does not exist: {MODEL_SOURCES}")
  if checkpoint.is_export(path):
    return "export"
  if os.path.isdir(os.path.join(path, "checkpoints")):
    return "workdir"
  if os.path.isfile(os.path.join(path, "config.json")):
    return "hf"
  what = "a file" if os.path.isfile(path) else "a directory with no checkpoints/"
  raise ValueError(f"{field}={path!r} is {what}, not a model: {MODEL_SOURCES}")


def _has_tokenizer_json(directory) -> bool:
  return bool(directory) and os.path.isfile(os.path.join(str(directory), "tokenizer.json"))


def find_tokenizer(path: str, step: Optional[int] = None, *, field: str = "path",
                   own: Optional[Callable] = None) -> FoundTokenizer:
  """The tokenizer a model at `path` came with (see the module docstring for the order).
  own: (a workdir's saved config) -> the tokenizer of its task's own vocabulary, or None.
  ValueError listing the places looked at when there is none."""
  fmt = _source_format(path, field)
  if fmt == "gguf":
    return FoundTokenizer(tokenizer_from_gguf(read_metadata(_open(path)), path), path, False)
  looked = [os.path.join(path, "tokenizer.json")]
  if _has_tokenizer_json(path):
    return FoundTokenizer(load_tokenizer(path), path, False)
  if fmt == "workdir":
    config = checkpoint.load_config(path, step)
    data = config.get("data", {})
    if own is not None:
      looked.append(f"the vocabulary of data.task={data.get('task')!r}")
      if own(config) is not None:
        return FoundTokenizer(own(config), f"data.task={data.get('task')}", False)
    if data.get("task") == "lm" and data.get("path"):
      manifest_file = os.path.join(data.path, lm.MANIFEST)
      looked.append(manifest_file)
      if os.path.isfile(manifest_file):
        manifest = lm.read_manifest(data.path)
        bos = manifest["tokenizer"].get("bos_id") is not None
        if manifest["tokenizer"]["kind"] == "byte":
          return FoundTokenizer(ByteTokenizer(), "byte", True)
        copy = os.path.join(data.path, lm.TOKENIZER_DIR)
        looked.append(os.path.join(copy, "tokenizer.json"))
        if _has_tokenizer_json(copy):
          return FoundTokenizer(load_tokenizer(copy), copy, bos)
    for key in ("data.tokenizer", "model.init_from"):
      section, name = key.split(".")
      where = config.get(section, {}).get(name)
      if where:
        looked.append(f"{os.path.join(where, 'tokenizer.json')} ({key})")
        if _has_tokenizer_json(where):
          return FoundTokenizer(load_tokenizer(where), where, False)
  flag = "--tokenizer" if field.startswith("--") else "tokenizer"
  raise ValueError(f"no tokenizer found for {path!r}: looked at {', '.join(looked)}; pass "
                   f"{flag}=DIR (a directory with tokenizer.json)")


def load_model(path: str, step: Optional[int] = None, *, dtype: str = "float32",
               field: str = "path"):
  """(cfg, params) of any source (GGUF parameters dequantized to `dtype`)."""
  fmt = _source_format(path, field)
  if step is not None and fmt != "workdir":
    raise ValueError(f"step={step} is invalid for {path!r} ({fmt}): allowed only with a "
                     "training workdir (its saved steps)")
  if fmt == "gguf":
    cfg, params, _ = from_gguf(path, dtype=dtype)
    return cfg, jax.device_put(params)
  if fmt == "hf":
    cfg, params = hf.from_hf(path)
    return cfg, jax.device_put(params)
  return checkpoint.load(path, step)


def load_model_and_tokenizer(path: str, step: Optional[int] = None,
                             tokenizer: Optional[str] = None, *, dtype: str = "float32",
                             field: str = "path", own: Optional[Callable] = None):
  """(cfg, params, FoundTokenizer) of any source; `tokenizer` (a directory with
  tokenizer.json) overrides the model's own; `own` as `find_tokenizer`'s. The tokenizer
  is found (or refused) before the weights are read."""
  override = None
  if tokenizer is not None:
    if not _has_tokenizer_json(tokenizer):
      flag = "--tokenizer" if field.startswith("--") else "tokenizer"
      raise ValueError(f"{flag}={tokenizer!r} is invalid: allowed a directory with "
                       "tokenizer.json")
    override = FoundTokenizer(load_tokenizer(tokenizer), tokenizer, False)
  if _source_format(path, field) == "gguf":
    if step is not None:
      raise ValueError(f"step={step} is invalid for the GGUF file {path!r}: allowed only "
                       "with a training workdir")
    cfg, params, tok = from_gguf(path, dtype=dtype)
    return cfg, jax.device_put(params), override or FoundTokenizer(tok, path, False)
  found = override or find_tokenizer(path, step, field=field, own=own)
  cfg, params = load_model(path, step, dtype=dtype, field=field)
  return cfg, params, found
