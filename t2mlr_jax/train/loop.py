"""The training loop: config -> sharded state -> steps, logs, evals, checkpoints.

Resumes automatically from the latest checkpoint in the workdir (refusing a
config that differs in anything but the cadences and `stop_after_steps`).
SIGTERM/SIGINT finish the current step, save a checkpoint and return; a second
one exits at once without saving. A non-finite loss stops the run with NonFiniteLossError
without saving, so the last good checkpoint stays the latest. `train` is four steps: setup
(`_setup`), opening and restoring (`_open`, `_restore`), the step loop (`_steps`), finish.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import os
import platform
import signal
import socket
import sys
import threading
import time
from typing import Any, Optional

import jax
import numpy as np
from absl import logging
from jax.experimental import multihost_utils
from tqdm import tqdm

import t2mlr_jax
from t2mlr_jax import checkpoint, flops, paths, sharding
from t2mlr_jax.accel import distributed
from t2mlr_jax.convert.pretrained import load_pretrained
from t2mlr_jax.data.pipeline import make_iterator
from t2mlr_jax.eval import runner
from t2mlr_jax.registry import family_of
from t2mlr_jax.train import config as config_lib, rl as rl_lib, tasks as tasks_lib
from t2mlr_jax.train.metrics import MetricsWriter, Progress
from t2mlr_jax.train.optimizer import make_optimizer
from t2mlr_jax.train.step import (
  abstract_state,
  check_batch,
  create_state,
  make_train_step,
  state_shardings,
)


class NonFiniteLossError(RuntimeError):
  """Training stopped: the loss or the parameters became NaN/inf (nothing is saved)."""
  pass


class _StopSignal:
  """SIGTERM/SIGINT: the first sets a flag the loop checks after each step (it then saves
  and returns), acknowledged at once; a second exits at once without saving (what is
  saved stays). Python runs signal handlers only between bytecodes, which a compile or a
  long step delays by minutes: the C-level handler writes to a wakeup socket a watcher
  thread reads, so the answer comes while the main thread is still busy."""

  def __init__(self):
    self.received = None
    self._previous = {}
    self._wakeup = None

  def __enter__(self):
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    try:
      previous_fd = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    except ValueError:        # not the main thread: no handlers
      reader.close(), writer.close()
      return self
    self._wakeup = (reader, writer, previous_fd)
    for sig in (signal.SIGTERM, signal.SIGINT):
      self._previous[sig] = signal.signal(sig, lambda signum, frame: None)
    threading.Thread(target=self._watch, args=(reader,), daemon=True).start()
    return self

  def _watch(self, reader) -> None:
    while True:
      try:
        data = reader.recv(64)
      except OSError:
        return
      if not data:
        return
      for signum in data:
        if signum not in (signal.SIGTERM, signal.SIGINT):
          continue
        name = signal.Signals(signum).name
        if self.received is None:
          self.received = name
          _say(f"received {name}: saving after this step, then exiting "
               f"({'Ctrl-C' if signum == signal.SIGINT else 'the signal'} again: exit now "
               "without saving; checkpoints already saved stay)")
        else:
          _say(f"received {name} again: exiting without saving")
          sys.stdout.flush()
          sys.stderr.flush()
          os._exit(128 + signum)

  def __exit__(self, *exc):
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)
    if self._wakeup is not None:
      reader, writer, previous_fd = self._wakeup
      signal.set_wakeup_fd(previous_fd)
      writer.close()
      reader.close()


def _record_run(workdir, config):
  info = {"library_version": t2mlr_jax.__version__, "jax_version": jax.__version__,
          "devices": [str(d) for d in jax.devices()], "process_count": jax.process_count(),
          "python": platform.python_version(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
  root = paths.resolve(workdir)
  paths.write_text(root / "config.json", json.dumps(config.to_dict(), indent=2))
  paths.write_text(root / "run_info.json", json.dumps(info, indent=2))


# metrics logged as their mean over the log window (`loss_window` steps); the others are
# the window's last step. Jacobi's sweeps vary by step under a tolerance: their mean times
# the window is what `flops.train_flops_spent` counts.
WINDOW_MEANS = ("loss", "jacobi_sweeps", "reward_mean", "completion_length", "kl", "clip_fraction")


def _say(message: str) -> None:
  """A status line for the console (process 0 only), above the progress bar."""
  if jax.process_index() == 0:
    tqdm.write(message)
  logging.info("%s", message)


def _logged(value):
  """A metric as logged: a float, or a list for per-layer / per-pass vectors."""
  arr = np.asarray(value)
  return float(arr.reshape(())) if arr.size == 1 else arr.tolist()


def _summary(results: dict) -> str:
  return ", ".join(f"{k}={v:.4g}" for k, v in results.items() if isinstance(v, float))


def _global_batch(batch, data_sharding):
  return {k: jax.make_array_from_process_local_data(data_sharding, np.asarray(v))
          for k, v in batch.items()}


def _check_finite(state, ckpt, resumed: Optional[int] = None):
  """Raise NonFiniteLossError if a step's loss was not finite; at the first step after
  resuming from step `resumed`, the restored state is named as a suspect too."""
  bad = int(jax.device_get(state.nonfinite_step))
  if bad >= 0:
    last = ckpt.latest_step()
    kept = (f"the last good checkpoint is step {last}" if last is not None
            else "no checkpoint had been saved yet")
    why = "(lower optimizer.lr or check the data)"
    if resumed is not None and bad == resumed:
      earlier = [s for s in ckpt.all_steps() if s < resumed]
      why = (f"(the first step after resuming from step {resumed}: the restored state may "
             "be at fault" + (f"; try --config.train.resume_step={max(earlier)}"
                              if earlier else "") + "; else lower optimizer.lr or check "
             "the data)")
    raise NonFiniteLossError(
        f"non-finite loss or gradient at step {bad + 1}: stopping without saving; {kept} "
        + why)


def _check_same_data_layout(meta: dict, slots: int, workdir, step: int) -> None:
  """A checkpoint's data iterators resume only in the layout that saved them (each
  process's iterator position is saved per batch slice); refuse another, saying why."""
  saved = (meta.get("process_count", 1), meta.get("data_slots", 1))
  now = (jax.process_count(), slots)
  if saved != now:
    raise ValueError(
        f"{workdir} step {step} was saved by {saved[0]} process(es) reading the data in "
        f"{saved[1]} slice(s); this run has {now[0]} process(es) and {now[1]} slice(s). The "
        "data iterators' positions are saved per slice, so resume with the same number of "
        "processes and the same mesh's batch axes, or start a new run from these weights "
        "(python -m t2mlr_jax.convert --from RUN --to-hf DIR, then model.init_from)")


def _init_from_pretrained(state, config, cfg, tx, shardings):
  """Replace fresh parameters by a pretrained model's (recurrence added with γ = 0)."""
  _, params = load_pretrained(config.model.init_from, recurrence=cfg.recurrence,
                              seed=config.train.seed)
  params = jax.device_put(params, shardings.params)
  opt_state = jax.jit(tx.init, out_shardings=shardings.opt_state)(params)
  _say(f"initialised from {config.model.init_from}")
  return state.replace(params=params, opt_state=opt_state)


def _unreadable(workdir, step, ckpt, error) -> ValueError:
  """The one-line error of a checkpoint step that cannot be read, naming the steps a
  `train.resume_step` can go on from (nothing is deleted or overwritten)."""
  checkpoint.quiet_failed_reads()
  others = [s for s in ckpt.all_steps() if s < step]
  how = (f"resume from an earlier step with --config.train.resume_step={max(others)} "
         f"(saved: {others}; the steps after it are moved to {checkpoint.SET_ASIDE}/, not "
         "deleted)" if others else "no earlier step is saved: start in a new workdir")
  return ValueError(f"checkpoint step {step} in {workdir} could not be read: "
                    f"{checkpoint.read_failure(error)}; {how}")


def _step_flops(cfg, t, mode):
  """Model FLOPs of one train step (docs/performance.md#cost-model; fixed sweeps), 0 if
  unknown."""
  return family_of(cfg).train_step_flops(cfg, t.batch_size, t.seq_len, mode)


@dataclasses.dataclass
class _Run:
  """One run's pieces: what `_setup` builds from the config, then what `_open` opens (the
  checkpointer, the data iterator, the metrics writer) and the state `_restore` gives."""
  config: Any
  workdir: str
  task: tasks_lib.Task
  cfg: Any
  mode: str
  mesh: Any
  tx: Any
  schedule: Any
  is_main: bool
  ckpt: Any = None
  data_iter: Any = None
  slots: int = 1
  shardings: Any = None
  writer: Any = None
  state: Any = None
  saved_step: Optional[int] = None
  resumed_step: Optional[int] = None
  eval_batches: Any = None
  reference: Any = None          # RL's KL reference: the run's starting parameters

  @property
  def t(self):
    return self.config.train

  def save(self, step: int) -> None:
    """Checkpoint the state at `step` (refused, raising, if it is not finite)."""
    _check_finite(self.state, self.ckpt, self.resumed_step)
    self.ckpt.save(step, self.state, self.data_iter, self.config.to_dict(), self.cfg,
                   data_slots=self.slots)
    self.saved_step = step


def _setup(config, workdir: str) -> _Run:
  """Check the config and build what opens no file: the model config, mesh, optimizer."""
  task = tasks_lib.get_task(config)
  tasks_lib.check_source(config, task)
  cfg = config_lib.validate(config)
  tasks_lib.validate_data(config, task)
  t = config.train
  mesh = sharding.make_mesh(dict(config.mesh), model_width=getattr(cfg, "d_model", None))
  check_batch(t.batch_size, t.get("grad_accum_steps", 1), mesh)
  mode = config_lib.train_mode(config, cfg)
  if rl_lib.rl_config(config) is not None:
    rl_lib.check(config, cfg, task)
  # the schedule counts optimizer updates: RL takes rl.iterations of them a step
  tx, schedule = make_optimizer(config_lib.optimizer_config(config),
                                t.num_steps * rl_lib.updates_per_step(config), cfg)
  is_main = jax.process_index() == 0
  _prepare_workdir(workdir, t.get("resume_step"), is_main)
  return _Run(config, workdir, task, cfg, mode, mesh, tx, schedule, is_main)


def _prepare_workdir(workdir: str, resume_step, is_main: bool) -> None:
  """Create the workdir; with `train.resume_step`, set the steps after it aside."""
  root = paths.resolve(workdir)
  if root.exists() and not root.is_dir():
    raise ValueError(f"workdir {workdir} is a file: allowed a directory (a new one, or the "
                     "workdir of a run to resume)")
  if is_main:
    root.mkdir(parents=True, exist_ok=True)
  if resume_step is not None and is_main:
    moved = checkpoint.set_aside_after(workdir, resume_step)
    if moved:
      _say(f"resuming from step {resume_step}: saved steps {moved} moved to "
           f"{root / checkpoint.SET_ASIDE} (kept, not deleted)")
  if resume_step is not None and jax.process_count() > 1:
    # the other processes open the checkpoints only once process 0 has moved them
    multihost_utils.sync_global_devices("t2mlr_jax resume_step")


def _open(run: _Run, cleanup: contextlib.ExitStack) -> None:
  """Open the checkpointer, the data iterator and the metrics writer (`cleanup` closes
  them on every way out: a refused resume or a failed restore too)."""
  config, t = run.config, run.t
  run.ckpt = cleanup.enter_context(contextlib.closing(checkpoint.Checkpointer(
      run.workdir, max_to_keep=t.max_to_keep, async_save=t.async_checkpointing)))
  source = run.task.train_source(config, t.num_steps * t.batch_size)
  slot, run.slots = sharding.process_batch_slot(run.mesh, t.batch_size)
  run.data_iter = make_iterator(source, global_batch=t.batch_size, seq_len=t.seq_len,
                                shuffle=config.data.shuffle, seed=t.seed,
                                num_threads=config.data.num_threads,
                                prefetch=config.data.prefetch, process_index=slot,
                                process_count=run.slots,
                                num_examples=t.num_steps * t.batch_size)
  run.shardings = state_shardings(run.cfg, run.tx, run.mesh)
  run.writer = cleanup.enter_context(contextlib.closing(
      MetricsWriter(run.workdir, enabled=run.is_main)))


def _restore(run: _Run) -> None:
  """The state: the latest checkpoint's, or a fresh one (from `model.init_from` if set)."""
  config = run.config
  latest = run.saved_step = run.ckpt.latest_step()
  if latest is not None:
    run.state = _resume(run, latest)
    run.resumed_step = latest
  else:
    run.state = _starting_state(run)
    run.writer.truncate_after(0)        # records of an earlier attempt that saved nothing
  rl = rl_lib.rl_config(config)
  if rl is not None and rl.beta > 0:
    # a copy (the train step donates the state's buffers); rebuilt the same way on resume
    start = run.state if latest is None else _starting_state(run)
    run.reference = jax.tree.map(lambda a: a.copy(), start.params)
  if run.is_main:
    _record_run(run.workdir, config)


def _starting_state(run: _Run):
  """The step-0 state: a fresh init from train.seed, or `model.init_from`'s weights."""
  state = create_state(run.cfg, run.tx, jax.random.PRNGKey(run.t.seed), run.mesh)
  if run.config.model.init_from:
    state = _init_from_pretrained(state, run.config, run.cfg, run.tx, run.shardings)
  return state


def _resume(run: _Run, latest: int):
  """Restore step `latest`, refusing another config (but for RESUME_MUTABLE's fields), an
  unreadable step or another data layout."""
  ckpt, workdir, t = run.ckpt, run.workdir, run.t
  try:
    saved = ckpt.read_json(latest, "config")
    meta = ckpt.read_json(latest, "meta")
  except Exception as e:      # a damaged step: say which, and how to go on
    raise _unreadable(workdir, latest, ckpt, e) from e
  ckpt.check_format(latest, meta)
  _check_same_config(saved, run.config.to_dict(), workdir)
  _check_same_data_layout(meta, run.slots, workdir, latest)
  target = checkpoint.with_shardings(abstract_state(run.cfg, run.tx), run.shardings)
  # (its format is checked above); a damaged array raises DamagedCheckpointError, one line
  # naming it and the last intact step
  state = ckpt.restore(latest, target, run.data_iter)
  run.writer.truncate_after(latest)
  if latest >= t.num_steps:
    _say(f"the run in {workdir} is complete (step {latest} of {t.num_steps}): nothing to "
         f"train. Its losses and evaluations: {paths.resolve(workdir) / 'metrics.jsonl'}"
         f"; its checkpoints: {paths.resolve(workdir) / 'checkpoints'}; evaluate it with "
         f"python -m t2mlr_jax.evaluate --workdir={workdir}")
  else:
    _say(f"resumed from step {latest} in {workdir}")
  return state


def _check_same_config(saved: dict, current: dict, workdir) -> None:
  """Refuse to resume a run saved with another config, naming each field that differs."""
  conflicts = config_lib.resume_conflicts(saved, current)
  if conflicts:
    detail = ", ".join(f"{k}: saved {config_lib.flatten(saved).get(k)!r} vs now "
                       f"{config_lib.flatten(current).get(k)!r}" for k in conflicts)
    raise ValueError(f"{workdir} holds a run with a different config; refusing to resume "
                     f"(only {', '.join(config_lib.RESUME_MUTABLE)} may change): {detail}")


def _log(run: _Run, step: int, window: list, window_start: float, step_flops, bar) -> dict:
  """Write the window's metrics (WINDOW_MEANS' means, the others' last values, rates). The
  rates count from `window_start` to the window's results on the host: steps dispatch
  asynchronously, so a clock read before the fetch would time the dispatch alone."""
  t = run.t
  _check_finite(run.state, run.ckpt, run.resumed_step)
  fetched = jax.device_get(window)
  elapsed = time.perf_counter() - window_start
  last = {k: float(np.mean([m[k] for m in fetched])) if k in WINDOW_MEANS
          else _logged(fetched[-1][k]) for k in fetched[-1]}
  last["loss_last"] = float(np.asarray(fetched[-1]["loss"]))
  last["tokens_per_sec"] = len(window) * t.batch_size * t.seq_len / max(elapsed, 1e-9)
  last["steps_per_sec"] = len(window) / max(elapsed, 1e-9)
  if step_flops:
    last["step_flops"] = step_flops      # the cost model's, per optimizer step
    achieved = step_flops * last["steps_per_sec"]
    last["model_tflops_per_sec"] = achieved / 1e12
    peak = flops.peak_flops()
    if peak:
      last["mfu"] = achieved / (peak * jax.device_count())
  last["loss_window"] = len(window)
  run.writer.write(step, last)
  # a window shorter than log_every (after a resume, at a stop) says which steps its mean
  # loss covers
  span = ({} if len(window) == t.log_every
          else {"over_steps": f"{step - len(window) + 1}-{step}"})
  bar.update(len(window), loss=last["loss"], **span, tok_s=int(last["tokens_per_sec"]))
  return last


def _evaluate(run: _Run, step: int) -> None:
  """The task's evaluation (exact, and the other modes) at `step`: logged and said."""
  config, task, cfg, params = run.config, run.task, run.cfg, run.state.params
  results = tasks_lib.run_eval(task, config, params, cfg, run.eval_batches, mesh=run.mesh)
  # the same batches with zero memory (what the recurrence adds) and, for language
  # modelling, in the training mode too: the modes but exact (the last), done above
  for mode in runner.eval_modes(cfg, run.mode if task.train_views else None)[:-1]:
    results[mode] = tasks_lib.run_eval(task, config, params, cfg, run.eval_batches,
                                       mode=mode, mesh=run.mesh)
  run.writer.write(step, results, record_type="eval")
  _say(f"step {step} eval (exact): " + _summary(results) + "".join(
      f" | {mode}: {_summary(v)}" for mode, v in results.items() if isinstance(v, dict)))


# Steps the loop may dispatch ahead of the device. Unbounded, JAX's async dispatch let it run
# tens of steps ahead (25 on a 4-second step), so a stop signal's save came that much later,
# and on a mesh of 8 CPU devices a slow device made the dispatch abort the process.
MAX_STEPS_IN_FLIGHT = 8


def _steps(run: _Run, cleanup: contextlib.ExitStack, progress: bool) -> dict:
  """The step loop to `train.stop_after_steps` (or the end, or a stop signal): logs,
  evaluations and checkpoints at their cadences; returns the last logged metrics."""
  t = run.t
  if rl_lib.rl_config(run.config) is not None:
    train_step = rl_lib.RLStep(run.config, run.cfg, run.tx, run.schedule, run.mesh,
                               t.num_steps, run.reference, tasks_lib.task_tokenizer(run.config))
    step_flops = 0       # sampling and scoring: not the cost model's next-token step
    what = f"GRPO step (sampler, {train_step.rl.score_mode} scorer)"
  else:
    train_step = make_train_step(run.cfg, run.tx, run.schedule, run.mode, run.mesh,
                                 t.get("loss_chunk"), t.get("grad_accum_steps", 1),
                                 t.num_steps, t.get("grad_accum_average", "tokens"))
    step_flops = _step_flops(run.cfg, t, run.mode)
    what = f"{run.mode} train step"
  data_sharding = sharding.batch_sharding(run.mesh)
  step = first_step = int(jax.device_get(run.state.step))
  stop_at = t.num_steps if t.stop_after_steps is None else t.stop_after_steps
  bar = cleanup.enter_context(contextlib.closing(
      Progress(t.num_steps, step, enabled=progress and run.is_main)))
  window, last, in_flight = [], {}, collections.deque()
  window_start = time.perf_counter()
  if step < stop_at:
    _say(f"compiling the {what} (tens of seconds on a CPU); the first log "
         f"line comes after step {min((step // t.log_every + 1) * t.log_every, stop_at)}")
  with _StopSignal() as stop:
    while step < stop_at:
      batch = _global_batch(next(run.data_iter), data_sharding)
      run.state, metrics = train_step(run.state, batch)
      step += 1
      if step == first_step + 1:      # the compile: rates and the ETA count after it
        jax.block_until_ready(metrics)
        _say(f"compiled: the first step took {time.perf_counter() - window_start:.0f} s")
        bar.compiled()
      window.append(metrics)
      in_flight.append(metrics)
      if len(in_flight) > MAX_STEPS_IN_FLIGHT:
        jax.block_until_ready(in_flight.popleft())
      # every process stops at the same step, whichever received the signal
      stopping = distributed.any_process(stop.received is not None)
      if step % t.log_every == 0 or step == stop_at or stopping:
        last = _log(run, step, window, window_start, step_flops, bar)
        window, window_start = [], time.perf_counter()
      if step % t.eval_every == 0 or step == t.num_steps:
        with bar.paused():          # the rate and the ETA count training steps only
          _evaluate(run, step)
        window_start = time.perf_counter()
      if step % t.checkpoint_every == 0 or step == stop_at or stopping:
        run.save(step)
      if stopping:
        _say(f"received {stop.received or 'a stop signal (another process)'}: saved step "
             f"{step}, exiting")
        break
    _finish(run, step)
  return last


def _finish(run: _Run, step: int) -> None:
  """Save the last step unless the loop just did (a run already complete saves nothing)."""
  if run.saved_step != step:
    run.save(step)


def train(config, workdir: str, *, progress: bool = True) -> dict:
  """Train (or resume) per `config` in `workdir`; returns the last logged metrics."""
  run = _setup(config, workdir)
  # Everything opened below is closed on every way out: a refused resume or a failed
  # restore too (an open TensorBoard writer and Orbax's threads outlive the call).
  with contextlib.ExitStack() as cleanup:
    _open(run, cleanup)
    _restore(run)
    # built before the first step: a setting they refuse (an eval length longer than
    # model.max_seq_len) is said now, not after eval_every steps of training
    run.eval_batches = run.task.eval_batches(config)
    return _steps(run, cleanup, progress)
