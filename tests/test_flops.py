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
  model = flops.forward_flops(cfg, B, T, "jacobi", schedule_options={"d_forward": 2})
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
  assert 0.008 < mixer_share < 0.015                 # ~1-2% of a 135M model (cost model)
  assert flops.mfu(1e12, 1.0) is None or flops.mfu(1e12, 1.0) > 0


def test_lrt_interleaved_flops_match_xla():
  """LRT (nanochat's relu² MLP): the interleaved forward is two full passes' worth."""
  from t2mlr_jax import LRTConfig
  cfg = ModelConfig(vocab_size=256, d_model=128, n_layers=2, n_heads=2, d_ff=512,
                    max_seq_len=128, scan_layers=False, mlp_type="relu2",
                    recurrence=LRTConfig(), schedule_options=dict(passes=2))
  params = init_params(cfg, jax.random.PRNGKey(0))
  tokens = np.zeros((B, T), np.int32)
  for mode, opts in (("parallel", {}), ("interleaved", {"passes": 2})):
    xla = _xla_flops(lambda p, t: forward(p, cfg, t, mode=mode, **opts), params, tokens)
    model = flops.forward_flops(cfg, B, T, mode)
    assert abs(model / xla - 1) < 0.10, (mode, model, xla)


def test_exact_bptt_memory_estimate_matches_the_compiled_step():
  """exact_bptt_bytes against XLA's temporary memory of the exact mode's gradient, where
  the quadratic term dominates, and the training config's warning quoting it."""
  import jax.numpy as jnp

  from t2mlr_jax import loss
  from t2mlr_jax.flops import exact_bptt_bytes
  cfg = ModelConfig(vocab_size=64, d_model=64, n_layers=3, n_heads=4, n_kv_heads=2, d_ff=64,
                    max_seq_len=256, recurrence=T2MLRConfig(l_start=1, l_end=1))
  params = init_params(cfg, jax.random.PRNGKey(0))
  tokens = jnp.zeros((2, 256), jnp.int32)
  step = jax.jit(jax.grad(lambda p: loss(p, cfg, tokens, mode="exact")))
  temp = step.lower(params).compile().memory_analysis().temp_size_in_bytes
  estimate = exact_bptt_bytes(cfg, 2, 256)
  assert estimate == 2 * 2 * 256 * 256 * 2 * 2 * 16 * 1 * 4
  assert 0.8 < temp / estimate < 1.25, (temp, estimate)


def test_exact_training_on_long_sequences_warns_with_the_estimate(caplog):
  import logging

  from t2mlr_jax.train.config import base_config, validate
  c = base_config()
  c.train.mode, c.train.seq_len, c.train.batch_size = "exact", 2048, 16
  with caplog.at_level(logging.WARNING):
    validate(c)
  # 4 layers, l 1..-2: 2 block layers; 4 heads of 16 (kv = heads): 2·2·2048²·16·4·16·2·4 B
  assert "train.mode='exact'" in caplog.text and "128.0 GiB" in caplog.text
  caplog.clear()
  c.train.seq_len = 256
  with caplog.at_level(logging.WARNING):
    validate(c)
  assert "train.mode='exact'" not in caplog.text


def test_the_new_schedule_pairs_flops_match_xla(cfg):
  """T2MLR under the refinement schedules (the layer below its span runs once) and LRT
  under Jacobi (sweep 0 runs its feedback matmuls: it has no plain_state hook)."""
  from t2mlr_jax import LRTConfig
  params = init_params(cfg, jax.random.PRNGKey(0))
  tokens = np.zeros((B, T), np.int32)
  lrt = ModelConfig(vocab_size=256, d_model=128, n_layers=2, n_heads=2, d_ff=512,
                    max_seq_len=128, scan_layers=False, recurrence=LRTConfig())
  lrt_params = init_params(lrt, jax.random.PRNGKey(0))
  cases = [(cfg, params, "interleaved", dict(passes=2), {}),
           (cfg, params, "multi_refine", dict(refine_passes=1), dict(sweeps=1)),
           (lrt, lrt_params, "jacobi", dict(d_forward=2, d_backward=2),
            dict(schedule_options={"d_forward": 2}))]
  from t2mlr_jax import loss
  for c, p, mode, opts, model_opts in cases:
    # the loss reads every pass's logits (a bare forward lets XLA drop pass 0's head)
    xla = _xla_flops(lambda p, t: loss(p, c, t, mode=mode, **opts), p, tokens)
    model = flops.forward_flops(c, B, T, mode, **model_opts)
    assert abs(model / xla - 1) < 0.10, (c.recurrence.type, mode, model, xla)


def test_schedule_options_are_a_mapping_each_schedule_reads_its_own(cfg):
  """The options a count is taken at: a mapping over the config's, each schedule reading
  those it declares (keywords as before it took one give the same count); an option no
  schedule declares, or options that are no mapping, are refused."""
  at = dict(d_forward=4, d_backward=2)
  four = flops.train_step_flops(cfg, B, T, "jacobi", schedule_options=at)
  assert four == flops.train_step_flops(cfg, B, T, "jacobi", **at)
  assert four == flops.train_step_flops(cfg.replace(schedule_options=at), B, T, "jacobi")
  assert four < flops.train_step_flops(cfg, B, T, "jacobi")          # the default D_f 16
  assert flops.forward_flops(cfg, B, T, "interleaved", schedule_options=at) == \
      flops.forward_flops(cfg, B, T, "interleaved")                  # not its options
  assert flops.forward_flops(cfg, B, T, "multi_refine", schedule_options={
      "refine_passes": 1}) == flops.forward_flops(cfg, B, T, "multi_refine", sweeps=1)
  with pytest.raises(ValueError, match=r"schedule_options.d_forwards=4 is invalid"):
    flops.forward_flops(cfg, B, T, "jacobi", schedule_options={"d_forwards": 4})
  with pytest.raises(ValueError, match=r"schedule_options=4 is invalid: allowed a mapping"):
    flops.forward_flops(cfg, B, T, "jacobi", 4)
