"""The public loader of training checkpoints and parameter exports, for eval scripts.

A training run's checkpoint steps are written by the trainer's run manager
(`t2mlr_jax.train.checkpointer.Checkpointer`: params, train state, data iterator, config,
meta); `load` reads a step's model config and parameters, `load_config` its experiment
config. A parameter export (`export`) is a standalone params/ + model.json.

    cfg, params = t2mlr_jax.checkpoint.load("workdirs/s5")     # latest step
"""

from __future__ import annotations

import json
import os
from typing import Optional

import jax
import orbax.checkpoint as ocp
from etils import epath
from ml_collections import config_dict

from t2mlr_jax import __version__, paths, registry
from t2mlr_jax.config import migrate_experiment_config
from t2mlr_jax.model.api import init_model
from t2mlr_jax.train.checkpointer import FORMAT_VERSION, Checkpointer


def model_config_from_meta(meta: dict):
  """The typed model config a checkpoint's meta records: its family by the config class's
  name (ModelConfig, LSTMConfig, ...)."""
  families = {f.config.__name__: f.config for f in registry.FAMILIES.values()}
  family = meta.get("model_family")
  if family not in families:
    raise ValueError(f"checkpoint meta has model_family={family!r}: allowed {sorted(families)}")
  needed = meta.get("user_modules") or []
  for path in needed:           # the run's own types and schedules, where the file still is
    if os.path.isfile(path):
      registry.import_user_module(path)
  rec = (meta["model_config"].get("recurrence") or {}).get("type")
  if rec is not None and rec not in registry.RECURRENCES:
    raise ValueError(f"the checkpoint's recurrence type {rec!r} is not registered: allowed "
                     f"one of {registry.RECURRENCES.names()}; it was trained with "
                     f"--user_module={','.join(needed) or '(none recorded)'}: pass that file "
                     "with --user_module (or import it before loading)")
  return families[family](**meta["model_config"])


EXPORT_CONFIG = "model.json"
EXPORT_PARAMS = "params"


def is_export(path: str) -> bool:
  """True when `path` is a parameter export (holds model.json), not a training workdir."""
  return (epath.Path(path) / EXPORT_CONFIG).is_file()


def check_export_target(path: str) -> None:
  """Refuse an export path that already holds one (or is a file), before any conversion
  work is spent on it."""
  root = paths.resolve(path)
  if root.exists() and not root.is_dir():
    raise ValueError(f"{path} is a file: an export is a directory (give a new path)")
  if (root / EXPORT_PARAMS).exists():
    raise ValueError(f"{root / EXPORT_PARAMS} already exists: refusing to overwrite an "
                     "export (give a new path or remove it)")


def export(cfg, params, path: str) -> None:
  """A standalone parameter checkpoint: path/params (Orbax) + path/model.json.

  What `python -m t2mlr_jax.convert --from-hf` writes; `load(path)` and the training
  config's `model.init_from` read it."""
  check_export_target(path)
  root = paths.resolve(path)
  root.mkdir(parents=True, exist_ok=True)
  target = root / EXPORT_PARAMS
  with ocp.StandardCheckpointer() as ckptr:
    ckptr.save(target, jax.device_get(params))
  paths.write_text(root / EXPORT_CONFIG, json.dumps(
      {"format_version": FORMAT_VERSION, "library_version": __version__,
       "model_family": type(cfg).__name__, "model_config": cfg.to_dict()}, indent=2))


def _load_export(path: str):
  root = paths.resolve(path)
  meta = json.loads((root / EXPORT_CONFIG).read_text())
  cfg = model_config_from_meta(meta)
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  abstract = jax.eval_shape(lambda: init_model(cfg, jax.random.PRNGKey(0)))
  abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=device),
                          abstract)
  with ocp.StandardCheckpointer() as ckptr:
    params = ckptr.restore(root / EXPORT_PARAMS, abstract)
  return cfg, params


def load(workdir: str, step: Optional[int] = None):
  """(model config, params) of a training run's checkpoint (latest step by default),
  or of a parameter export (see `export`).

  The params are single-device (default device) arrays; no optimizer state
  or data iterator is read. For downstream evaluation scripts:

      cfg, params = load("workdirs/s5")
      logits = t2mlr_jax.forward(params, cfg, tokens, mode="exact")
  """
  if is_export(workdir):
    if step is not None:
      raise ValueError(f"{workdir} is a parameter export (one step): pass step=None")
    return _load_export(workdir)
  ckpt = Checkpointer(workdir, read_only=True)
  try:
    if step is None:
      step = ckpt.latest_step()
      if step is None:
        raise ValueError(f"no checkpoint found under {ckpt.directory}")
    elif step not in ckpt.all_steps():
      raise ValueError(f"step={step} is not saved in {ckpt.directory}: allowed one of "
                       f"{sorted(ckpt.all_steps())}")
    meta = ckpt.check_format(step)
    if "model_family" not in meta:
      raise ValueError(
          f"{ckpt.directory} step {step} predates checkpoints that record their model "
          "config: rebuild it from the experiment config, cfg = t2mlr_jax.train.config."
          "model_config(checkpoint.load_config(workdir)), and restore with that")
    cfg = model_config_from_meta(meta)
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    abstract = jax.eval_shape(lambda: init_model(cfg, jax.random.PRNGKey(0)))
    abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=device),
                            abstract)
    restored = ckpt.manager.restore(step, args=ocp.args.Composite(
        params=ocp.args.StandardRestore(abstract)))
    return cfg, restored["params"]
  finally:
    ckpt.manager.close()


def load_config(workdir: str, step: Optional[int] = None) -> config_dict.ConfigDict:
  """The experiment config saved with a checkpoint (latest step by default)."""
  ckpt = Checkpointer(workdir, read_only=True)
  try:
    step = ckpt.latest_step() if step is None else step
    if step is None:
      raise ValueError(f"no checkpoint found under {ckpt.directory}")
    return config_dict.ConfigDict(migrate_experiment_config(ckpt.read_json(step, "config")))
  finally:
    ckpt.manager.close()

