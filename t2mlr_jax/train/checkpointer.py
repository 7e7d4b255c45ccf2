"""The Orbax run manager of a training run: its checkpoint steps under workdir/checkpoints.

A checkpoint step holds five items:

    params     the model parameters (sharded arrays)
    train      {step, opt_state, nonfinite_step}
    data       the Grain iterator state (one JSON per process)
    config     the experiment config as JSON
    meta       {format_version, library version, step, the resolved model config}

Saves are asynchronous and atomic (Orbax writes to a temporary directory and
renames it when complete), keeping the latest `max_to_keep`. Restores go
straight into the abstract sharded layout the caller provides. The trainer saves and
resumes through it; `t2mlr_jax.checkpoint.load` reads a step's parameters with it (so
this module imports nothing else of `t2mlr_jax.train`).
"""

from __future__ import annotations

from typing import Optional

import grain
import jax
import orbax.checkpoint as ocp

from t2mlr_jax import __version__, paths, registry

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
