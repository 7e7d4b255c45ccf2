"""A user's own recurrence type and schedule, outside the package (docs/examples/echo.py,
full_jacobi.py), plug in with --user_module as docs/design.md says: the CLI trainer runs
them under AdamW and Muon, checkpoints and resumes bit for bit, logs the FLOP model's
count (checked against XLA's on an unrolled build), `evaluate` scores the checkpoint,
`generate` decodes it, and the optimizer and partitioner follow the type's declarations."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from t2mlr_jax import checkpoint, flops, forward, generate, init_params, loss, registry
from t2mlr_jax.checkpoint import Checkpointer
from t2mlr_jax.train.config import model_config
from t2mlr_jax.train.optimizer import decay_mask, param_groups

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "docs", "examples")
USER = f"--user_module={EXAMPLES}/echo.py,{EXAMPLES}/full_jacobi.py"
CONFIG = f"--config={EXAMPLES}/s5_echo.py:tiny"
SCHEDULE = ("--config.train.mode=full_jacobi",
            "--config.model.schedule_options.full_sweeps=2")


@pytest.fixture(scope="module", autouse=True)
def _restore_registries():
  """What these tests register (the examples) is gone after them: other test files see the
  library's own entries only."""
  before = {r: r.names() for r in (registry.RECURRENCES, registry.SCHEDULES)}
  modules = list(registry.USER_MODULES)
  yield
  for reg, names in before.items():
    for name in set(reg.names()) - set(names):
      reg.unregister(name)
  registry.USER_MODULES[:] = modules


def _cli(module, *args):
  return subprocess.Popen([sys.executable, "-m", module, *args], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                          env=dict(os.environ, JAX_PLATFORMS="cpu"))


def _done(proc):
  out, _ = proc.communicate(timeout=600)
  assert proc.returncode == 0, out
  return out


def _metrics(workdir) -> list:
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [r for r in map(json.loads, f) if r.get("kind") == "train"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """Four CLI runs of the example config: full_jacobi under AdamW straight through, the
  same stopped at step 3 and resumed, and Muon under the type's default schedule."""
  root = tmp_path_factory.mktemp("user_module")
  wd = {name: str(root / name) for name in ("straight", "resumed", "muon")}
  common = (USER, CONFIG, "--progress=false")
  first = [_cli("t2mlr_jax.main", *common, *SCHEDULE, f"--workdir={wd['straight']}"),
           _cli("t2mlr_jax.main", *common, *SCHEDULE, f"--workdir={wd['resumed']}",
                "--config.train.stop_after_steps=3"),
           _cli("t2mlr_jax.main", *common, f"--workdir={wd['muon']}",
                "--config.optimizer.name=muon", "--config.train.num_steps=3")]
  for proc in first:
    _done(proc)
  _done(_cli("t2mlr_jax.main", *common, *SCHEDULE, f"--workdir={wd['resumed']}"))
  return wd


def _register_examples():
  for name in ("echo.py", "full_jacobi.py"):
    registry.import_user_module(os.path.join(EXAMPLES, name))


def test_resume_is_bit_identical_and_the_run_records_its_modules(runs):
  straight, resumed = _metrics(runs["straight"]), _metrics(runs["resumed"])
  assert [r["step"] for r in straight] == [1, 2, 3, 4, 5, 6]
  assert [r["step"] for r in resumed] == [1, 2, 3, 4, 5, 6]
  assert [r["loss"] for r in straight] == [r["loss"] for r in resumed]
  assert straight[-1]["alpha"] != 0.0               # the gate trained
  ckpt = Checkpointer(runs["resumed"], read_only=True)
  meta = ckpt.read_json(ckpt.latest_step(), "meta")
  assert meta["user_modules"] == [os.path.join(EXAMPLES, "echo.py"),
                                  os.path.join(EXAMPLES, "full_jacobi.py")]
  assert meta["model_config"]["recurrence"]["type"] == "echo"


def test_muon_trains_the_type_under_its_default_schedule(runs):
  muon = _metrics(runs["muon"])
  assert [r["step"] for r in muon] == [1, 2, 3]
  assert all(np.isfinite(r["loss"]) for r in muon)
  assert "jacobi_sweeps" in muon[-1]                # echo's default_schedule: jacobi


def test_logged_flops_match_xla_on_an_unrolled_step(runs):
  """The trainer logs the cost model's FLOPs per step (the schedule's own `flops`
  declaration); XLA's count of the same step built without loops is within the model's
  10% (tests/test_flops.py)."""
  _register_examples()
  sys.path.insert(0, EXAMPLES)
  import s5_echo
  c = s5_echo.get_config("tiny")
  c.train.mode, c.model.schedule_options.full_sweeps = "full_jacobi", 2
  cfg = model_config(c)
  B, T = c.train.batch_size, c.train.seq_len
  logged = _metrics(runs["straight"])[-1]["step_flops"]
  assert logged == flops.train_step_flops(cfg, B, T, "full_jacobi")
  unrolled = cfg.replace(scan_layers=False)
  params = init_params(unrolled, jax.random.PRNGKey(0))
  step = jax.jit(jax.grad(lambda p, t: loss(p, unrolled, t, mode="full_jacobi")))
  analysis = step.lower(params, np.zeros((B, T), np.int32)).compile().cost_analysis()
  xla = float((analysis[0] if isinstance(analysis, (list, tuple)) else analysis)["flops"])
  assert abs(logged / xla - 1) < 0.10, (logged, xla)


def test_evaluate_and_generate_the_checkpoint(runs):
  out = _done(_cli("t2mlr_jax.evaluate", USER, f"--workdir={runs['straight']}"))
  results = json.loads(out[out.index("{"):out.rindex("}") + 1])
  assert results["step"] == 6 and 0.0 <= results["seq_acc"] <= 1.0
  _register_examples()
  cfg, params = checkpoint.load(runs["straight"])
  assert cfg.recurrence.type == "echo"
  params = {**params, "recurrence": {**params["recurrence"], "alpha": np.float32(0.8)}}
  prompt = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 5)).astype(np.int32)
  new, step_logits = generate(params, cfg, prompt, max_new_tokens=3, return_logits=True)
  exact = forward(params, cfg, np.concatenate([prompt, np.asarray(new)], 1), mode="exact")
  assert float(np.abs(np.asarray(step_logits) - np.asarray(exact[:, 4:7])).max()) <= 1e-4
  assert float(np.abs(exact - forward(params, cfg, np.concatenate(
      [prompt, np.asarray(new)], 1), mode="parallel")).max()) > 1e-3   # the echo is on


def test_the_type_declares_its_decay_groups_and_partition():
  """echo's gate α is kept out of weight decay by its own declaration, W decays; under
  Muon α is a scalar and W a matrix; W gets the row its type declares."""
  _register_examples()
  sys.path.insert(0, EXAMPLES)
  from t2mlr_jax import sharding

  import s5_echo
  cfg = model_config(s5_echo.get_config("tiny"))
  params = init_params(cfg, jax.random.PRNGKey(0))
  mask = decay_mask(params, cfg)
  assert not mask["recurrence"]["alpha"] and mask["recurrence"]["w"]
  groups = param_groups(params, cfg)
  assert groups["recurrence"]["alpha"] == "scalars"
  assert groups["recurrence"]["w"] == "matrices"
  mesh = sharding.make_mesh({"data": 1, "fsdp": 8}, model_width=cfg.d_model)
  assert tuple(sharding.spec_for("recurrence/w", (32, 32), mesh, cfg)) == ("fsdp", None)


def test_bad_user_module_is_one_line(tmp_path):
  proc = _cli("t2mlr_jax.main", f"--user_module={tmp_path}/missing.py", CONFIG,
              f"--workdir={tmp_path}/wd")
  out, _ = proc.communicate(timeout=300)
  assert proc.returncode == 2
  assert out.strip().splitlines()[-1].startswith(
      f"error: --user_module='{tmp_path}/missing.py' is invalid: allowed the path of an "
      "existing .py file")
