"""Checkpoints: a training run's checkpoint steps, and the public loader for eval scripts.

`Checkpointer` is the Orbax run manager of a training run, its steps under
workdir/checkpoints. A step holds five items:

    params     the model parameters (sharded arrays)
    train      {step, opt_state, nonfinite_step}
    data       the Grain iterator state (one JSON per process)
    config     the experiment config as JSON
    meta       {format_version, library version, step, the resolved model config}

Saves are asynchronous and atomic (Orbax writes to a temporary directory and renames it
when complete), keeping the latest `max_to_keep`. Restores go straight into the abstract
sharded layout the caller provides. The trainer saves and resumes through it.

`load` reads a step's model config and parameters, `load_config` its experiment config;
a parameter export (`export`) is a standalone params/ + model.json.

    cfg, params = t2mlr_jax.checkpoint.load("workdirs/s5")     # latest step
"""

from __future__ import annotations

import json
import os
from typing import Optional

import grain
import jax
import orbax.checkpoint as ocp
from etils import epath
from ml_collections import config_dict

from t2mlr_jax import __version__, paths, registry
from t2mlr_jax.config import migrate_experiment_config
from t2mlr_jax.model.api import init_model

FORMAT_VERSION = 1
ITEMS = ("params", "train", "data", "config", "meta")


class Checkpointer:
  """A CheckpointManager over `workdir/checkpoints` for one training run."""

  def __init__(self, workdir: str, *, max_to_keep: int = 3, async_save: bool = True,
               read_only: bool = False):
    self.directory = paths.resolve(workdir) / "checkpoints"
    if read_only and not self.directory.is_dir():
      raise ValueError(f"no checkpoint found under {self.directory} (is --workdir right?)")
    # read_only: never save or clean up (Orbax's own read_only mode only adds warnings)
    options = ocp.CheckpointManagerOptions(
        preservation_policy=ocp.checkpoint_managers.LatestN(max_to_keep),
        enable_async_checkpointing=async_save, create=not read_only,
        cleanup_tmp_directories=not read_only)
    self.manager = ocp.CheckpointManager(self.directory, options=options, item_names=ITEMS)

  def latest_step(self) -> Optional[int]:
    """The newest saved step (None when there is none)."""
    return self.manager.latest_step()

  def all_steps(self):
    """Every saved step, as a list."""
    return list(self.manager.all_steps())

  def save(self, step: int, state, data_iterator, config: dict, model_cfg,
           data_slots: int = 1) -> None:
    """Save (asynchronously) the train state, data iterator and config at `step`.

    `model_cfg` (the resolved ModelConfig/LSTMConfig) goes into `meta`, so a
    checkpoint loads without the experiment config's external files; so does
    `data_slots`, the number of data iterators (one per batch slice) saved."""

    meta = {"format_version": FORMAT_VERSION, "library_version": __version__,
            "step": int(step), "model_family": type(model_cfg).__name__,
            "model_config": model_cfg.to_dict(), "data_slots": int(data_slots),
            "process_count": jax.process_count(),
            # the --user_module files this run imported (a type or schedule of its own)
            "user_modules": list(registry.USER_MODULES)}
    train = {"step": state.step, "opt_state": state.opt_state,
             "nonfinite_step": state.nonfinite_step}
    args = ocp.args.Composite(
        params=ocp.args.StandardSave(state.params), train=ocp.args.StandardSave(train),
        data=grain.checkpoint.CheckpointSave(data_iterator),
        config=ocp.args.JsonSave(config), meta=ocp.args.JsonSave(meta))
    self.manager.save(int(step), args=args, force=True)

  def read_json(self, step: int, item: str) -> dict:
    """A JSON item saved with `step` ("config", "meta" or "run_info")."""
    restored = self.manager.restore(step, args=ocp.args.Composite(
        **{item: ocp.args.JsonRestore()}))
    return dict(restored[item])

  def check_format(self, step: int, meta: Optional[dict] = None) -> dict:
    """The step's meta dict (read unless given); refuses a format_version this library
    does not read."""
    meta = self.read_json(step, "meta") if meta is None else meta
    if meta.get("format_version") != FORMAT_VERSION:
      raise ValueError(f"checkpoint {self.directory}/{step} has format_version="
                       f"{meta.get('format_version')!r}: this library reads format_version="
                       f"{FORMAT_VERSION}")
    return meta

  def restore(self, step: int, abstract_state, data_iterator):
    """The train state at `step`, restored into `abstract_state`'s shapes and shardings
    (a TrainState of jax.ShapeDtypeStruct); the data iterator is restored in place."""
    self.check_format(step)
    train_abstract = {"step": abstract_state.step, "opt_state": abstract_state.opt_state,
                      "nonfinite_step": abstract_state.nonfinite_step}
    restored = self.manager.restore(step, args=ocp.args.Composite(
        params=ocp.args.StandardRestore(abstract_state.params),
        train=ocp.args.StandardRestore(train_abstract),
        data=grain.checkpoint.CheckpointRestore(data_iterator)))
    train = restored["train"]
    return abstract_state.replace(step=train["step"], params=restored["params"],
                                  opt_state=train["opt_state"],
                                  nonfinite_step=train["nonfinite_step"])

  def wait(self) -> None:
    """Block until asynchronous saves have finished."""
    self.manager.wait_until_finished()

  def close(self) -> None:
    """Finish pending saves and release the manager."""
    self.manager.wait_until_finished()
    self.manager.close()


SET_ASIDE = "checkpoints_set_aside"


def saved_steps(workdir: str) -> list[int]:
  """The complete steps under workdir/checkpoints (Orbax's unfinished *.orbax-checkpoint-tmp
  directories excluded), without opening a manager."""
  root = paths.resolve(workdir) / "checkpoints"
  if not root.is_dir():
    return []
  return sorted(int(p.name) for p in root.iterdir() if p.is_dir() and p.name.isdigit())


def set_aside_after(workdir: str, step: int) -> list[int]:
  """Move the saved steps after `step` to workdir/checkpoints_set_aside/ (never deleted), so
  a run resumes from `step` and saves its own later steps; returns the steps moved."""
  steps = saved_steps(workdir)
  if step not in steps:
    raise ValueError(f"config field train.resume_step={step} is invalid: allowed one of the "
                     f"steps saved in {paths.resolve(workdir) / 'checkpoints'}: {steps}")
  root = paths.resolve(workdir)
  moved = [s for s in steps if s > step]
  for s in moved:
    dest = root / SET_ASIDE / str(s)
    n = 1
    while dest.exists():          # an earlier set-aside of the same step is kept too
      dest = root / SET_ASIDE / f"{s}.{n}"
      n += 1
    dest.parent.mkdir(parents=True, exist_ok=True)
    (root / "checkpoints" / str(s)).rename(dest)
  return moved


def with_shardings(abstract_tree, shardings):
  """ShapeDtypeStructs carrying the target shardings (the restore layout)."""
  return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                      abstract_tree, shardings)


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

