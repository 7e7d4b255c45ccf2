"""A user's own recurrence type and schedule, outside the package (docs/examples/echo.py,
full_jacobi.py), plug in with --user_module as docs/design.md says: the CLI trainer runs
them under AdamW and Muon, checkpoints and resumes bit for bit, logs the FLOP model's
count (checked against XLA's on an unrolled build), `evaluate` scores the checkpoint,
`generate` decodes it, and the optimizer and partitioner follow the type's declarations."""

import importlib
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

from _util import EXAMPLES, REPO_ROOT, forget_modules, tiny_cfg

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
  forget_modules(EXAMPLES)


def _cli(module, *args):
  return subprocess.Popen([sys.executable, "-m", module, *args], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, cwd=REPO_ROOT,
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


def user_type_file(folder, stem="mytype", name="my_echo", retrofit=False) -> str:
  """docs/examples/echo.py as a user's own file folder/<stem>.py registering the type
  `name`; with `retrofit`, declaring it can be added to a pretrained model (α = 0 at init:
  a fresh echo keeps the model's function)."""
  text = open(os.path.join(EXAMPLES, "echo.py")).read()
  text = text.replace('type: ClassVar[str] = "echo"', f'type: ClassVar[str] = "{name}"')
  if retrofit:
    text = text.replace('no_decay=("alpha",),', 'no_decay=("alpha",), retrofit=lambda r: r,')
  assert f'"{name}"' in text and (not retrofit or "retrofit=" in text)
  os.makedirs(folder, exist_ok=True)
  path = os.path.join(folder, f"{stem}.py")
  with open(path, "w") as f:
    f.write(text)
  return path


def test_a_file_imported_by_its_own_name_is_the_type_a_checkpoint_loads(tmp_path, monkeypatch):
  """`import mytype` (as a user would), then `checkpoint.load` of an export recording
  mytype.py: the file is the module already imported, not registered again; imported the
  other way round the newer module's entry replaces the older; another file registering
  the same name is refused, naming both files."""
  mine = user_type_file(tmp_path / "mine")
  late = user_type_file(tmp_path / "late", stem="latetype", name="late_echo")
  monkeypatch.syspath_prepend(str(tmp_path / "mine"))
  monkeypatch.syspath_prepend(str(tmp_path / "late"))
  monkeypatch.setattr(registry, "USER_MODULES", [])
  try:
    mytype = importlib.import_module("mytype")
    cfg = tiny_cfg(recurrence=mytype.EchoConfig())
    params = init_params(cfg, jax.random.PRNGKey(0))
    registry.USER_MODULES.append(mine)      # as a run given --user_module=mytype.py
    checkpoint.export(cfg, params, str(tmp_path / "export"))
    loaded_cfg, loaded = checkpoint.load(str(tmp_path / "export"))
    assert loaded_cfg == cfg and type(loaded_cfg.recurrence) is mytype.EchoConfig
    assert registry.import_user_module(mine) is mytype
    assert "t2mlr_user_mytype" not in sys.modules
    jax.tree.map(np.testing.assert_array_equal, loaded, params)
    with pytest.raises(ValueError, match=r"recurrence type 'my_echo' is already registered "
                                         r"\(by mytype, .*mine/mytype.py\); choose another "
                                         r"name for the one of t2mlr_user_mytype, .*other/"):
      registry.import_user_module(user_type_file(tmp_path / "other"))
    first = registry.import_user_module(late)
    again = importlib.import_module("latetype")
    assert again is not first and registry.RECURRENCES.get("late_echo").source == "latetype"
  finally:
    for name in ("my_echo", "late_echo"):
      registry.RECURRENCES.unregister(name)
    for name in ("mytype", "latetype", "t2mlr_user_latetype"):
      sys.modules.pop(name, None)
