"""The package's shape, as docs/design.md states it: no import circle between its modules
(at module level or inside functions), each schedule one file that imports no recurrence
type, and no branch on the recurrence type outside its config class, its module and the
converters of its official checkpoints."""

import ast
import os

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
  found = set()
  for node in ast.walk(ast.parse(open(path).read())):
    if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("t2mlr_jax"):
      found.add(node.module)
      found.update(f"{node.module}.{a.name}" for a in node.names)
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
  # the package's own __init__ re-exports the API; a module importing `t2mlr_jax` itself
  # (e.g. `from t2mlr_jax import sharding`) names the submodule, not the package
  graph = {m: d - {"t2mlr_jax"} for m, d in graph.items()}
  assert _cycles(graph) == []


def test_schedules_import_no_recurrence_type():
  modules = _modules()
  for name, path in modules.items():
    if name.startswith("t2mlr_jax.model.schedules"):
      imported = _imports(path, modules)
      assert not {m for m in imported if m.startswith("t2mlr_jax.model.recurrence.")}, name


def test_no_branch_on_the_recurrence_type_outside_its_own_places():
  allowed = ("t2mlr_jax.config", "t2mlr_jax.model.recurrence", "t2mlr_jax.convert.")
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
  """A registered recurrence type or schedule is named (as a string) only in the file
  that registers it and in the places that own its parts: config.py (the built-in
  types' config classes, with their default schedules) and the converters of official
  checkpoints. Everything else reads the registries. ("none", the entry of the model
  without a recurrence, is also an ordinary word for other options and is left out.)"""
  from t2mlr_jax import registry
  owners = {}
  for entry in (*registry.RECURRENCES.values(), *registry.SCHEDULES.values()):
    owners.setdefault(entry.name, set()).add(entry.source)
  owners.pop("none", None)
  allowed = ("t2mlr_jax.config", "t2mlr_jax.convert.")
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
