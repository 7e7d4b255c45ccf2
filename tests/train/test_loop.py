"""The training system end to end: main, resume, preemption, checkpoints, bad configs."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import t2mlr_jax
from t2mlr_jax import checkpoint
from t2mlr_jax.train import loop
from t2mlr_jax.train.metrics import read_metrics

from _util import REPO_ROOT

ROOT = REPO_ROOT
CONFIG = os.path.join(ROOT, "configs", "s5_retrieval.py")
STEPS = 80
# A run long enough to interrupt: evaluate and checkpoint only at the end.
LONG = [f"--config.train.num_steps={STEPS}", "--config.train.eval_every=1000",
        "--config.train.checkpoint_every=1000"]


@pytest.fixture(scope="module", autouse=True)
def compile_cache(tmp_path_factory):
  """The subprocess runs compile identical programs: share XLA's persistent cache."""
  env = {"JAX_COMPILATION_CACHE_DIR": str(tmp_path_factory.mktemp("xla_cache")),
         "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
  old = {k: os.environ.get(k) for k in env}
  os.environ.update(env)
  yield
  for k, v in old.items():
    if v is None:
      os.environ.pop(k, None)
    else:
      os.environ[k] = v


def main_cmd(workdir, *overrides):
  return [sys.executable, "-m", "t2mlr_jax.main", f"--config={CONFIG}:tiny",
          f"--workdir={workdir}", "--progress=false", *overrides]


def run_main(workdir, *overrides):
  out = subprocess.run(main_cmd(workdir, *overrides), cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  return out


def train_losses(workdir):
  return [(r["step"], r["loss"]) for r in read_metrics(workdir)]


def tiny_config(**train):
  sys.path.insert(0, os.path.dirname(CONFIG))
  import s5_retrieval
  sys.path.pop(0)
  c = s5_retrieval.get_config("tiny")
  c.train.update(**train)
  return c


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """One uninterrupted run of STEPS steps."""
  wd = str(tmp_path_factory.mktemp("reference"))
  run_main(wd, *LONG)
  return wd


def _params(workdir):
  return checkpoint.load(workdir)[1]


def _assert_same_params(a, b):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_stop_after_steps_then_resume_equals_uninterrupted(reference, tmp_path):
  wd = str(tmp_path)
  # an earlier attempt that crashed before any checkpoint left records: they are dropped
  with open(os.path.join(wd, "metrics.jsonl"), "w") as f:
    f.writelines(json.dumps({"step": s, "kind": "train", "loss": 99.0}) + "\n"
                 for s in range(1, 6))
  run_main(wd, *LONG, "--config.train.stop_after_steps=30")
  assert checkpoint.Checkpointer(wd).all_steps() == [30]
  assert [s for s, _ in train_losses(wd)] == list(range(1, 31))
  assert json.load(open(os.path.join(wd, "run_info.json")))["library_version"] == \
      t2mlr_jax.__version__
  out = run_main(wd, *LONG)
  assert "resumed from step 30" in out.stdout + out.stderr
  assert train_losses(wd) == train_losses(reference)          # same data, same numbers
  _assert_same_params(_params(wd), _params(reference))
  evals = read_metrics(wd, "eval")
  assert evals[-1]["step"] == STEPS and set(evals[-1]["seq_acc_by_length"]) == {"2", "6"}
  again = run_main(wd, *LONG)          # a finished run: says so and where its results are
  said = again.stdout + again.stderr
  assert f"is complete (step {STEPS} of {STEPS}): nothing to train" in said, said[-2000:]
  assert "metrics.jsonl" in said and "resumed from" not in said


def _damage_largest_shard(step_dir):
  """Overwrite the step's largest parameter data file with zeros of the same size (a few
  zeroed bytes inside a compressed frame can decode to wrong values unnoticed; a broken
  frame header never does)."""
  files = [p for p in (step_dir / "params").rglob("*")
           if p.is_file() and p.parent.name == "d" and "ocdbt" in p.parent.parent.name]
  shard = max(files, key=lambda p: p.stat().st_size)
  data = bytes(shard.stat().st_size)
  shard.write_bytes(data)
  return shard.relative_to(step_dir), data


@pytest.mark.slow       # three runs; the stop_after_steps resume runs by default
def test_a_damaged_checkpoint_is_named_and_resume_step_goes_on_from_an_intact_one(
    reference, tmp_path):
  wd, ckpts = str(tmp_path), tmp_path / "checkpoints"
  every = ["--config.train.checkpoint_every=20", "--config.train.max_to_keep=5"]
  run_main(wd, *LONG, *every, "--config.train.stop_after_steps=60")
  assert checkpoint.saved_steps(wd) == [20, 40, 60]
  shard, damaged = _damage_largest_shard(ckpts / "60")
  # a save killed half-way (SIGKILL during an asynchronous save) leaves Orbax's temporary
  # directory of a later step: the resume must not take it for a checkpoint
  shutil.copytree(ckpts / "40", ckpts / "80.orbax-checkpoint-tmp-1764633600")
  (ckpts / "80.orbax-checkpoint-tmp-1764633600" / "params" / "_METADATA").unlink()
  out = subprocess.run(main_cmd(wd, *LONG, *every), cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
  lines = [line for line in out.stderr.splitlines() if line.strip()]
  assert out.returncode == 2 and len(lines) == 1, out.stderr[-3000:]
  assert lines[0].startswith(f"error: checkpoint step 60 in {wd} could not be read: array "
                             "params/"), lines[0]
  assert "--config.train.resume_step=40 (saved: [20, 40]" in lines[0]
  assert (ckpts / "60" / shard).read_bytes() == damaged           # nothing touched
  out = run_main(wd, *LONG, *every, "--config.train.resume_step=40")
  assert "saved steps [60] moved to" in out.stdout + out.stderr
  # the damaged step is kept aside, byte for byte; the run goes on as if never interrupted
  assert (tmp_path / checkpoint.SET_ASIDE / "60" / shard).read_bytes() == damaged
  assert checkpoint.saved_steps(wd) == [20, 40, 60, 80]
  assert train_losses(wd) == train_losses(reference)
  _assert_same_params(_params(wd), _params(reference))


@pytest.mark.slow       # two runs; the stop_after_steps resume runs by default
def test_a_checkpoint_written_with_the_options_in_the_recurrence_resumes(reference, tmp_path):
  """A checkpoint whose config and meta hold the schedules' options inside the recurrence
  group (as the code before they moved to their schedules wrote it; older ones lack some
  of them altogether) resumes to the uninterrupted run's numbers."""
  wd = str(tmp_path)
  run_main(wd, *LONG, "--config.train.stop_after_steps=30")
  step = tmp_path / "checkpoints" / "30"
  for item in ("config", "meta"):
    path = step / item / "metadata"
    saved = json.loads(path.read_text())
    model = saved["model"] if item == "config" else saved["model_config"]
    options = model.pop("schedule_options")
    model["recurrence"].update({k: v for k, v in options.items()
                                if k in ("d_forward", "d_backward", "jacobi_tol")})
    path.write_text(json.dumps(saved))
  out = run_main(wd, *LONG)
  assert "resumed from step 30" in out.stdout + out.stderr
  assert train_losses(wd) == train_losses(reference)
  _assert_same_params(_params(wd), _params(reference))


@pytest.mark.slow       # three runs; test_step checks the leaf at every step by default
def test_the_recurrent_weight_curriculum_trains_resumes_bit_identically_and_decodes(tmp_path):
  """The release's curriculum from the config (a fixed recurrent gate, linear from 0.2 to
  0.8 over half the run): stopped and resumed, the run equals the uninterrupted one; the
  checkpoint keeps the last step's weight, and the model decodes."""
  def config(**train):
    c = tiny_config(num_steps=12, eval_every=1000, checkpoint_every=1000, log_every=1,
                    **train)
    c.model.recurrence.update(
        mixer_options=("use_learnable_recurrent_gate=False",
                       "rezero_gamma_recurrent_gate_init=0.5"),
        use_recurrent_weight_curriculum=True, recurrent_weight_curriculum_start=0.2,
        recurrent_weight_curriculum_end=0.8, recurrent_weight_curriculum_warmup_ratio=0.5)
    return c
  whole, parts = str(tmp_path / "whole"), str(tmp_path / "parts")
  loop.train(config(), whole, progress=False)
  loop.train(config(stop_after_steps=5), parts, progress=False)
  loop.train(config(), parts, progress=False)
  assert train_losses(parts) == train_losses(whole)
  _assert_same_params(_params(parts), _params(whole))
  logged = [r["recurrent_weight"] for r in read_metrics(whole)]
  assert logged == pytest.approx([0.2 + 0.6 * min(s / 6, 1.0) for s in range(12)], abs=1e-6)
  cfg, params = checkpoint.load(whole)[:2]
  assert float(params["recurrence"]["recurrent_weight"]) == pytest.approx(0.8)
  new = t2mlr_jax.generate(params, cfg, np.ones((1, 4), np.int32), max_new_tokens=3)
  assert np.asarray(new).shape == (1, 3)


def test_a_log_window_shorter_than_log_every_says_which_steps_it_averages(
    tmp_path, capsys, monkeypatch):
  """After a resume (or at a stop) the first window covers fewer steps than log_every: its
  line names them, and the record says how many steps its mean loss has. Its rates count
  the wait for the window's results (steps dispatch asynchronously): a wait of 0.2 s
  before each fetch bounds steps/s by window/0.2."""
  check_finite = loop._check_finite

  def waiting(*args, **kwargs):
    time.sleep(0.2)
    return check_finite(*args, **kwargs)

  monkeypatch.setattr(loop, "_check_finite", waiting)
  wd = str(tmp_path)
  loop.train(tiny_config(num_steps=12, log_every=5, stop_after_steps=7), wd, progress=True)
  loop.train(tiny_config(num_steps=12, log_every=5), wd, progress=True)
  printed = [l for l in capsys.readouterr().out.splitlines() if l.startswith("step ")]
  train = [l for l in printed if "eval" not in l]
  assert [l.split()[1] for l in train] == ["5/12", "7/12", "10/12", "12/12"]
  assert "over_steps" not in train[0] and "over_steps 6-7 " in train[1]
  assert "over_steps 8-10 " in train[2] and "over_steps 11-12 " in train[3]
  assert [(r["step"], r["loss_window"]) for r in read_metrics(wd)] == \
      [(5, 5), (7, 2), (10, 3), (12, 2)]
  for r in read_metrics(wd):
    assert r["steps_per_sec"] <= r["loss_window"] / 0.2, r
    assert r["tokens_per_sec"] == pytest.approx(r["steps_per_sec"] * 8 * 48)


def test_the_loop_runs_at_most_a_few_steps_ahead_of_the_device(tmp_path, monkeypatch):
  """JAX dispatches asynchronously: unbounded, the loop ran tens of steps ahead of a slow
  device, and a stop signal's save waited for all of them."""
  ticks, pending = [], []

  @jax.jit
  def tick(loss):                   # tens of milliseconds of device work after each step
    x = jnp.full((384, 384), loss * 1e-3)
    return jax.lax.fori_loop(0, 12, lambda i, x: jnp.tanh(x @ x), x)[0, 0]

  real = loop.make_train_step

  def make(*args, **kwargs):
    step = real(*args, **kwargs)

    def slowed(state, batch):
      state, metrics = step(state, batch)
      pending.append(sum(not t.is_ready() for t in ticks))   # steps the device owes
      ticks.append(tick(metrics["loss"]))
      return state, {**metrics, "tick": ticks[-1]}
    return slowed

  monkeypatch.setattr(loop, "make_train_step", make)
  loop.train(tiny_config(num_steps=40, log_every=40, eval_every=40, checkpoint_every=40),
             str(tmp_path), progress=False)
  assert len(ticks) == 40
  assert max(pending) <= loop.MAX_STEPS_IN_FLIGHT, pending


@pytest.mark.slow       # a full run; the stop_after_steps resume runs by default
def test_sigterm_saves_and_resumes_to_the_same_parameters(reference, tmp_path):
  wd = str(tmp_path)
  proc = subprocess.Popen(main_cmd(wd, *LONG), cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
  metrics = os.path.join(wd, "metrics.jsonl")
  deadline = time.time() + 120
  while time.time() < deadline:
    if os.path.exists(metrics) and sum(1 for _ in open(metrics)) >= 10:
      break
    time.sleep(0.01)
  proc.send_signal(signal.SIGTERM)
  _, err = proc.communicate(timeout=120)
  assert proc.returncode == 0, err[-3000:]
  stopped = checkpoint.Checkpointer(wd).latest_step()
  assert 10 <= stopped < STEPS, stopped
  run_main(wd, *LONG)
  _assert_same_params(_params(wd), _params(reference))
  assert train_losses(wd) == train_losses(reference)


def test_load_in_a_fresh_process_gives_identical_logits(reference, tmp_path):
  tokens = np.arange(2 * 12, dtype=np.int32).reshape(2, 12) % 188
  np.save(tmp_path / "tokens.npy", tokens)
  script = (
      "import sys, numpy as np, t2mlr_jax\n"
      "from t2mlr_jax import checkpoint\n"
      f"cfg, params = checkpoint.load({reference!r})\n"
      f"tokens = np.load({str(tmp_path / 'tokens.npy')!r})\n"
      "logits = t2mlr_jax.forward(params, cfg, tokens, mode='exact')\n"
      f"np.save({str(tmp_path / 'logits.npy')!r}, np.asarray(logits))\n")
  out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  cfg, params = checkpoint.load(reference)
  ours = np.asarray(t2mlr_jax.forward(params, cfg, tokens, mode="exact"))
  np.testing.assert_array_equal(np.load(tmp_path / "logits.npy"), ours)
  assert cfg.recurrence is not None and cfg.n_layers == 3


def test_evaluate_cli(reference, tmp_path):
  out_file = str(tmp_path / "eval.json")
  out = subprocess.run([sys.executable, "-m", "t2mlr_jax.evaluate", f"--workdir={reference}",
                        f"--output={out_file}"], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  result = json.load(open(out_file))
  assert result["step"] == STEPS and result["mode"] == "exact"
  assert set(result["seq_acc_by_length"]) == {"2", "6"}
  final_eval = read_metrics(reference, "eval")[-1]
  assert result["loss"] == pytest.approx(final_eval["loss"], abs=1e-6)


@pytest.mark.slow       # a full run; slow step
def test_resume_refuses_a_different_config(tmp_path, monkeypatch):
  wd = str(tmp_path)
  loop.train(tiny_config(num_steps=2, eval_every=100), wd, progress=False)
  changed = tiny_config(num_steps=2, eval_every=100)
  changed.optimizer.lr = 1e-2
  closed = []
  for cls in (checkpoint.Checkpointer, loop.MetricsWriter):
    monkeypatch.setattr(cls, "close", lambda self, close=cls.close, name=cls.__name__: (
        closed.append(name), close(self)))
  with pytest.raises(ValueError, match="optimizer.lr"):
    loop.train(changed, wd, progress=False)
  # the refusal closes what train() opened (TensorBoard writer, Orbax checkpointer)
  assert sorted(closed) == ["Checkpointer", "MetricsWriter"]
  monkeypatch.undo()
  # a run saved with one data layout (processes × batch slices) is not resumed in another
  monkeypatch.setattr(loop.sharding, "process_batch_slot", lambda mesh, batch: (0, 2))
  with pytest.raises(ValueError, match=r"saved by 1 process\(es\) reading the data in 1 "
                                       r"slice\(s\); this run has 1 process\(es\) and 2"):
    loop.train(tiny_config(num_steps=2, eval_every=100), wd, progress=False)
  monkeypatch.undo()
  # cadences (and the attention kernel) may change on resume
  changed = tiny_config(num_steps=2, log_every=2, eval_every=50)
  changed.model.attention = "splash"
  loop.train(changed, wd, progress=False)


def test_nonfinite_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path):
  wd = str(tmp_path)
  config = tiny_config(num_steps=10, checkpoint_every=1)
  config.optimizer.update(lr=1e30, grad_clip=0.0)
  with pytest.raises(loop.NonFiniteLossError, match="non-finite loss"):
    loop.train(config, wd, progress=False)
  ckpt = checkpoint.Checkpointer(wd)
  last = ckpt.latest_step()
  assert last is not None and last < 10
  _, params = checkpoint.load(wd, last)
  assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(params))


@pytest.mark.parametrize("edit,field", [
    (lambda c: c.train.update(num_steps=-5), "train.num_steps"),
    (lambda c: c.mesh.update(data=3, fsdp=1, tensor=1), "mesh"),
    (lambda c: c.model.schedule_options.update(d_forward=2, d_backward=3),
     "model.schedule_options.d_backward"),
    (lambda c: c.model.recurrence.update(d_forward=8), "model.schedule_options.d_forward"),
    (lambda c: c.optimizer.update(name="lion"), "optimizer.name"),
    (lambda c: c.train.update(seq_len=10), "train.seq_len"),
    (lambda c: c.data.update(task="imagenet"), "data.task"),
    (lambda c: c.model.update(arch="mamba"), "model.arch"),
    (lambda c: c.train.update(batch_size=6), "train.batch_size"),
    (lambda c: c.model.recurrence.update(l_start=2, l_end=1), "l_start"),
    (lambda c: c.data.update(curriculum_start=99), "data.curriculum_start"),
    (lambda c: c.data.update(curriculum_start=2, curriculum_hold_steps=-1),
     "data.curriculum_hold_steps"),
    (lambda c: c.data.update(group_curriculum="S4:10"), "data.group_curriculum"),
    (lambda c: c.data.update(value_curriculum="9:10"), "data.value_curriculum"),
    (lambda c: c.train.update(resume_step=0), "train.resume_step"),
    (lambda c: c.model.update(d_model=-1), r"config field model\.d_model=-1 is invalid"),
    (lambda c: c.data.update(group="S7"), r"config field data\.group='S7' is invalid"),
])
def test_bad_config_fails_before_any_compile(tmp_path, edit, field):
  config = tiny_config()
  edit(config)
  wd = str(tmp_path / "run")
  with pytest.raises(ValueError, match=field):
    loop.train(config, wd, progress=False)
  assert not os.path.exists(wd)          # nothing created, nothing compiled


def test_a_workdir_that_is_a_file_is_refused(tmp_path):
  (tmp_path / "a_file").write_text("notes\n")
  with pytest.raises(ValueError, match="workdir .*a_file is a file: allowed a directory"):
    loop.train(tiny_config(), str(tmp_path / "a_file"), progress=False)
  assert (tmp_path / "a_file").read_text() == "notes\n"


def test_progress_without_a_terminal_writes_one_line_per_update():
  """A log file or notebook cell cannot show the bar: each update becomes a line with the
  step, the logged values, the rate and the ETA."""
  import io

  from t2mlr_jax.train.metrics import Progress
  out = io.StringIO()                       # not a terminal
  bar = Progress(100, 20, stream=out)
  bar.update(10, loss=2.5, tok_s=1234)
  bar.update(10, loss=2.25, tok_s=1300)
  bar.close()
  lines = out.getvalue().splitlines()
  assert len(lines) == 2
  assert lines[0].startswith("step 30/100 loss 2.5 tok_s 1234 (")
  assert lines[1].startswith("step 40/100 loss 2.25 tok_s 1300 (") and "eta " in lines[1]
  silent = io.StringIO()
  Progress(100, 0, enabled=False, stream=silent).update(10, loss=1.0)
  assert silent.getvalue() == ""
  # the rate and the ETA count from compiled() (the first step's compile left out)
  timed = io.StringIO()
  bar = Progress(100, 0, stream=timed)
  time.sleep(0.5)                           # the first step, compiling
  bar.compiled()
  bar.update(10)
  rate = float(re.search(r"\(([0-9.e+]+) step/s", timed.getvalue()).group(1))
  assert rate > 100, timed.getvalue()       # 9 steps in no time, not 10 in 0.5 s


def test_jacobi_sweeps_are_logged_as_the_window_mean_and_counted_in_flops_spent(tmp_path):
  """Under a tolerance the sweeps vary by step (here 4 or 8: one free sweep or all); a log
  line keeps their window mean, so the FLOPs a run spent are the same whatever log_every."""
  from t2mlr_jax import flops
  from t2mlr_jax.train import config as config_lib

  def run(log_every):
    c = tiny_config(num_steps=8, log_every=log_every, eval_every=8, checkpoint_every=8)
    c.model.schedule_options.update(d_forward=8, jacobi_tol=0.6)
    wd = str(tmp_path / f"log{log_every}")
    loop.train(c, wd, progress=False)
    return c, read_metrics(wd)

  c, each = run(1)
  _, windows = run(4)
  per_step = [r["jacobi_sweeps"] for r in each]
  assert len(set(per_step)) > 1, per_step        # the tolerance made the sweeps vary
  means = [float(np.mean(per_step[i:i + 4])) for i in (0, 4)]
  assert [r["jacobi_sweeps"] for r in windows] == pytest.approx(means)
  cfg = config_lib.model_config(c)
  t = c.train
  spent = [flops.train_flops_spent(cfg, t.batch_size, t.seq_len, "jacobi", log)
           for log in (each, windows)]
  by_step = sum(flops.train_step_flops(cfg, t.batch_size, t.seq_len, "jacobi", sweeps=s)
                for s in per_step)
  assert spent == pytest.approx([by_step, by_step], rel=1e-12)
  assert by_step < 8 * flops.train_step_flops(cfg, t.batch_size, t.seq_len, "jacobi")
  with pytest.raises(ValueError, match="loss_window"):
    flops.train_flops_spent(cfg, t.batch_size, t.seq_len, "jacobi", [{"jacobi_sweeps": 4}])


_BUSY_UNDER_STOP_SIGNAL = """
import sys, time
from t2mlr_jax.train import loop
with loop._StopSignal() as stop:
  print("ready", flush=True)
  time.sleep(120)                  # the main thread busy (a compile, a long step)
"""


def test_ctrl_c_is_acknowledged_at_once_and_a_second_one_exits_without_saving():
  """The first SIGINT is answered while the main thread is still busy (the loop would save
  after the step); the second exits at once with 128 + SIGINT, saving nothing."""
  p = subprocess.Popen([sys.executable, "-c", _BUSY_UNDER_STOP_SIGNAL], cwd=ROOT, text=True,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
  try:
    assert p.stdout.readline().strip() == "ready"
    p.send_signal(signal.SIGINT)
    start = time.monotonic()
    ack = p.stdout.readline()
    assert "received SIGINT: saving after this step" in ack and "Ctrl-C again" in ack, ack
    assert time.monotonic() - start < 10
    p.send_signal(signal.SIGINT)
    assert p.wait(timeout=10) == 128 + signal.SIGINT
    assert "received SIGINT again: exiting without saving" in p.stdout.read()
  finally:
    p.kill()
