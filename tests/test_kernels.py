"""Attention kernels (model/kernels.py): splash equals xla on CPU in Pallas interpret mode,
values and gradients, with packed segments and padding; the kernel choice is validated."""

import jax
import numpy as np
import pytest

from t2mlr_jax import init_params
from t2mlr_jax.config import ModelConfig, T2MLRConfig
from t2mlr_jax.model import kernels
from t2mlr_jax.model.api import loss
from t2mlr_jax.model.modes import forward

T = 128


def _batch():
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, 64, (2, T)).astype(np.int32)
  cf = np.full((2, T), 2, np.int32)
  cf[1, -20:] = 0                                 # right padding
  seg = np.zeros((2, T), np.int32)
  seg[0, 50:] = 1                                 # two packed documents in row 0
  targets = np.where(cf > 0, rng.integers(0, 64, (2, T)), -100).astype(np.int32)
  return tokens, cf, seg, targets


@pytest.mark.parametrize("mode", ["parallel", pytest.param("jacobi", marks=pytest.mark.slow)])
def test_splash_equals_xla_in_values_and_gradients(mode):
  base = dict(vocab_size=64, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, d_ff=64,
              max_seq_len=T, recurrence=T2MLRConfig(l_start=1, l_end=1, d_forward=2,
                                                    d_backward=1))
  xla, splash = ModelConfig(**base), ModelConfig(**base, attention="splash")
  params = init_params(xla, jax.random.PRNGKey(0))
  tokens, cf, seg, targets = _batch()
  side = dict(control_flow=cf, segment_ids=seg)
  a = forward(params, xla, tokens, mode=mode, **side)
  b = forward(params, splash, tokens, mode=mode, **side)
  valid = cf > 0
  np.testing.assert_allclose(np.asarray(b)[valid], np.asarray(a)[valid], atol=2e-5)
  grad = lambda cfg: jax.grad(lambda p: loss(p, cfg, tokens, mode=mode, targets=targets,
                                             **side))(params)
  for x, y in zip(jax.tree.leaves(grad(splash)), jax.tree.leaves(grad(xla))):
    np.testing.assert_allclose(x, y, atol=2e-5)


def test_splash_falls_back_to_xla_below_its_block_and_auto_resolves_by_backend():
  cfg = ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=2, d_ff=64,
                    max_seq_len=64, attention="splash")
  params = init_params(cfg, jax.random.PRNGKey(0))
  tokens = np.arange(40, dtype=np.int32)[None] % 64      # T = 40: not a multiple of 128
  np.testing.assert_array_equal(forward(params, cfg, tokens, mode="parallel"),
                                forward(params, cfg.replace(attention="xla"), tokens,
                                        mode="parallel"))
  target = kernels.Target
  assert kernels.resolve("auto", "float32", target("cpu")) == "xla"
  assert kernels.resolve("auto", "bfloat16", target("gpu")) == "cudnn"
  assert kernels.resolve("auto", "float32", target("gpu")) == "xla"
  assert kernels.resolve("auto", "float32", target("tpu", "TPU v5 lite")) == "splash"
  assert kernels.resolve("auto", "float32", target("tpu", "TPU v3")) == "xla"


@pytest.mark.parametrize("recurrent", [False, True], ids=["mixed-window-scan", "t2mlr"])
def test_splash_covers_local_windows(recurrent):
  """nanochat's windowed layers run the kernel's band mask: a scan over layers of mixed
  windows switches between one kernel per window (plain model), a segment of one window
  passes it statically (T2MLR's one-layer segments); both equal xla."""
  base = dict(vocab_size=64, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, d_ff=64,
              max_seq_len=T, window_pattern="SL", window_short=32,
              recurrence=(T2MLRConfig(l_start=1, l_end=1, d_forward=2, d_backward=1)
                          if recurrent else None))
  xla, splash = ModelConfig(**base), ModelConfig(**base, attention="splash")
  assert xla.layer_windows == (32, 128, 128)
  params = init_params(xla, jax.random.PRNGKey(0))
  tokens, cf, seg, targets = _batch()
  side = dict(control_flow=cf, segment_ids=seg)
  mode = "jacobi" if recurrent else "parallel"
  a = forward(params, xla, tokens, mode=mode, **side)
  b = forward(params, splash, tokens, mode=mode, **side)
  valid = cf > 0
  np.testing.assert_allclose(np.asarray(b)[valid], np.asarray(a)[valid], atol=2e-5)
  if not recurrent:
    text = jax.jit(lambda p: forward(p, splash, tokens, mode=mode, **side)).lower(
        params).as_text()
    assert "case" in text or "conditional" in text      # the per-window switch
    grad = lambda cfg: jax.grad(lambda p: loss(p, cfg, tokens, mode=mode, targets=targets,
                                               **side))(params)
    for x, y in zip(jax.tree.leaves(grad(splash)), jax.tree.leaves(grad(xla))):
      np.testing.assert_allclose(x, y, atol=2e-5)


def test_attention_field_is_validated():
  with pytest.raises(ValueError, match=r"attention='flash' is invalid: allowed one of"):
    ModelConfig(attention="flash")
  with pytest.raises(ValueError, match="attention='cudnn' is invalid: .*cudnn needs a GPU"):
    kernels.check_available("cudnn", "float32")
  with pytest.raises(ValueError, match="attention='splash' is invalid: .*splash is a TPU "
                     "kernel"):
    kernels.resolve("splash", "bfloat16", kernels.Target("gpu", "NVIDIA H200"))


@pytest.mark.slow
def test_splash_under_the_train_steps_mesh_runs_per_shard_and_equals_xla():
  """On a 2x2x2 mesh the kernel runs inside shard_map (batch over data×fsdp, heads over
  tensor); the sharded train step's loss equals the xla one."""
  from t2mlr_jax import sharding
  from t2mlr_jax.train.config import base_config
  from t2mlr_jax.train.optimizer import make_optimizer
  from t2mlr_jax.train.step import create_state, make_train_step
  mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  tokens, cf, seg, targets = _batch()
  tokens, cf, seg, targets = (np.tile(a, (2, 1)) for a in (tokens, cf, seg, targets))
  batch = {"input_ids": tokens, "target_ids": targets, "control_flow": cf, "segment_ids": seg}
  batch = {k: jax.device_put(v, sharding.batch_sharding(mesh)) for k, v in batch.items()}
  tx, schedule = make_optimizer(base_config().optimizer, 10)
  losses = {}
  for impl in ("xla", "splash"):
    cfg = ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
                      d_ff=64, max_seq_len=T, attention=impl)
    state = create_state(cfg, tx, jax.random.PRNGKey(0), mesh)
    step = make_train_step(cfg, tx, schedule, "parallel", mesh)
    if impl == "splash":     # the kernel sits in a manual (per-shard) computation
      text = step.lower(state, batch).as_text()
      assert "sdy.manual_computation" in text and '{"data", "fsdp"}, {}, {"tensor"}' in text
    _, metrics = step(state, batch)
    losses[impl] = float(metrics["loss"])
  assert losses["splash"] == pytest.approx(losses["xla"], abs=1e-5)
