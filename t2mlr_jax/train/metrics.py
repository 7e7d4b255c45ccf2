"""Training metrics: metrics.jsonl, TensorBoard event files, a console progress bar."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from typing import Mapping, Optional

import numpy as np
from tqdm import tqdm

from t2mlr_jax import paths


def _scalars(metrics: Mapping, prefix: str = "") -> dict:
  """Flatten nested metric dicts into {name: float}: vectors as name/0, name/1, ...;
  anything else that is not a number is skipped."""
  out = {}
  for key, value in metrics.items():
    name = f"{prefix}{key}"
    if isinstance(value, Mapping):
      out.update(_scalars(value, name + "/"))
    else:
      arr = np.asarray(value)
      if arr.dtype.kind not in "fiub":
        continue
      if arr.size == 1:
        out[name] = float(arr.reshape(()))
      elif arr.ndim == 1:                   # per-layer / per-pass vectors: name/i
        out.update({f"{name}/{i}": float(v) for i, v in enumerate(arr)})
  return out


class MetricsWriter:
  """Appends one JSON line per record to workdir/metrics.jsonl and mirrors scalars
  to TensorBoard (workdir/tensorboard); only process 0 writes. On object stores
  (gs://, which cannot append) the file is rewritten whole at each record."""

  def __init__(self, workdir: str, *, enabled: bool = True):
    self.enabled = enabled
    root = paths.resolve(workdir)
    self.path = root / "metrics.jsonl"
    self._remote = paths.is_remote(root)
    self._lines: list[str] = []
    self._tb = None                 # opened at the first record: a refused run writes nothing
    self._tb_dir = str(root / "tensorboard")
    if enabled and self._remote and self.path.exists():
      self._lines = self.path.read_text().splitlines(keepends=True)

  def _tensorboard(self):
    if self._tb is None:
      # here, not at the top: tensorboardX's writer imports torch whenever torch is
      # installed (2 s), which every command importing the trainer would pay at startup
      from tensorboardX import SummaryWriter  # noqa: PLC0415
      self._tb = SummaryWriter(self._tb_dir)
    return self._tb

  def truncate_after(self, step: int) -> None:
    """Drop records beyond `step` (logged after the checkpoint a run resumes from)."""
    if not self.enabled or not self.path.exists():
      return
    keep = [line for line in self.path.read_text().splitlines(keepends=True)
            if line.strip() and json.loads(line).get("step", 0) <= step]
    self._lines = keep
    paths.write_text(self.path, "".join(keep))

  def write(self, step: int, metrics: Mapping, record_type: str = "train") -> None:
    if not self.enabled:
      return
    record = {"step": int(step), "kind": record_type, **_to_json(metrics)}
    line = json.dumps(record) + "\n"
    if self._remote:
      self._lines.append(line)
      self.path.write_text("".join(self._lines))
    else:
      with self.path.open("a") as f:
        f.write(line)
    tb = self._tensorboard()
    for name, value in _scalars(metrics, f"{record_type}/").items():
      tb.add_scalar(name, value, int(step))
    tb.flush()

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()


def _to_json(value):
  if isinstance(value, Mapping):
    return {str(k): _to_json(v) for k, v in value.items()}
  arr = np.asarray(value)
  if arr.dtype.kind in "fiub" and arr.size == 1:
    return arr.reshape(()).item()
  if arr.dtype.kind in "fiub":
    return arr.tolist()
  return value


def read_metrics(workdir: str, record_type: Optional[str] = "train") -> list[dict]:
  """The records of a run's metrics.jsonl whose "kind" is `record_type` (all with None)."""
  text = (paths.resolve(workdir) / "metrics.jsonl").read_text()
  records = [json.loads(line) for line in text.splitlines() if line.strip()]
  return [r for r in records if record_type is None or r.get("kind") == record_type]


class Progress:
  """Training progress: a tqdm bar (loss, tokens/s, ETA) on a terminal; where no bar can
  render (a log file, a notebook cell, a pipe) one line per update instead, so a run is
  never silent between evaluations. Rates and the ETA count the steps this process ran
  after `compiled()` (the first step, which compiles; a resumed run's steps before it
  never count) over the time they took, evaluations (`paused()`) left out."""

  def __init__(self, total: int, initial: int, enabled: bool = True, stream=None,
               clock=time.perf_counter):
    self.bar, self.lines, self.stream, self.clock = None, None, stream, clock
    self.total, self.done, self.first = total, initial, initial
    self.start, self.idle = clock(), 0.0     # idle: seconds paused since `start`
    self.skip = 0                # steps already counted at compiled() (the bar's initial)
    self.terminal = enabled and getattr(sys.stderr if stream is None else stream, "isatty",
                                        lambda: False)()
    if enabled and not self.terminal:   # lines go to stdout unless a stream is given
      self.lines = sys.stdout if stream is None else stream

  def _open_bar(self, initial: int) -> None:
    self.bar = tqdm(total=self.total, initial=initial, unit="step", dynamic_ncols=True,
                    file=self.stream)

  def compiled(self) -> None:
    """The first step (its compile) is done: measure rates from here."""
    self.start, self.idle, self.first = self.clock(), 0.0, self.done + 1
    if self.terminal and self.bar is None:
      self._open_bar(self.done + 1)
      self.skip = 1

  @contextlib.contextmanager
  def paused(self):
    """Time spent inside (an evaluation) counts in neither the rate nor the ETA."""
    began = self.clock()
    try:
      yield
    finally:
      self.idle += self.clock() - began
      if self.bar is not None:
        self.bar.unpause()

  def rate(self) -> float:
    """Steps per second over the steps this process ran since `compiled()`."""
    elapsed = self.clock() - self.start - self.idle
    return (self.done - self.first) / max(elapsed, 1e-9)

  def update(self, steps: int, **postfix) -> None:
    self.done += steps
    shown = {k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in postfix.items()}
    if self.terminal:
      if self.bar is None:
        self._open_bar(self.done - steps)
      if postfix:               # before the update, which draws the bar: this window's
        self.bar.set_postfix(shown, refresh=False)
      self.bar.update(steps - self.skip)
      self.skip = 0
    elif self.lines is not None:
      rate = self.rate()
      eta = (self.total - self.done) / rate if rate > 0 else float("nan")
      fields = " ".join(f"{k} {v}" for k, v in shown.items())
      self.lines.write(f"step {self.done}/{self.total} {fields} "
                       f"({rate:.3g} step/s, eta {_duration(eta)})\n")
      self.lines.flush()

  def close(self) -> None:
    if self.bar is not None:
      self.bar.close()


def _duration(seconds: float) -> str:
  """'1h02m', '3m20s', '12s' (or '?' when unknown)."""
  if seconds != seconds or seconds == float("inf"):
    return "?"
  seconds = int(round(seconds))
  if seconds >= 3600:
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
  if seconds >= 60:
    return f"{seconds // 60}m{seconds % 60:02d}s"
  return f"{seconds}s"
