"""The FLOP model against XLA's own count on unrolled builds (XLA counts a loop body once)."""

import jax
import numpy as np
import pytest

from t2mlr_jax import ModelConfig, T2MLRConfig, flops, forward, init_params
from t2mlr_jax.losses import cross_entropy, next_token_labels

B, T = 2, 64


@pytest.fixture(scope="module")
def cfg():
  return ModelConfig(vocab_size=256, d_model=128, n_layers=3, n_heads=4, d_ff=512,
                     max_seq_len=128, scan_layers=False,
                     recurrence=T2MLRConfig(l_start=1, l_end=1))


def _xla_flops(fn, *args):
  analysis = jax.jit(fn).lower(*args).compile().cost_analysis()
  analysis = analysis[0] if isinstance(analysis, (list, tuple)) else analysis
  return float(analysis["flops"])


def test_forward_flops_match_xla(cfg):
  params = init_params(cfg, jax.random.PRNGKey(0))
  tokens = np.zeros((B, T), np.int32)
  base = cfg.replace(recurrence=None)
  xla = _xla_flops(lambda p, t: forward(p, base, t, mode="parallel"), params, tokens)
  assert abs(flops.forward_flops(base, B, T) / xla - 1) < 0.10, (flops.forward_flops(base, B, T), xla)
  # Jacobi with D_f = D_b = 2: one unrolled gradient sweep (scan of length 1)
  model = flops.forward_flops(cfg, B, T, "jacobi", d_forward=2)
  xla_j = _xla_flops(lambda p, t: forward(p, cfg, t, mode="jacobi", d_forward=2, d_backward=2),
                     params, tokens)
  assert abs(model / xla_j - 1) < 0.10, (model, xla_j)


def test_train_step_flops_match_xla(cfg):
  base = cfg.replace(recurrence=None)
  params = init_params(base, jax.random.PRNGKey(0))
  tokens = np.zeros((B, T), np.int32)
  grad = jax.grad(lambda p, t: cross_entropy(forward(p, base, t, mode="parallel"),
                                             next_token_labels(t))[0])
  xla = _xla_flops(grad, params, tokens)
  model = flops.train_step_flops(base, B, T)
  assert abs(model / xla - 1) < 0.10, (model, xla)


def test_decode_and_mfu():
  cfg = ModelConfig.preset("smollm2-135m", recurrence=T2MLRConfig(l_start=13, l_end=18))
  per_token = flops.decode_flops_per_token(cfg, context=256)
  assert 2 * 134e6 < per_token < 2 * 150e6          # ~2 FLOPs per parameter + attention
  mixer_share = flops.mixer_flops(cfg, 1) / per_token
  assert 0.008 < mixer_share < 0.015                 # SPEC §8: ~1-2% of a 135M model
  assert flops.mfu(1e12, 1.0) is None or flops.mfu(1e12, 1.0) > 0


def test_lrt_interleaved_flops_match_xla():
  """LRT (nanochat's relu² MLP): the interleaved forward is two full passes' worth."""
  from t2mlr_jax import LRTConfig
  cfg = ModelConfig(vocab_size=256, d_model=128, n_layers=2, n_heads=2, d_ff=512,
                    max_seq_len=128, scan_layers=False, mlp_type="relu2",
                    recurrence=LRTConfig(passes=2))
  params = init_params(cfg, jax.random.PRNGKey(0))
  tokens = np.zeros((B, T), np.int32)
  for mode, opts in (("parallel", {}), ("interleaved", {"passes": 2})):
    xla = _xla_flops(lambda p, t: forward(p, cfg, t, mode=mode, **opts), params, tokens)
    model = flops.forward_flops(cfg, B, T, mode)
    assert abs(model / xla - 1) < 0.10, (mode, model, xla)
