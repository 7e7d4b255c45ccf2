"""The package's shape, as docs/design.md states it: no import circle between its modules
(at module level or inside functions, through the package's `__init__` too), imports at the
top of their modules (in a function only an optional dependency's), each schedule one file
that imports no recurrence type, and no branch on the recurrence type outside its config
class, its module and the converters of its official checkpoints."""

import ast
import os
import re
import subprocess
import sys

import pytest

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                       "t2mlr_jax")


def _modules() -> dict:
  out = {}
  for folder, _, files in os.walk(PACKAGE):
    for f in files:
      if f.endswith(".py"):
        path = os.path.join(folder, f)
        name = "t2mlr_jax" + path[len(PACKAGE):-3].replace(os.sep, ".")
        out[name[:-len(".__init__")] if name.endswith(".__init__") else name] = path
  return out


def _imports(path: str, modules: dict) -> set:
  """The package's modules a file imports (anywhere in it). `from P import X` imports the
  submodule P.X when there is one, else a name of P's `__init__` (which runs everything
  that `__init__` imports): `from t2mlr_jax import sharding` is an edge to
  t2mlr_jax.sharding, `from t2mlr_jax import forward` (or `import t2mlr_jax`) one to
  t2mlr_jax itself."""
  found = set()
  for node in ast.walk(ast.parse(open(path).read())):
    # the package's __init__ imports its public names on first use: `_API` maps each to
    # its module, an import as real as a statement's once a name is asked for
    if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "_API":
      found.update(module for module, _ in ast.literal_eval(node.value).values())
    if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("t2mlr_jax"):
      for a in node.names:
        sub = f"{node.module}.{a.name}"
        found.add(sub if sub in modules else node.module)
    elif isinstance(node, ast.Import):
      found.update(a.name for a in node.names if a.name.startswith("t2mlr_jax"))
  return {m for m in found if m in modules}


def _cycles(graph: dict) -> list:
  """Strongly connected components with more than one module (Tarjan)."""
  index, low, stack, on, out = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on.add(v)
    for w in graph[v]:
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      comp = []
      while True:
        w = stack.pop()
        on.discard(w)
        comp.append(w)
        if w == v:
          break
      if len(comp) > 1:
        out.append(sorted(comp))
  for v in graph:
    if v not in index:
      visit(v)
  return out


def test_no_import_circle():
  modules = _modules()
  graph = {m: _imports(p, modules) - {m} for m, p in modules.items()}
  # the package's __init__ is a node like any other: a module taking a re-exported name
  # from it (`from t2mlr_jax import __version__`) must not be imported by the API it
  # re-exports, or `import t2mlr_jax` fails half-initialized
  assert "t2mlr_jax" in graph and graph["t2mlr_jax"]
  assert _cycles(graph) == []


def test_imports_name_submodules_or_the_init(tmp_path):
  modules = _modules()
  f = tmp_path / "m.py"
  f.write_text("from t2mlr_jax import sharding\n")
  assert _imports(str(f), modules) == {"t2mlr_jax.sharding"}
  f.write_text("def g():\n  from t2mlr_jax import forward, paths\n")
  assert _imports(str(f), modules) == {"t2mlr_jax", "t2mlr_jax.paths"}
  f.write_text("import t2mlr_jax\nfrom t2mlr_jax.model import recurrence as rec\n"
               "from t2mlr_jax.model.modes import forward\n")
  assert _imports(str(f), modules) == {"t2mlr_jax", "t2mlr_jax.model.recurrence",
                                       "t2mlr_jax.model.modes"}


# The package root: the contracts every room reads, and the `python -m` commands; each
# concern has a room (a subpackage) of its own.
CONTRACTS = {"registry", "config", "losses", "flops", "sharding", "paths", "checkpoint", "cli"}
COMMAND_STEMS = {"main", "evaluate", "chat", "serve", "compile", "lm_eval"}
ROOMS = {"model", "data", "eval", "train", "convert", "serving", "accel"}


def test_the_root_holds_contracts_commands_and_rooms():
  entries = {os.path.splitext(e)[0] for e in os.listdir(PACKAGE)
             if not e.startswith(("_", ".")) and (e.endswith(".py") or
                                                 os.path.isdir(os.path.join(PACKAGE, e)))}
  assert entries == CONTRACTS | COMMAND_STEMS | ROOMS


def _room(module: str) -> str:
  """A module's node in the rooms' graph: its room, or itself at the root. accel's modules
  are a node each: its device facts (platforms, topologies) sit below the model (kernels
  and the cost model read them), its compile report (aot) above training and evaluation."""
  parts = module.split(".")
  if len(parts) > 2 and parts[1] == "accel":
    return ".".join(parts[:3])
  return ".".join(parts[:2])


def test_rooms_import_one_way():
  """Between any two rooms imports go one way (train reads eval, never the reverse): the
  rooms' graph has no circle, commands left out (nothing imports them)."""
  modules = _modules()
  graph = {}
  for name, path in modules.items():
    if name.split(".")[-1] in COMMAND_STEMS and name.count(".") == 1:
      continue
    src = _room(name)
    graph.setdefault(src, set()).update(
        _room(m) for m in _imports(path, modules) if _room(m) != src)
  for node in {m for targets in graph.values() for m in targets}:
    graph.setdefault(node, set())
  assert _cycles(graph) == []
  assert "t2mlr_jax.eval" in graph["t2mlr_jax.train"]
  assert "t2mlr_jax.train" not in graph["t2mlr_jax.eval"]


# Top-level modules the package may import inside a function: optional dependencies, none
# of them in setup.py's install_requires (checked below).
OPTIONAL = {"torch", "transformers", "lm_eval", "libtpu", "fastapi", "uvicorn", "selenium"}
# Install requirements that still load lazily, each with its reason.
LAZY_REQUIREMENTS = {
    "tensorboardX": "its writer imports torch whenever torch is installed (2 s at startup)",
}
MAX_FUNCTION_IMPORTS = 15
# The command-line entry modules load the library inside main, once their flags parse, so
# an argument error prints before JAX loads (tests/test_cli.py checks that JAX stays
# unloaded): there, and only there, the package's own modules are imported in a function.
COMMANDS = {"t2mlr_jax.main", "t2mlr_jax.evaluate", "t2mlr_jax.compile", "t2mlr_jax.chat",
            "t2mlr_jax.serve", "t2mlr_jax.lm_eval", "t2mlr_jax.convert.__main__"}


def _function_level_imports(tree) -> list:
  """Import nodes inside a function or class body (not under `if TYPE_CHECKING:`)."""
  out = []

  def visit(node, nested):
    for child in ast.iter_child_nodes(node):
      if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
        for grandchild in child.orelse:      # only the TYPE_CHECKING branch is exempt
          visit(ast.Module(body=[grandchild], type_ignores=[]), nested)
        continue
      if isinstance(child, (ast.Import, ast.ImportFrom)) and nested:
        out.append(child)
      visit(child, nested or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                ast.Lambda, ast.ClassDef)))
  visit(tree, False)
  return out


def _install_requires() -> set:
  """setup.py's install_requires as import names (lower case, '-' as '_')."""
  setup = ast.parse(open(os.path.join(os.path.dirname(PACKAGE), "setup.py")).read())
  for node in ast.walk(setup):
    if isinstance(node, ast.keyword) and node.arg == "install_requires":
      reqs = [ast.literal_eval(e) for e in node.value.elts]
      return {re.split(r"[<>=!\[; ]", r)[0].strip().lower().replace("-", "_") for r in reqs}
  raise AssertionError("setup.py has no install_requires")


def test_imports_are_at_the_top_but_optional_ones():
  required = _install_requires()
  assert "jax" in required and "tensorboardx" in required
  assert not {m.lower() for m in OPTIONAL} & required
  found = []
  for name, path in _modules().items():
    for node in _function_level_imports(ast.parse(open(path).read())):
      if isinstance(node, ast.ImportFrom):
        assert node.level == 0, f"{name}:{node.lineno}: a relative import"
        tops = {node.module.split(".")[0]}
      else:
        tops = {a.name.split(".")[0] for a in node.names}
      if name in COMMANDS and tops == {"t2mlr_jax"}:
        continue
      found.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
      assert tops <= OPTIONAL | set(LAZY_REQUIREMENTS), (
          f"{found[-1]}: move it to the top of the module (inside a function only an "
          f"optional dependency: {sorted(OPTIONAL)})")
  assert len(found) <= MAX_FUNCTION_IMPORTS, found


def test_schedules_import_no_recurrence_type():
  modules = _modules()
  for name, path in modules.items():
    if name.startswith("t2mlr_jax.model.schedules"):
      imported = _imports(path, modules)
      assert not {m for m in imported if m.startswith("t2mlr_jax.model.recurrence.")}, name


def test_no_branch_on_the_recurrence_type_outside_its_own_places():
  allowed = ("t2mlr_jax.model.recurrence", "t2mlr_jax.convert.")
  for name, path in _modules().items():
    if name.startswith(allowed):
      continue
    for node in ast.walk(ast.parse(open(path).read())):
      if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance":
        names = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
        assert not names & {"T2MLRConfig", "LRTConfig"}, f"{name}: isinstance on a type"
      if isinstance(node, ast.Compare):
        text = ast.unparse(node)
        assert "recurrence.type ==" not in text and '"gamma_rec" in' not in text, name


def test_no_package_module_names_a_registered_entry_outside_its_own_files():
  """A registered recurrence type, schedule or model family is named (as a string) only in the file
  that registers it and in the places that own its parts: a type's file may name its
  default schedule (its config class's declaration), and the converters of official
  checkpoints their type. Everything else, config.py included, reads the registries.
  ("none", the entry of the model without a recurrence, is also an ordinary word for
  other options and is left out.)"""
  from t2mlr_jax import registry
  owners = {}
  own = lambda entry: entry.source.startswith("t2mlr_jax.")   # not a test's user type
  for entry in (*registry.RECURRENCES.values(), *registry.SCHEDULES.values(),
                *registry.FAMILIES.values()):
    if own(entry):
      owners.setdefault(entry.name, set()).add(entry.source)
  for kind in registry.RECURRENCES.values():
    if kind.config is not None and own(kind):
      owners[kind.config.default_schedule].add(kind.source)
  owners.pop("none", None)
  allowed = ("t2mlr_jax.convert.",)
  for name, path in _modules().items():
    if name.startswith(allowed):
      continue
    for node in ast.walk(ast.parse(open(path).read())):
      if isinstance(node, ast.Constant) and isinstance(node.value, str):
        assert name in owners.get(node.value, {name}), (
            f"{name}:{node.lineno} names the registered entry {node.value!r}")


def test_no_citation_of_documents_outside_the_repository():
  """What the code relies on is in docs/; nothing cites a design document or a folder
  beside the repository."""
  root = os.path.dirname(PACKAGE)
  patterns = ("SPEC" + " §", "SPEC" + ".md", ".." + "/shared")
  for folder, dirs, files in os.walk(root):
    dirs[:] = [d for d in dirs if not d.startswith(".") and d not in ("workdirs", "build")]
    for f in files:
      if f.endswith((".py", ".md", ".ipynb", ".txt", ".toml", ".cfg", ".ini")) or f == "run":
        text = open(os.path.join(folder, f), encoding="utf-8", errors="replace").read()
        for p in patterns:
          assert p not in text, f"{os.path.join(folder, f)} cites {p!r}"


def test_commands_are_the_modules_the_linter_lets_import_late():
  """ruff's per-file exemption from top-of-module imports (ruff.toml) names COMMANDS."""
  text = open(os.path.join(os.path.dirname(PACKAGE), "ruff.toml")).read()
  exempt = set()
  for pattern in re.findall(r'^"(t2mlr_jax/[^"]+)" = \["PLC0415"\]', text, re.M):
    stems = re.match(r"(.*)/(?:\{(.*)\}|(.*))\.py$", pattern)
    folder, several, one = stems.groups()
    for stem in (several.split(",") if several else [one]):
      exempt.add(f"{folder}/{stem}".replace("/", "."))
  assert exempt == COMMANDS


@pytest.mark.parametrize("entry", ["t2mlr_jax.main", "t2mlr_jax.evaluate", "t2mlr_jax.compile"])
def test_training_and_evaluating_need_no_test_dependency(entry):
  """README's first command installs the package alone (no torch, no transformers):
  training, evaluating and compiling must not import what only tests and converters use
  (the commands and what their main loads)."""
  test_only = ("torch", "transformers", "accelerate", "lm_eval", "pytest")
  code = (f"import sys, {entry}, t2mlr_jax.train.loop, t2mlr_jax.eval.jobs, t2mlr_jax.accel.aot\n"
          f"print([m for m in {test_only!r} if m in sys.modules])")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=300, env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.strip() == "[]", out.stdout
  assert not set(test_only) & _install_requires()


MAX_FUNCTION_LINES = 80
MAX_CLASS_LINES = 250


def test_no_long_function_or_class():
  """Units a person can read in one go: no function over 80 lines, no class over 250 (ruff's
  C901 keeps each function's complexity at 15 or less, ruff.toml)."""
  long = []
  for name, path in _modules().items():
    for node in ast.walk(ast.parse(open(path).read())):
      size = node.end_lineno - node.lineno + 1 if hasattr(node, "end_lineno") else 0
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and size > MAX_FUNCTION_LINES:
        long.append(f"{name}.{node.name}: {size} lines (function)")
      elif isinstance(node, ast.ClassDef) and size > MAX_CLASS_LINES:
        long.append(f"{name}.{node.name}: {size} lines (class)")
  assert long == []
