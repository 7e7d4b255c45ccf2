"""Generate docs/api.md, the API reference, from the code's docstrings and config sources.

    python docs/gen_api.py                     # print the markdown
    python docs/gen_api.py --write             # write docs/api.md
    python docs/gen_api.py --check-docstrings  # exit 1 if a public function lacks a docstring

Every public function, class and method of the modules in MODULES is listed with its
signature (`inspect.signature`) and docstring; the frozen config dataclasses get a table
of their fields (type, default, and the `# comment` after the field in the source), and
the experiment config (`t2mlr_jax.train.config.base_config()`) a table per group. A
public callable without a docstring is named on stderr as an error line.
tests/test_docs_api.py fails when docs/api.md differs from this script's output.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import inspect
import io
import os
import re
import sys
import textwrap
import tokenize
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUTPUT = os.path.join(ROOT, "docs", "api.md")

# (module, names or None, one-line note). None: the module's `__all__` if it has one, else
# every public (no leading `_`) function and class defined in the module itself.
MODULES = (
    ("t2mlr_jax", ("ModelConfig", "T2MLRConfig", "LRTConfig", "ScheduleOptions", "RopeScaling",
                   "init_params", "forward", "loss", "generate", "stream", "mode_names",
                   "RecurrenceType", "register_recurrence", "Schedule", "register_schedule"),
     "the top-level API (`t2mlr_jax.__all__`)"),
    ("t2mlr_jax.registry", None, "the extension points: recurrence types and schedules, "
     "`--user_module`"),
    ("t2mlr_jax.config", None, "the model config, the base of the recurrence configs, the "
     "schedules' options"),
    ("t2mlr_jax.model.schedules.jacobi", ("JacobiOptions",), "the Jacobi schedule's options"),
    ("t2mlr_jax.model.schedules.interleaved", ("PassOptions",), "the interleaved and chunked "
     "schedules' options"),
    ("t2mlr_jax.model.schedules.multi_refine", ("RefineOptions",), "the multi-refine "
     "schedule's options"),
    ("t2mlr_jax.checkpoint", None, "the loader of training checkpoints and parameter "
     "exports"),
    ("t2mlr_jax.checkpoint", None, "a training run's Orbax checkpoints (save, "
     "restore, resume_step)"),
    ("t2mlr_jax.eval.jobs", None, "the evaluations `python -m t2mlr_jax.evaluate` runs: a "
     "checkpoint, a downstream task, bits per byte"),
    ("t2mlr_jax.serving.chat_session", None, "a chat whose answers stream (`python -m "
     "t2mlr_jax.chat`)"),
    ("t2mlr_jax.convert.hf", None, "Hugging Face Llama-family checkpoints, both ways"),
    ("t2mlr_jax.convert.gguf", None, "GGUF files, both ways"),
    ("t2mlr_jax.convert.official", None, "the official T2MLR release's checkpoints"),
    ("t2mlr_jax.convert.official_lrt", None, "the official LRT release's checkpoints"),
    ("t2mlr_jax.convert.pretrained", None, "any pretrained source by path"),
    ("t2mlr_jax.convert.loading", None, "any model with its tokenizer, by path (lm-eval, "
     "`convert --to-hf`)"),
    ("t2mlr_jax.train.loop", None, "the training loop (`python -m t2mlr_jax.main`)"),
    ("t2mlr_jax.train.config", None, "the experiment config and its validation"),
    ("t2mlr_jax.data.s5_group", None, "the S5 tasks' vocabulary, tokenizer and group algebra"),
    ("t2mlr_jax.data.s5_examples", None, "S5-Retrieval and word-problem examples, their "
     "control flow and metric masks"),
    ("t2mlr_jax.data.s5_curricula", None, "the S5 training curricula (length, group, value "
     "length)"),
    ("t2mlr_jax.data.s5", None, "the S5 tasks' Grain source and batching"),
    ("t2mlr_jax.data.variable_assignment", None, "the variable-assignment task"),
    ("t2mlr_jax.data.pathfinding", None, "the Pathfinding task (the release's generator)"),
    ("t2mlr_jax.data.prosqa", None, "the ProsQA task (Coconut's format)"),
    ("t2mlr_jax.data.hotpotqa", None, "HotpotQA's public files as SFT records"),
    ("t2mlr_jax.data.word_tokenizer", None, "the word-level tokenizer of generated tasks"),
    ("t2mlr_jax.data.generated", None, "a source of generated examples under a token limit"),
    ("t2mlr_jax.eval.hotpotqa", None, "HotpotQA's official answer metrics"),
    ("t2mlr_jax.eval.prosqa", None, "ProsQA scored by generation"),
    ("t2mlr_jax.eval.pathfinding", None, "Pathfinding metrics per path length"),
    ("t2mlr_jax.data.multiple_choice", None, "multiple-choice downstream tasks"),
    ("t2mlr_jax.data.sft", None, "supervised fine-tuning data"),
    ("t2mlr_jax.data.gutenberg", None, "the Shakespeare/Milton text corpus"),
    ("t2mlr_jax.sharding", None, "device mesh and partition specs"),
    ("t2mlr_jax.accel.aot", None, "compiling a config's steps for a TPU slice or a GPU node "
     "(`python -m t2mlr_jax.compile`)"),
    ("t2mlr_jax.accel.topologies", None, "TPU slices and GPU nodes by name, for compiling "
     "without the hardware"),
    ("t2mlr_jax.train.step", None, "the train state and the jitted train step"),
    ("t2mlr_jax.accel.distributed", None, "multi-process runs"),
)

# Classes documented with a field table (their constructor is the table).
TABLE_CLASSES = ("ModelConfig", "T2MLRConfig", "LRTConfig", "RopeScaling")

_HOME = os.path.expanduser("~")


class _Raw:
  """An object whose repr is a given string (to format signatures reproducibly)."""

  def __init__(self, text: str):
    self.text = text

  def __repr__(self) -> str:
    return self.text


def _library_names(reg) -> list:
  """The library's own entries of a registry (a user's, imported in the same process, are
  not the library's API)."""
  return [e.name for e in reg.values() if e.source.startswith("t2mlr_jax.")]


def value_repr(value) -> str:
  """A reproducible repr: no memory addresses, no machine-dependent paths."""
  if inspect.isfunction(value) or inspect.isclass(value) or inspect.isbuiltin(value):
    return getattr(value, "__qualname__", getattr(value, "__name__", repr(value)))
  if isinstance(value, dict):
    return "{" + ", ".join(f"{value_repr(k)}: {value_repr(v)}" for k, v in value.items()) + "}"
  if isinstance(value, (set, frozenset)):
    inner = ", ".join(sorted(value_repr(v) for v in value))
    return f"{type(value).__name__}({{{inner}}})" if value else f"{type(value).__name__}()"
  if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
    inner = ", ".join(value_repr(v) for v in value)
    if isinstance(value, list):
      return f"[{inner}]"
    return f"({inner},)" if len(value) == 1 else f"({inner})"
  text = repr(value)
  if " at 0x" in text or re.search(r"0x[0-9a-fA-F]{6,}", text):
    text = f"<{type(value).__qualname__}>"
  for path, name in ((ROOT, "<repo>"), (_HOME, "~"), (sys.prefix, "<sys.prefix>")):
    if path and len(path) > 1:
      text = text.replace(path, name)
  return text


def _named_default(value, names: dict) -> str:
  """A long default that is one of the module's public constants is shown by its name."""
  text = value_repr(value)
  if len(text) > 40 and not isinstance(value, (str, int, float, bool)):
    for name, const in names.items():
      if const is value and name.isupper() and not name.startswith("_"):
        return name
  return text


def annotation_repr(annotation) -> str:
  if isinstance(annotation, str):
    return annotation
  return inspect.formatannotation(annotation)


def format_signature(name: str, obj, prefix: str = "def ", drop_self: bool = False) -> str:
  """`def name(params) -> ret:` with reproducible defaults, wrapped one parameter a line
  when longer than 88 characters."""
  try:
    sig = inspect.signature(obj)
  except (TypeError, ValueError):
    return f"{prefix}{name}(...)"
  params = list(sig.parameters.values())
  if drop_self and params and params[0].name in ("self", "cls"):
    params = params[1:]
  clean = []
  names = getattr(inspect.unwrap(obj), "__globals__", {})
  for p in params:
    kw = {}
    if p.default is not inspect.Parameter.empty:
      kw["default"] = _Raw(_named_default(p.default, names))
    if p.annotation is not inspect.Parameter.empty:
      kw["annotation"] = _Raw(annotation_repr(p.annotation))
    clean.append(p.replace(**kw))
  ret = sig.return_annotation
  ret = inspect.Signature.empty if ret is inspect.Signature.empty else _Raw(annotation_repr(ret))
  sig = sig.replace(parameters=clean, return_annotation=ret)
  parts = [str(p) for p in sig.parameters.values()]
  # inspect renders '/' and '*' markers only through str(sig); rebuild them from it.
  inner = str(sig.replace(return_annotation=inspect.Signature.empty))[1:-1]
  tail = "" if ret is inspect.Signature.empty else f" -> {ret!r}"
  one_line = f"{prefix}{name}({inner}){tail}:"
  if len(one_line) <= 88:
    return one_line
  items = _split_top_level(inner) if inner else parts
  lead = prefix[:len(prefix) - len(prefix.lstrip())]
  body = "".join(f"{lead}    {item},\n" for item in items)
  return f"{prefix}{name}(\n{body}{lead}){tail}:"


def _split_top_level(text: str) -> list[str]:
  """Split a parameter list at its top-level commas (not those inside brackets/strings)."""
  out, depth, cur, quote = [], 0, "", None
  for ch in text:
    if quote:
      cur += ch
      if ch == quote:
        quote = None
      continue
    if ch in "'\"":
      quote = ch
    elif ch in "([{":
      depth += 1
    elif ch in ")]}":
      depth -= 1
    elif ch == "," and depth == 0:
      out.append(cur.strip())
      cur = ""
      continue
    cur += ch
  if cur.strip():
    out.append(cur.strip())
  return out


def docstring_block(doc: str | None, indent: str) -> str:
  if not doc:
    return f"{indent}...\n"
  doc = doc.replace('"""', r'\"\"\"')
  lines = doc.splitlines()
  if len(lines) == 1 and len(indent) + len(doc) + 6 <= 88:
    return f'{indent}"""{doc}"""\n'
  body = "\n".join((indent + line) if line.strip() else "" for line in lines)
  return f'{indent}"""{body[len(indent):]}\n{indent}"""\n'


def fence(text: str, lang: str = "python") -> str:
  mark = "~~~~" if "```" in text else "```"
  return f"{mark}{lang}\n{text.rstrip()}\n{mark}\n"


def anchor(title: str) -> str:
  """GitHub's heading anchor: lower case, punctuation except - and _ dropped, spaces -."""
  a = re.sub(r"[^\w\- ]", "", title.lower())
  return a.replace(" ", "-")


def md_cell(text: str) -> str:
  return text.replace("|", "\\|").replace("\n", " ")


def code_cell(text: str) -> str:
  return f"`{md_cell(text)}`" if text else ""


# --- comments in the source ---------------------------------------------------------

def _comments(source: str) -> dict[int, tuple[str, bool]]:
  """{line: (comment text, whether the line holds only the comment)}; lines 1-based."""
  out = {}
  lines = source.splitlines()
  for tok in tokenize.generate_tokens(io.StringIO(source).readline):
    if tok.type == tokenize.COMMENT:
      row, col = tok.start
      alone = not lines[row - 1][:col].strip()
      out[row] = (tok.string.lstrip("#").strip(), alone)
  return out


def _leading_comment(comments, line: int, stop: int) -> str:
  """The block of full-line comments directly above `line` (not above `stop`)."""
  got = []
  row = line - 1
  while row > stop and row in comments and comments[row][1]:
    got.append(comments[row][0])
    row -= 1
  return " ".join(reversed(got))


def _trailing_comment(comments, first: int, last: int) -> str:
  return " ".join(comments[r][0] for r in range(first, last + 1)
                  if r in comments and not comments[r][1])


def field_comments(cls) -> dict[str, str]:
  """{field: the `# comment` on its line (or the full-line comments just above it)}, the
  fields of its dataclass bases too."""
  out = {}
  for base in reversed(cls.__mro__[1:]):
    if dataclasses.is_dataclass(base):
      out.update(_own_field_comments(base))
  return {**out, **_own_field_comments(cls)}


def _own_field_comments(cls) -> dict[str, str]:
  source = textwrap.dedent(inspect.getsource(cls))
  comments = _comments(source)
  tree = ast.parse(source)
  out, prev = {}, 0
  for node in tree.body[0].body:
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
      text = " ".join(filter(None, (_leading_comment(comments, node.lineno, prev),
                                    _trailing_comment(comments, node.lineno, node.end_lineno))))
      out[node.target.id] = text
    prev = node.end_lineno
  return out


# --- rendering ----------------------------------------------------------------------

class Renderer:

  def __init__(self):
    self.missing: list[str] = []
    self.out: list[str] = []

  def emit(self, text: str = "") -> None:
    self.out.append(text)

  def need_doc(self, qualname: str, obj) -> str | None:
    doc = inspect.getdoc(obj) if not inspect.isclass(obj) else obj.__dict__.get("__doc__")
    if isinstance(doc, str):
      doc = inspect.cleandoc(doc)
    if not doc:
      self.missing.append(qualname)
    return doc or None

  # -- functions and classes --

  def function(self, qualname: str, name: str, fn) -> None:
    doc = self.need_doc(qualname, fn)
    self.emit(f"### `{name}`\n")
    self.emit(fence(format_signature(name, fn) + "\n" + docstring_block(doc, "  ")))

  def members(self, cls, qualname: str) -> list[tuple[str, object, str]]:
    """Public methods/properties defined by the class or a base class of this library,
    in source order (the class first, then its bases)."""
    seen, out = set(), []
    for klass in cls.__mro__:
      if not klass.__module__.startswith("t2mlr_jax"):
        continue
      for n, raw in klass.__dict__.items():
        if n.startswith("_") or n in seen:
          continue
        if isinstance(raw, property):
          kind = "property"
        elif isinstance(raw, classmethod):
          kind = "classmethod"
        elif isinstance(raw, staticmethod):
          kind = "staticmethod"
        elif inspect.isfunction(raw):
          kind = "method"
        else:
          continue
        seen.add(n)
        out.append((n, raw, kind))
    return out

  def klass(self, modname: str, name: str, cls) -> None:
    qual = f"{modname}.{name}"
    doc = self.need_doc(qual, cls)
    self.emit(f"### `{name}`\n")
    is_table = dataclasses.is_dataclass(cls) and (name in TABLE_CLASSES
                                                  or len(dataclasses.fields(cls)) > 0)
    bases = [b.__name__ for b in cls.__bases__
             if b is not object and not b.__name__.startswith("_")]
    head = f"class {name}" + (f"({', '.join(bases)})" if bases else "") + ":\n"
    text = head + docstring_block(doc, "  ")
    if not is_table and "__init__" in cls.__dict__:
      text += "\n" + format_signature("__init__", cls.__init__, prefix="  def ",
                                       drop_self=False) + "\n"
    self.emit(fence(text))
    if is_table:
      self.field_table(cls)
    for n, raw, kind in self.members(cls, qual):
      self.member(qual, name, n, raw, kind)

  def member(self, qual: str, cls_name: str, n: str, raw, kind: str) -> None:
    fn = raw.fget if kind == "property" else getattr(raw, "__func__", raw)
    doc = self.need_doc(f"{qual}.{n}", fn)
    self.emit(f"#### `{cls_name}.{n}`\n")
    if kind == "property":
      ret = inspect.signature(fn).return_annotation
      ann = "" if ret is inspect.Signature.empty else f" -> {annotation_repr(ret)}"
      sig = f"@property\ndef {n}(self){ann}:"
    else:
      sig = format_signature(n, fn)
      if kind != "method":
        sig = f"@{kind}\n{sig}"
    self.emit(fence(sig + "\n" + docstring_block(doc, "  ")))

  def field_table(self, cls) -> None:
    comments = field_comments(cls)
    self.emit("| field | type | default | comment |")
    self.emit("|---|---|---|---|")
    for f in dataclasses.fields(cls):
      if f.default is not dataclasses.MISSING:
        default = value_repr(f.default)
      elif f.default_factory is not dataclasses.MISSING:
        default = value_repr(f.default_factory())
      else:
        default = ""
      self.emit(f"| `{f.name}` | {code_cell(annotation_repr(f.type))} | {code_cell(default)} "
                f"| {md_cell(comments.get(f.name, ''))} |")
    self.emit()

  def constant(self, name: str, value) -> None:
    self.emit(f"### `{name}`\n")
    self.emit(fence(f"{name} = {value_repr(value)}"))

  # -- modules --

  def public_names(self, mod, names):
    if names is not None:
      return list(names)
    if hasattr(mod, "__all__"):
      return list(mod.__all__)
    out = []
    for n, obj in vars(mod).items():
      if n.startswith("_"):
        continue
      if (inspect.isfunction(obj) or inspect.isclass(obj)) and \
          getattr(obj, "__module__", None) == mod.__name__:
        out.append(n)
    return out

  def module(self, modname: str, names, note: str) -> None:
    mod = importlib.import_module(modname)
    self.emit(f"## `{modname}`\n")
    self.emit(f"*{note}*\n")
    if mod.__doc__:
      self.emit(fence(inspect.cleandoc(mod.__doc__), "text"))
    elif modname != "t2mlr_jax":
      self.missing.append(modname + " (module)")
    for n in self.public_names(mod, names):
      obj = getattr(mod, n)
      if inspect.isclass(obj):
        self.klass(modname, n, obj)
      elif callable(obj):
        self.function(f"{modname}.{n}", n, obj)
      else:
        self.constant(n, obj)
    if modname == "t2mlr_jax.train.config":
      self.experiment_config()

  # -- the experiment config --

  def experiment_config(self) -> None:
    from t2mlr_jax import registry
    from t2mlr_jax.train import config as config_lib
    base = config_lib.base_config()
    order, comments, notes = base_config_comments(config_lib.base_config)
    # the model group is the default family's config class (arch and init_from first),
    # the recurrence group the default type's: their fields and comments
    model_cls = registry.default_family().config
    order["model"] = ["arch", "init_from"] + [f.name for f in dataclasses.fields(model_cls)]
    if "model" not in order["."]:
      order["."].insert(0, "model")
    comments.update({f"model.{k}": v for k, v in field_comments(model_cls).items()})
    comments["model.arch"] = ("a registered model family: "
                              + ", ".join(_library_names(registry.FAMILIES)))
    comments["model.init_from"] = "HF directory or export to start from"
    # the train, optimizer and data groups are built from typed dataclasses too (data: the
    # union of every task's, train/data_configs.py): their fields' order and comments
    typed = {"train": [config_lib.TrainConfig], "optimizer": [config_lib.OptimizerConfig],
             "data": list(config_lib.DATA_CONFIGS.values())}
    for group, classes in typed.items():
      order[group] = []
      for cls in classes:
        order[group] += [f.name for f in dataclasses.fields(cls) if f.name not in order[group]]
        for k, v in field_comments(cls).items():
          comments.setdefault(f"{group}.{k}", v)
      if group not in order["."]:
        order["."].append(group)
    rec_cls = registry.default_recurrence().config
    order["model.recurrence"] = ["type"] + [f.name for f in dataclasses.fields(rec_cls)]
    comments.update({f"model.recurrence.{k}": v for k, v in field_comments(rec_cls).items()})
    comments["model.recurrence.type"] = ("a registered recurrence type: "
                                         + ", ".join(_library_names(registry.RECURRENCES)))
    self.emit("### Experiment config fields\n")
    self.emit("Every field of `base_config()`, by group, with its default (`None`: unset; "
              "the type is what a command-line override must parse as, e.g. "
              "`--config.train.loss_chunk=512`). `model.recurrence` holds the T2MLR fields "
              "by default; `recurrence_config(\"lrt\")` (or `\"t2mlr\"`) builds the group "
              "of one type with every field of its config class "
              "([`T2MLRConfig`](#t2mlrconfig), [`LRTConfig`](#lrtconfig)), and "
              "`model.recurrence.type=\"none\"` is the plain transformer.\n")
    for group in order["."]:
      self.emit(f"#### `{group}`\n")
      if notes.get(group):
        self.emit(notes[group] + "\n")
      self.emit("| field | type | default | comment |")
      self.emit("|---|---|---|---|")
      for key, value, typ in _walk(base[group], group, order):
        self.emit(f"| `{key}` | {code_cell(typ)} | {code_cell(value_repr(value))} "
                  f"| {md_cell(comments.get(key, ''))} |")
      self.emit()

  def render(self) -> str:
    self.emit("# API reference\n")
    self.emit("Generated from the code's docstrings and config sources by "
              "`python docs/gen_api.py --write`; do not edit by hand "
              "(`tests/test_docs_api.py` fails when this file is out of date). "
              "Design notes: [design.md](design.md); conversions: "
              "[converting.md](converting.md).\n")
    for modname, _, note in MODULES:
      self.emit(f"- [`{modname}`](#{anchor(modname)}): {note}")
    self.emit()
    for modname, names, note in MODULES:
      self.module(modname, names, note)
    return "\n".join(self.out).rstrip() + "\n"


def _walk(group, prefix: str, order):
  """(dotted key, default, type) of a ConfigDict group, in source order, recursing."""
  from ml_collections import config_dict
  keys = list(order.get(prefix, []))
  keys += sorted(k for k in group.keys() if k not in keys)
  for k in keys:
    if k not in group:
      continue
    value = group[k]
    dotted = f"{prefix}.{k}"
    if isinstance(value, config_dict.ConfigDict):
      yield from _walk(value, dotted, order)
      continue
    typ = group.get_type(k)
    name = getattr(typ, "__name__", str(typ))
    if value is None:
      name = f"Optional[{name}]" if typ is not type(None) else "None"
    yield dotted, value, name


def base_config_comments(fn):
  """From base_config's source: the key order of every group ({"."(top): [groups], group:
  [keys], ...}), each dotted key's comment and each group's note (the comments above
  `c.group = dict(...)`)."""
  source = textwrap.dedent(inspect.getsource(fn))
  comments = _comments(source)
  tree = ast.parse(source)
  order: dict[str, list[str]] = {".": []}
  out: dict[str, str] = {}
  notes: dict[str, str] = {}

  def add(prefix, key):
    order.setdefault(prefix, [])
    if key not in order[prefix]:
      order[prefix].append(key)

  def visit_dict(call: ast.Call, prefix: str, stop: int):
    prev = stop
    for kw in call.keywords:
      if kw.arg is None:
        continue
      dotted = f"{prefix}.{kw.arg}"
      add(prefix, kw.arg)
      if isinstance(kw.value, ast.Call) and getattr(kw.value.func, "id", None) == "dict":
        visit_dict(kw.value, dotted, prev)
      else:
        text = " ".join(filter(None, (
            _leading_comment(comments, kw.lineno, prev),
            _trailing_comment(comments, kw.value.end_lineno, kw.value.end_lineno)
            if not _other_keyword_on(call, kw) else "")))
        if text:
          out[dotted] = text
      prev = kw.value.end_lineno

  prev = tree.body[0].lineno
  for node in tree.body[0].body:
    if isinstance(node, ast.Assign) and len(node.targets) == 1:
      target = ast.unparse(node.targets[0])
      if target.startswith("c."):
        path = target[2:]
        lead = _leading_comment(comments, node.lineno, prev)
        if isinstance(node.value, ast.Call) and getattr(node.value.func, "id", None) == "dict":
          add(".", path)
          if lead:
            notes[path] = lead
          visit_dict(node.value, path, node.lineno - 1)
        else:
          text = " ".join(filter(None, (lead, _trailing_comment(
              comments, node.lineno, node.end_lineno))))
          if text:
            out[path] = text
    prev = node.end_lineno
  return order, out, notes


def _other_keyword_on(call: ast.Call, kw: ast.keyword) -> bool:
  """Whether another keyword of `call` ends on the line `kw` ends on (then a trailing
  comment there is ambiguous and attached to no field)."""
  line = kw.value.end_lineno
  return any(k is not kw and k.value.end_lineno == line for k in call.keywords)


def generate() -> tuple[str, list[str]]:
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    r = Renderer()
    text = r.render()
  return text, r.missing


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--write", action="store_true", help=f"write {OUTPUT}")
  parser.add_argument("--check-docstrings", action="store_true",
                      help="exit 1 if a public function, class or method lacks a docstring")
  args = parser.parse_args(argv)
  sys.path.insert(0, ROOT)
  text, missing = generate()
  for name in missing:
    print(f"error: {name} has no docstring", file=sys.stderr)
  if args.write:
    with open(OUTPUT, "w", encoding="utf-8") as f:
      f.write(text)
    print(f"wrote {os.path.relpath(OUTPUT, ROOT)} ({len(text)} characters)", file=sys.stderr)
  elif not args.check_docstrings:
    sys.stdout.write(text)
  if args.check_docstrings and missing:
    print(f"{len(missing)} public names lack a docstring", file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
