"""One name per concept: the names docs/design.md#glossary retires are gone from the package.

The retired names are read from the glossary's table (its last column), so the glossary
and the code cannot drift apart. Identifiers only (Python's tokenizer: strings, comments
and docstrings may quote a paper's letters); `kind` is kept for one meaning, a device's
kind, so it is checked on its own."""

import io
import os
import re
import tokenize

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "t2mlr_jax")

# Deprecated aliases kept on purpose, (file, name): ModelConfig.recurrent_block for users'
# code.
ALIASES = {("config.py", "recurrent_block")}

# `kind` means a device's kind (JAX's `device_kind`) and nothing else; these files use it.
KIND_FILES = {"accel/topologies.py", "flops.py", "model/kernels.py"}


def _glossary_retired() -> set:
  with open(os.path.join(ROOT, "docs", "design.md"), encoding="utf-8") as f:
    text = f.read()
  section = text.split("\n## Glossary\n", 1)[1].split("\n## ", 1)[0]
  rows = [line for line in section.splitlines() if line.startswith("|")][2:]
  assert rows, "docs/design.md#glossary has no table"
  retired = set()
  for row in rows:
    cells = [c.strip() for c in row.strip("|").split("|")]
    retired |= set(re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", cells[-1]))
  return retired


def _package_files():
  for dirpath, _, files in os.walk(PACKAGE):
    for name in sorted(files):
      if name.endswith(".py"):
        rel = os.path.relpath(os.path.join(dirpath, name), PACKAGE).replace(os.sep, "/")
        yield rel


def _identifiers(rel: str):
  """(name, line, follows a dot) of every identifier token of the file."""
  with open(os.path.join(PACKAGE, rel), encoding="utf-8") as f:
    source = f.read()
  prev = None
  for tok in tokenize.generate_tokens(io.StringIO(source).readline):
    if tok.type == tokenize.NAME:
      yield tok.string, tok.start[0], prev is not None and prev.string == "."
    if tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT):
      prev = tok


def test_the_glossary_retires_names():
  retired = _glossary_retired()
  assert {"R", "S_BTD", "Z_BTD", "recurrent_block", "kv_kind", "views"} <= retired


def test_no_retired_name_in_the_package():
  retired = _glossary_retired()
  found = [f"t2mlr_jax/{rel}:{line}: {name}"
           for rel in _package_files()
           for name, line, _ in _identifiers(rel)
           if name in retired and (rel, name) not in ALIASES]
  assert not found, ("names docs/design.md#glossary retires:\n" + "\n".join(found))


def test_kind_means_a_device_kind():
  found = [f"t2mlr_jax/{rel}:{line}"
           for rel in _package_files()
           if rel not in KIND_FILES
           for name, line, attribute in _identifiers(rel)
           if name == "kind" and not attribute]      # numpy's dtype.kind is numpy's
  assert not found, ("`kind` other than a device's kind (docs/design.md#glossary):\n"
                     + "\n".join(found))
