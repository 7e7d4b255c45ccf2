"""Every training schedule for every recurrence type (`model/schedules/`): the invariants
that make each a parallel approximation of the same sequential recurrence. The pairs each
type had before the schedules were shared (T2MLR x jacobi, LRT x interleaved / chunked /
multi_refine) are covered in test_modes, test_jacobi, test_recurrence_lrt and
test_lrt_schedules; here the new ones by default, the rest in the slow step."""

import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2mlr_jax import LRTConfig, ModelConfig, forward, init_params, loss

from _util import REPO_ROOT, active_params, max_abs, random_tokens, tiny_cfg

T = 6
# each schedule at the setting where it is the exact recurrence
EXACT_SETTINGS = {"jacobi": dict(d_forward=T), "interleaved": dict(passes=T),
                  "chunked": dict(passes=T), "multi_refine": dict(refine_passes=T - 1)}


def _t2mlr():
  cfg = tiny_cfg(l_start=1, l_end=2, n_layers=4)
  return cfg, active_params(cfg, seed=5)


def _lrt(**kw):
  cfg = ModelConfig(vocab_size=37, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, d_ff=64,
                    max_seq_len=16, rope_theta=10000.0,
                    recurrence=LRTConfig(gate_channels=8, **kw))
  p = init_params(cfg, jax.random.PRNGKey(3))
  mem = dict(p["layers"]["memory"])
  mem["gate"] = 0.5 * jax.random.normal(jax.random.PRNGKey(4), mem["gate"].shape)
  mem["gamma"] = 0.3 + 0.2 * jax.random.uniform(jax.random.PRNGKey(5), mem["gamma"].shape)
  return cfg, {**p, "layers": {**p["layers"], "memory": mem}}


MODELS = {"t2mlr": _t2mlr, "lrt": _lrt}
NEW_PAIRS = [("t2mlr", "interleaved"), ("t2mlr", "multi_refine"), ("lrt", "jacobi")]
# the old pairs, and T2MLR x chunked (interleaved's code over other position sets)
SLOW_PAIRS = [("t2mlr", "chunked"), ("t2mlr", "jacobi"), ("lrt", "interleaved"),
              ("lrt", "chunked"), ("lrt", "multi_refine")]


@pytest.mark.parametrize("kind,mode", NEW_PAIRS + [pytest.param(*p, marks=pytest.mark.slow)
                                                   for p in SLOW_PAIRS])
def test_each_schedule_at_its_exact_setting_is_the_exact_recurrence(kind, mode):
  cfg, params = MODELS[kind]()
  tokens = random_tokens(cfg, 2, T, seed=1)
  cf = np.full((2, T), 2, np.int32)
  cf[1, :2] = 1                                  # a non-recurrent prefix in one row
  exact = forward(params, cfg, tokens, mode="exact", control_flow=cf)
  out, aux = forward(params, cfg, tokens, mode=mode, control_flow=cf, return_aux=True,
                     **EXACT_SETTINGS[mode])
  assert max_abs(out, exact) <= 1e-5
  assert max_abs(exact, forward(params, cfg, tokens, mode="parallel")) > 1e-3  # it matters
  if kind == "t2mlr":
    assert {"gate_rec", "gate_cur"} <= set(aux)
  elif mode != "jacobi":
    assert aux["gate_means"].shape == (cfg.n_layers, 3)


@pytest.mark.slow       # 15 s each: .ci/run's slow step
@pytest.mark.parametrize("kind", ["lrt", "t2mlr"])
def test_jacobi_with_every_sweep_differentiated_is_exact_bptt(kind):
  cfg, params = MODELS[kind]()
  tokens = random_tokens(cfg, 1, 4, seed=2)
  g_exact = jax.grad(lambda p: loss(p, cfg, tokens, mode="exact"))(params)
  g_jac = jax.grad(lambda p: loss(p, cfg, tokens, mode="jacobi", d_forward=4,
                                  d_backward=4))(params)
  worst = max(max_abs(a, b) for a, b in zip(jax.tree.leaves(g_exact), jax.tree.leaves(g_jac)))
  scale = max(float(jnp.max(jnp.abs(a))) for a in jax.tree.leaves(g_exact))
  assert worst <= 1e-5 * max(1.0, scale)


@pytest.mark.parametrize("mode", ["jacobi", "interleaved", "multi_refine",
                                  pytest.param("chunked", marks=pytest.mark.slow)])
def test_a_fresh_t2mlr_and_an_identity_lrt_are_their_base_transformer(mode):
  """γ = 0 T2MLR and identity-init LRT at each schedule's default options."""
  t2 = tiny_cfg(l_start=1, l_end=2, n_layers=4)
  lrt = ModelConfig(vocab_size=37, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2,
                    d_ff=64, max_seq_len=16, rope_theta=10000.0,
                    recurrence=LRTConfig(gate_channels=8, init="identity"))
  for cfg in (t2, lrt):
    params = init_params(cfg, jax.random.PRNGKey(0))
    base_cfg = cfg.replace(recurrence=None)
    base_params = {k: v for k, v in params.items() if k != "recurrence"}
    if "memory" in params["layers"]:
      base_params["layers"] = {k: v for k, v in params["layers"].items() if k != "memory"}
    tokens = random_tokens(cfg, 2, T, seed=3)
    base = forward(base_params, base_cfg, tokens, mode="parallel")
    assert max_abs(forward(params, cfg, tokens, mode=mode), base) <= 1e-5, cfg.recurrence.type


def test_lrt_under_jacobi_resets_where_packed_segments_start():
  cfg, params = _lrt()
  a, b = random_tokens(cfg, 1, 4, seed=1), random_tokens(cfg, 1, 3, seed=2)
  packed = np.concatenate([a, b], axis=1)
  seg = np.array([[0] * 4 + [1] * 3], np.int32)
  together = forward(params, cfg, packed, mode="jacobi", segment_ids=seg, d_forward=7)
  assert max_abs(together[:, :4], forward(params, cfg, a, mode="exact")) <= 1e-5
  assert max_abs(together[:, 4:], forward(params, cfg, b, mode="exact")) <= 1e-5


def test_t2mlr_refuses_the_kv_refresh_it_has_no_keys_for():
  cfg, params = _t2mlr()
  tokens = random_tokens(cfg, 1, T)
  with pytest.raises(ValueError, match="kv_refresh=True is invalid for a t2mlr model"):
    forward(params, cfg, tokens, mode="interleaved", kv_refresh=True)


@pytest.mark.parametrize("kind,mode", [("t2mlr", "interleaved"),
                                       pytest.param("lrt", "jacobi", marks=pytest.mark.slow)])
def test_a_loss_of_the_new_pairs_trains(kind, mode):
  """A few SGD steps on one batch lower the loss (the gradient flows through the
  schedule's recurrence parameters)."""
  cfg, params = MODELS[kind]()
  tokens = random_tokens(cfg, 4, T, seed=7)
  f = jax.jit(jax.value_and_grad(lambda p: loss(p, cfg, tokens, mode=mode)))
  first, g = f(params)
  rec = g["recurrence"] if kind == "t2mlr" else g["layers"]["memory"]
  assert max(float(jnp.max(jnp.abs(x))) for x in jax.tree.leaves(rec)) > 0
  for _ in range(5):
    value, g = f(params)
    params = jax.tree.map(lambda p, d: p - 0.05 * d, params, g)
  assert float(f(params)[0]) < float(first)


ROOT = REPO_ROOT


def _cli(tmp_path, config, *overrides):
  wd = str(tmp_path / "run")
  cmd = [sys.executable, "-m", "t2mlr_jax.main", f"--config={ROOT}/configs/{config}:tiny",
         f"--workdir={wd}", "--progress=false", "--config.train.num_steps=6",
         "--config.train.eval_every=6", "--config.train.checkpoint_every=6",
         "--config.train.log_every=3", *overrides]
  out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  ev = subprocess.run([sys.executable, "-m", "t2mlr_jax.evaluate", f"--workdir={wd}",
                       "--mode=" + overrides[0].split("=")[1]], cwd=ROOT,
                      capture_output=True, text=True, timeout=600)
  assert ev.returncode == 0, ev.stderr[-3000:]
  return wd, out.stdout + out.stderr, json.loads(ev.stdout)


@pytest.mark.slow       # three CLI runs; in-process training of the new pairs runs by default
@pytest.mark.parametrize("config,mode,extra", [
    ("s5_retrieval.py", "interleaved", ["--config.model.schedule_options.passes=3"]),
    ("s5_retrieval_lrt.py", "jacobi", ["--config.model.schedule_options.d_forward=5",
                                       "--config.model.schedule_options.d_backward=2"]),
    ("s5_retrieval.py", "multi_refine", ["--config.model.schedule_options.refine_passes=2"])])
def test_another_types_schedule_trains_and_evaluates_from_the_cli(tmp_path, config, mode, extra):
  from t2mlr_jax.train.metrics import read_metrics
  wd, log, ev = _cli(tmp_path, config, f"--config.train.mode={mode}", *extra)
  assert f"compiling the {mode} train step" in log
  records = read_metrics(wd)
  assert records and all(np.isfinite(r["loss"]) for r in records)
  if mode == "jacobi":
    assert records[-1]["jacobi_sweeps"] == 5
  else:
    assert len(records[-1]["per_pass_losses"]) == (4 if mode == "interleaved" else 3)
  assert ev["mode"] == mode and np.isfinite(ev["loss"])
