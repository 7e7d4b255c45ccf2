"""Checkpoints: a training run's checkpoint steps, and the public loader for eval scripts.

`Checkpointer` is the Orbax run manager of a training run, its steps under
workdir/checkpoints. A step holds six items:

    params     the model parameters (sharded arrays)
    train      {step, opt_state, nonfinite_step}
    data       the Grain iterator state (one JSON per process)
    config     the experiment config as JSON
    meta       {format_version, library version, step, the resolved model config}
    checksums  a crc32 of every saved array (params, train), by tree path

Saves are asynchronous and atomic (Orbax writes to a temporary directory and renames it
when complete), keeping the latest `max_to_keep`. Restores go straight into the abstract
sharded layout the caller provides. The trainer saves and resumes through it.

`load` reads a step's model config and parameters, `load_config` its experiment config;
a parameter export (`export`) is a standalone params/ + model.json (+ checksums.json).

Integrity: every restore (the trainer's resume, `load`, an export's) checks each restored
array against the crc32 recorded when it was saved (`array_checksums`), and a step that
does not match or cannot be read raises DamagedCheckpointError, one line naming the step,
the array and the last intact step. TensorStore's own crc32c codec is not used: Orbax
(0.12) builds the zarr3 codec chain itself and puts crc32c on the shard index only, with no
option for the chunk data, and checkpoints saved before would stay unchecked anyway; a
crc32 of the restored bytes covers every array, whatever wrote it, and costs one pass at
about 3 GB/s. Steps saved without checksums restore unverified (logged). In a run of
several processes an array no process holds whole is checked by the shards process 0
held when saving (`array_checksums`).

    cfg, params = t2mlr_jax.checkpoint.load("workdirs/s5")     # latest step
"""

from __future__ import annotations

import json
import logging as std_logging  # the stdlib logger asyncio reports through (absl's is `logging`)
import os
import re
import sys
import zlib
from typing import Optional

import grain
import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from etils import epath
from ml_collections import config_dict

from t2mlr_jax import __version__, paths, registry
from t2mlr_jax.accel import distributed
from t2mlr_jax.config import migrate_experiment_config
from t2mlr_jax.model.api import init_model

FORMAT_VERSION = 1
ITEMS = ("params", "train", "data", "config", "meta", "checksums")
CHECKSUMS = "checksums"             # the step item (an export's checksums.json)
ARRAY_ITEMS = ("params", "train")   # the items whose arrays are checksummed


class DamagedCheckpointError(ValueError):
  """A checkpoint step (or export) with an array that cannot be read or does not match
  the checksum recorded when it was saved; the message is one line."""


def _crc32(x) -> int:
  """crc32 of an array's bytes in C order."""
  return zlib.crc32(np.ascontiguousarray(x))


def _tree_path(item: str, path) -> str:
  """`item/a/b/0/kernel`: a leaf's tree path, as the checksums record names it."""
  names = [str(next((getattr(k, a) for a in ("key", "name", "idx") if hasattr(k, a)), k))
           for k in path]
  return "/".join([item, *names])


def _shard_key(index, shape) -> str:
  """A shard's place in its global array, 'start:stop' per dimension ('0:4,8:16')."""
  return ",".join(f"{s.start or 0}:{dim if s.stop is None else s.stop}"
                  for s, dim in zip(index, shape))


def _shard_slices(key: str) -> tuple:
  return tuple(slice(*map(int, part.split(":"))) for part in key.split(",")) if key else ()


def _leaf_record(leaf) -> dict:
  """{dtype, shape} and the crc32 of the whole array, or (an array sharded over
  processes, of which this process holds only part) of each shard it holds, by place."""
  leaf = leaf if hasattr(leaf, "dtype") else np.asarray(leaf)
  record = {"dtype": str(leaf.dtype), "shape": list(leaf.shape)}
  if getattr(leaf, "is_fully_addressable", True):
    record["crc32"] = _crc32(np.asarray(leaf))
  else:
    record["shards"] = {_shard_key(s.index, leaf.shape): _crc32(np.asarray(s.data))
                        for s in leaf.addressable_shards}
  return record


def array_checksums(tree, item: str) -> dict:
  """{tree path: record} of every array in `tree`, the paths prefixed by `item`.

  In a multi-process run an array no process holds whole is recorded by the shards
  process 0 holds (the record written is process 0's): those are checked on restore."""
  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  return {_tree_path(item, path): _leaf_record(leaf) for path, leaf in leaves}


def _leaf_matches(record: dict, leaf) -> Optional[bool]:
  """Whether a restored array matches its record; None where it cannot be checked here
  (restored as another dtype or shape, or across processes without the recorded shards)."""
  leaf = leaf if hasattr(leaf, "dtype") else np.asarray(leaf)
  if str(leaf.dtype) != record["dtype"] or list(leaf.shape) != record["shape"]:
    return None
  whole = getattr(leaf, "is_fully_addressable", True)
  if "crc32" in record:
    return _crc32(np.asarray(leaf)) == record["crc32"] if whole else None
  if whole:
    arr = np.asarray(leaf)
    return all(_crc32(arr[_shard_slices(k)]) == crc for k, crc in record["shards"].items())
  held = {_shard_key(s.index, leaf.shape): s.data for s in leaf.addressable_shards}
  checked = [_crc32(np.asarray(held[k])) == crc for k, crc in record["shards"].items()
             if k in held]
  return all(checked) if checked else None


def first_mismatch(records: dict, tree, item: str) -> Optional[str]:
  """The tree path of the first array of `tree` that does not match its record (None when
  all that are recorded match)."""
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    name = _tree_path(item, path)
    if name in records and _leaf_matches(records[name], leaf) is False:
      return name
  return None


_QUIETED = False


def quiet_failed_reads() -> None:
  """After a failed restore, Orbax's other array reads of the same damaged file end as
  coroutines whose exceptions nobody retrieves (Python prints each, a page of TensorStore
  spec, when they are collected) or as TensorStore callbacks into the event loop Orbax has
  closed by then (each reported through sys.unraisablehook with no object, so Python
  prints a bare traceback; how many arrive depends on timing). Silence just those, keeping
  every other warning. Installed before a read starts (a callback can land before the
  failure is caught), once per process."""
  global _QUIETED
  if _QUIETED:
    return
  _QUIETED = True
  previous = sys.unraisablehook

  def is_read_noise(value, _runtime_error=RuntimeError, _str=str, _isinstance=isinstance):
    # builtins bound as defaults: the hooks may run during interpreter shutdown
    text = _str(value)
    return ("Encountered error while reading array" in text
            or (_isinstance(value, _runtime_error) and text == "Event loop is closed"))

  def hook(unraisable):
    if is_read_noise(unraisable.exc_value):
      return
    previous(unraisable)
  sys.unraisablehook = hook
  previous_excepthook = sys.excepthook

  def excepthook(exc_type, value, traceback):
    if is_read_noise(value):
      return
    previous_excepthook(exc_type, value, traceback)
  sys.excepthook = excepthook
  # a read task whose exception nobody retrieved is reported by asyncio's logger
  asyncio_logger = std_logging.getLogger("asyncio")
  asyncio_logger.addFilter(
      lambda record: not (record.exc_info and is_read_noise(record.exc_info[1])))


def read_failure(error: BaseException) -> str:
  """What could not be read, in one line: the array and TensorStore's reason when the
  error chain names them (a damaged shard file), else the innermost message."""
  chain, e = [], error
  while e is not None and len(chain) < 20:
    chain.append(e)
    e = e.__cause__ or e.__context__
  for e in chain:
    found = re.search(r'Error reading "([^"]+)" in OCDBT database at local file "([^"]*)"'
                      r'(?:: (.*))?', str(e))
    if found:
      array, where, why = found.groups()
      item = where.rstrip("/").rsplit("/", 1)[-1]
      array = array.rsplit("/", 1)[0] if "/" in array else array
      why = (why or "").split(";")[0].strip()
      return f"array {item}/{array}" + (f" ({why})" if why else "")
  return " ".join(str(chain[-1]).split())[:300]


def _read_failure(error: BaseException) -> str:
  """A failed Orbax/TensorStore read in one line (its noise quieted), the array named by
  its tree path."""
  quiet_failed_reads()
  what = read_failure(error)
  return re.sub(r"^array (\S+)", lambda m: "array " + m.group(1).replace(".", "/"), what)


def _mismatch_line(name: Optional[str]) -> str:
  if name is None:          # another process found it
    return "an array another process holds does not match the checksum saved with it"
  return f"array {name} does not match the checksum saved with it (crc32)"


class Checkpointer:
  """A CheckpointManager over `workdir/checkpoints` for one training run."""

  def __init__(self, workdir: str, *, max_to_keep: int = 3, async_save: bool = True,
               read_only: bool = False):
    self.workdir = workdir
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
    checksums = {"algorithm": "crc32", "arrays": {
        **array_checksums(state.params, "params"), **array_checksums(train, "train")}}
    args = ocp.args.Composite(
        params=ocp.args.StandardSave(state.params), train=ocp.args.StandardSave(train),
        data=grain.checkpoint.CheckpointSave(data_iterator),
        config=ocp.args.JsonSave(config), meta=ocp.args.JsonSave(meta),
        checksums=ocp.args.JsonSave(checksums))
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
    restored = self.restore_checked(step, every_process=True, params=ocp.args.StandardRestore(
        abstract_state.params), train=ocp.args.StandardRestore(train_abstract),
        data=grain.checkpoint.CheckpointRestore(data_iterator))
    train = restored["train"]
    return abstract_state.replace(step=train["step"], params=restored["params"],
                                  opt_state=train["opt_state"],
                                  nonfinite_step=train["nonfinite_step"])

  def restore_checked(self, step: int, every_process: bool = False, **items) -> dict:
    """`manager.restore` of `items` (item name -> restore args) at `step`, the restored
    arrays checked against the checksums saved with them: raises DamagedCheckpointError
    (one line naming the step, the array and the last intact step) where one cannot be
    read or does not match. every_process: all processes restore together (the trainer),
    and each raises when any finds damage (a collective)."""
    restored, what = self._read_checked(step, items, every_process, log_unverified=True)
    if what is not None:
      raise self.damaged(step, what, items, every_process)
    return restored

  def _read_checked(self, step: int, items: dict, every_process: bool = False,
                    log_unverified: bool = False):
    """(the restored items, None), or (None, what is damaged) where an array cannot be
    read or does not match its checksum."""
    records, what, restored = None, None, None
    quiet_failed_reads()
    if (self.directory / str(step) / CHECKSUMS).exists():
      try:
        records = self.read_json(step, CHECKSUMS)["arrays"]
      except Exception as e:          # any failed read is a damaged step
        what = f"its checksums record could not be read: {_read_failure(e)}"
    elif log_unverified:
      logging.info("checkpoint step %d in %s was saved without checksums (by an earlier "
                   "version): restored unverified", step, self.workdir)
    if what is None:
      try:
        restored = self.manager.restore(step, args=ocp.args.Composite(**items))
      except Exception as e:
        what = _read_failure(e)
    if what is None and records is not None:
      bad = next(filter(None, (first_mismatch(records, restored[item], item)
                               for item in ARRAY_ITEMS if item in items)), None)
      what = None if bad is None else _mismatch_line(bad)
    if distributed.any_process(what is not None) if every_process else what is not None:
      return None, what or _mismatch_line(None)
    return restored, None

  def damaged(self, step: int, what: str, items: Optional[dict] = None,
              every_process: bool = False):
    """The one-line DamagedCheckpointError of step `step` (`what` is damaged), naming the
    last intact earlier step (each earlier one restored with `items` but the data
    iterator, and checked, until one is; without `items`, the latest earlier step)."""
    earlier = [s for s in self.all_steps() if s < step]
    check = {k: v for k, v in (items or {}).items() if k != "data"}
    intact = next((s for s in reversed(earlier)
                   if not check or self._read_checked(s, check, every_process)[1] is None),
                  None)
    if intact is None:
      how = "no earlier intact step is saved: start in a new workdir"
    else:
      resume = (f"--config.train.resume_step={intact} (saved: {earlier}; the steps after "
                f"it are moved to {SET_ASIDE}/, not deleted)")
      how = (f"the last intact step is {intact}: resume from it with {resume}, or evaluate "
             f"it with --step={intact}" if check else
             f"resume from an earlier step with {resume}")
    return DamagedCheckpointError(f"checkpoint step {step} in {self.workdir} could not be "
                                  f"read: {what}; {how}")

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
EXPORT_CHECKSUMS = "checksums.json"


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
  """A standalone parameter checkpoint: path/params (Orbax) + path/checksums.json (each
  array's crc32) + path/model.json.

  What `python -m t2mlr_jax.convert --from-hf` writes; `load(path)` and the training
  config's `model.init_from` read it."""
  check_export_target(path)
  root = paths.resolve(path)
  root.mkdir(parents=True, exist_ok=True)
  target = root / EXPORT_PARAMS
  params = jax.device_get(params)
  with ocp.StandardCheckpointer() as ckptr:
    ckptr.save(target, params)
  paths.write_text(root / EXPORT_CHECKSUMS, json.dumps(
      {"algorithm": "crc32", "arrays": array_checksums(params, EXPORT_PARAMS)}))
  paths.write_text(root / EXPORT_CONFIG, json.dumps(
      {"format_version": FORMAT_VERSION, "library_version": __version__,
       "model_family": type(cfg).__name__, "model_config": cfg.to_dict(),
       "user_modules": list(registry.USER_MODULES)}, indent=2))   # as a step's meta


def _load_export(path: str):
  root = paths.resolve(path)
  meta = json.loads((root / EXPORT_CONFIG).read_text())
  cfg = model_config_from_meta(meta)
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  abstract = jax.eval_shape(lambda: init_model(cfg, jax.random.PRNGKey(0)))
  abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=device),
                          abstract)
  records = None
  if (root / EXPORT_CHECKSUMS).is_file():
    records = json.loads((root / EXPORT_CHECKSUMS).read_text())["arrays"]
  else:
    logging.info("parameter export %s was saved without checksums (by an earlier version): "
                 "restored unverified", path)
  quiet_failed_reads()
  try:
    with ocp.StandardCheckpointer() as ckptr:
      params = ckptr.restore(root / EXPORT_PARAMS, abstract)
  except Exception as e:                # any failed read is a damaged export
    raise DamagedCheckpointError(f"parameter export {path} could not be read: "
                                 f"{_read_failure(e)}; export it again") from e
  bad = first_mismatch(records, params, EXPORT_PARAMS) if records else None
  if bad is not None:
    raise DamagedCheckpointError(f"parameter export {path} could not be read: "
                                 f"{_mismatch_line(bad)}; export it again")
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
    try:
      meta = ckpt.read_json(step, "meta")
    except Exception as e:            # a damaged step: one line, as for its arrays
      raise ckpt.damaged(step, f"its meta could not be read: {_read_failure(e)}") from e
    meta = ckpt.check_format(step, meta)
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
    restored = ckpt.restore_checked(step, params=ocp.args.StandardRestore(abstract))
    return cfg, restored["params"]
  finally:
    ckpt.manager.close()


def load_model_config(workdir: str, step: Optional[int] = None):
  """The model config a training run's checkpoint records (latest step by default),
  without reading its arrays."""
  ckpt = Checkpointer(workdir, read_only=True)
  try:
    step = ckpt.latest_step() if step is None else step
    meta = ckpt.check_format(step, ckpt.read_json(step, "meta"))
    return model_config_from_meta(meta)
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

