"""The scheduler: one thread drives the engine (engine.py) for every request's jobs and
hands each job its tokens as they come (server.py, routes.py)."""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from typing import Any, Optional

from t2mlr_jax.serving.engine import Engine
from t2mlr_jax.serving.schemas import ApiError, Settings


class Job:
  """One prompt's generation: the scheduler pushes its events, the HTTP side reads them."""

  def __init__(self, ids: list, settings: Settings, loop):
    self.ids, self.settings, self.loop = ids, settings, loop
    self.events: asyncio.Queue = asyncio.Queue()
    self.cancelled = threading.Event()
    self.produced = 0
    self.submitted = time.perf_counter()

  def emit(self, event: str, value: Any = None) -> None:
    self.loop.call_soon_threadsafe(self.events.put_nowait, (event, value))


class QueueFull(Exception):
  pass


class Scheduler:
  """Drives the engine in one thread: admits queued jobs into free slots (prefill +
  insert), steps every slot, hands out tokens, frees the slots of finished or
  abandoned jobs (within one step)."""

  def __init__(self, engine: Engine, eos_id: Optional[int], max_queue: int):
    self.engine, self.eos_id, self.max_queue = engine, eos_id, max_queue
    self.pending: collections.deque = collections.deque()
    self.wake = threading.Condition()
    self.stopping = False
    self.stats = collections.Counter()
    self.ttft_sum = 0.0
    self.thread = threading.Thread(target=self._run, name="engine", daemon=True)

  def start(self) -> None:
    self.thread.start()

  def submit(self, jobs: list) -> None:
    with self.wake:
      if self.stopping:
        raise ApiError(503, "the server is shutting down", error_type="server_error")
      if len(self.pending) + len(jobs) > self.max_queue:
        raise QueueFull()
      self.pending.extend(jobs)
      self.stats["requests_total"] += len(jobs)
      self.wake.notify()

  def depth(self) -> int:
    return len(self.pending)

  def stop(self, timeout: float) -> None:
    """Take no new jobs; finish those in flight and queued (at most `timeout` s)."""
    with self.wake:
      self.stopping = True
      self.wake.notify()
    self.thread.join(timeout)

  def _finish(self, row: Optional[int], job: Job, reason: str) -> None:
    if row is not None:
      self.engine.release(row)
    job.emit("done", reason)

  def _emit_token(self, row: Optional[int], job: Job, out) -> bool:
    """Hand a token to its job ("eos" for the end of sequence: its entry and count, not
    its text; it ends the job unless the request set ignore_eos); True when the job is
    finished (its slot freed)."""
    job.produced += 1
    if job.produced == 1:
      self.ttft_sum += time.perf_counter() - job.submitted
      self.stats["first_tokens"] += 1
    self.stats["tokens_total"] += 1
    if self.eos_id is not None and out.token == self.eos_id:
      job.emit("eos", out)
      if not job.settings.ignore_eos:
        self._finish(row, job, "stop")
        return True
    else:
      job.emit("token", out)
    if job.produced >= job.settings.max_tokens:
      self._finish(row, job, "length")
      return True
    return False

  def _admit(self) -> None:
    """Queued jobs into free slots; the samples of one prompt (n > 1) share its prefill."""
    last = None
    while self.pending and self.engine.active() < self.engine.max_batch:
      with self.wake:
        job = self.pending.popleft()
      if job.cancelled.is_set():
        job.emit("done", "cancelled")
        continue
      s = job.settings
      try:
        key = (tuple(job.ids), s.prompt_cf, s.max_tokens, s.echo)
        if last is None or last[0] != key:
          last = (key, self.engine.prefill(job.ids, control_flow=s.prompt_cf,
                                           max_tokens=s.max_tokens, echo=s.echo))
        pre, scores = last[1]
        if scores is not None:
          job.emit("prompt", scores)
        row, first = self.engine.insert(job, pre, s.max_tokens, control_flow=s.gen_cf,
                                        sampling=s.sampling, logprobs=s.logprobs is not None)
      except Exception as e:  # noqa: BLE001 - a bad request must not stop the server
        job.emit("error", str(e))
        continue
      self._emit_token(row, job, first)

  def _run(self) -> None:
    while True:
      with self.wake:
        while not self.pending and not self.engine.active() and not self.stopping:
          self.wake.wait(0.5)
        if self.stopping and not self.pending and not self.engine.active():
          return
      for row, job in enumerate(list(self.engine.rows)):
        if job is not None and job.cancelled.is_set():
          self._finish(row, job, "cancelled")
      self._admit()
      if self.engine.active():
        for row, job, out in self.engine.step():
          self._emit_token(row, job, out)
