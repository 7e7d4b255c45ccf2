"""Multi-process training with JAX's own distributed runtime: 2 processes on localhost,
4 CPU devices each (gloo collectives), the tiny S5 config on a data×fsdp×tensor = 2×2×2
mesh spanning both, launched exactly as a user would (`python -m t2mlr_jax.main
--coordinator_address=... --num_processes=2 --process_id=i`).

(i) the losses equal a single-process 8-device run of the same mesh; (ii) SIGTERM to one
process mid-run: both save the same step and exit 0; (iii) resuming on 2 processes
continues bit-identically to an uninterrupted run. Every launch is bounded by a timeout.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

import _xla_flags
from _util import REPO_ROOT

pytestmark = pytest.mark.slow

ROOT = REPO_ROOT
STEPS = 40
TIMEOUT = 300


def _free_port() -> int:
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _command(workdir, *extra, mesh=(2, 2, 2)):
  return [sys.executable, "-m", "t2mlr_jax.main", "--config=configs/s5_retrieval.py:tiny",
          f"--workdir={workdir}", "--progress=false", f"--config.mesh.data={mesh[0]}",
          f"--config.mesh.fsdp={mesh[1]}", f"--config.mesh.tensor={mesh[2]}",
          f"--config.train.num_steps={STEPS}", "--config.train.eval_every=1000",
          "--config.train.checkpoint_every=1000", *extra]


def _env(devices: int) -> dict:
  env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES=str(devices))
  for k in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
    env.pop(k, None)
  # the suite's compile-speed flags (tests/_xla_flags.py) stay: less compiling per launch
  env["XLA_FLAGS"] = _xla_flags.split(env.get("XLA_FLAGS", ""))[0]
  for k in [k for k in env if k.startswith("SLURM_") or k.startswith("OMPI_")]:
    env.pop(k)
  return env


def _launch(workdir, n: int = 2, *extra, mesh=(2, 2, 2)):
  port = _free_port()
  return [subprocess.Popen(
      _command(workdir, f"--coordinator_address=127.0.0.1:{port}", f"--num_processes={n}",
               f"--process_id={i}", *extra, mesh=mesh),
      cwd=ROOT, env=_env(8 // n), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
      for i in range(n)]


def _finish(procs, timeout=TIMEOUT):
  """Wait for every process (killing all of them at the deadline); their outputs."""
  deadline = time.time() + timeout
  outs = []
  try:
    for p in procs:
      out, _ = p.communicate(timeout=max(1, deadline - time.time()))
      outs.append(out)
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.communicate()
  return outs


def _run(workdir, n=2, *extra, mesh=(2, 2, 2)):
  procs = _launch(workdir, n, *extra, mesh=mesh) if n > 1 else [subprocess.Popen(
      _command(workdir), cwd=ROOT, env=_env(8), stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT, text=True)]
  outs = _finish(procs)
  for p, out in zip(procs, outs):
    assert p.returncode == 0, out[-3000:]
  return outs


def _metrics(workdir, kind="train"):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [r for r in map(json.loads, f) if r["kind"] == kind]


def _steps_saved(workdir):
  ckpt = os.path.join(workdir, "checkpoints")
  names = os.listdir(ckpt)
  assert all(name.isdigit() for name in names), names       # no half-written tmp dirs
  return sorted(int(n) for n in names)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  root = tmp_path_factory.mktemp("multiprocess")
  single, multi = str(root / "single"), str(root / "multi")
  _run(single, n=1)
  _run(multi, n=2)
  return single, multi, root


def test_two_processes_train_like_one(runs):
  single, multi, _ = runs
  a, b = _metrics(single), _metrics(multi)
  assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(1, STEPS + 1))
  np.testing.assert_allclose([r["loss"] for r in b], [r["loss"] for r in a], rtol=0, atol=1e-5)
  ea, eb = _metrics(single, "eval"), _metrics(multi, "eval")
  assert len(ea) == len(eb) == 1
  assert eb[0]["loss"] == pytest.approx(ea[0]["loss"], abs=1e-5)
  with open(os.path.join(multi, "run_info.json")) as f:
    assert json.load(f)["process_count"] == 2


def test_a_slurm_step_with_the_tensor_axis_spanning_both_processes(runs):
  """Under SLURM (`srun` sets these per task) the trainer takes no coordinator flag:
  jax.distributed.initialize() reads the job's node list, task count and task id (the
  port from JAX_COORDINATOR_PORT), and the two processes train as one. The mesh is
  1×1×8: both processes hold every batch row, so both read the same examples."""
  single, _, root = runs
  workdir, port = str(root / "slurm_tensor8"), _free_port()
  procs = []
  for i in range(2):
    env = _env(4)
    env.update(SLURM_JOB_ID="4242", SLURM_STEP_NODELIST="127.0.0.1", SLURM_NTASKS="2",
               SLURM_STEP_NUM_NODES="1", SLURM_PROCID=str(i), SLURM_LOCALID=str(i),
               JAX_COORDINATOR_PORT=str(port))
    procs.append(subprocess.Popen(
        _command(workdir, "--config.train.stop_after_steps=4", mesh=(1, 1, 8)),
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
  for p, out in zip(procs, _finish(procs)):
    assert p.returncode == 0, out[-3000:]
  with open(os.path.join(workdir, "run_info.json")) as f:
    assert json.load(f)["process_count"] == 2
  np.testing.assert_allclose([r["loss"] for r in _metrics(workdir)],
                             [r["loss"] for r in _metrics(single)[:4]], rtol=0, atol=1e-5)


def test_sigterm_to_one_process_stops_both_at_the_same_step_then_resume_is_exact(runs):
  _, multi, root = runs
  workdir = str(root / "interrupted")
  procs = _launch(workdir)
  metrics = os.path.join(workdir, "metrics.jsonl")
  deadline = time.time() + TIMEOUT
  try:
    while time.time() < deadline:          # wait until a few steps are done
      if os.path.isfile(metrics) and len(_metrics(workdir)) >= 4:
        break
      assert all(p.poll() is None for p in procs), "a process exited before the signal"
      time.sleep(0.05)
    procs[1].send_signal(signal.SIGTERM)   # only process 1 is told
  finally:
    outs = _finish(procs)
  for p, out in zip(procs, outs):
    assert p.returncode == 0, out[-3000:]
  saved = _steps_saved(workdir)
  stopped = _metrics(workdir)[-1]["step"]
  assert saved == [stopped] and 4 <= stopped < STEPS, (saved, stopped)
  assert "saved step" in outs[0] and f"saved step {stopped}" in outs[0]

  _run(workdir)                             # resume on 2 processes, to the end
  resumed, uninterrupted = _metrics(workdir), _metrics(multi)
  assert [r["step"] for r in resumed] == list(range(1, STEPS + 1))
  assert [r["loss"] for r in resumed] == [r["loss"] for r in uninterrupted]   # bit-identical
  from t2mlr_jax import checkpoint
  _, p_resumed = checkpoint.load(workdir)
  _, p_straight = checkpoint.load(multi)
  import jax
  for x, y in zip(jax.tree.leaves(p_resumed), jax.tree.leaves(p_straight)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
