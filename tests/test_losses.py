"""The chunked cross-entropy: the same value and gradient as the full one, chunk by chunk."""

import jax
import numpy as np
import pytest

from t2mlr_jax import LRTConfig, ModelConfig, T2MLRConfig, init_params
from t2mlr_jax.losses import IGNORE
from t2mlr_jax.model.api import loss


def _setup(recurrence=None, tied=False):
  cfg = ModelConfig(vocab_size=96, d_model=32, n_layers=3, n_heads=2, d_ff=64, max_seq_len=32,
                    tie_embeddings=tied, recurrence=recurrence,
                    schedule_options=dict(d_forward=4, d_backward=2))
  params = init_params(cfg, jax.random.PRNGKey(0))
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, 96, (2, 13)).astype(np.int32)
  targets = rng.integers(0, 96, (2, 13)).astype(np.int32)
  targets[:, :4] = IGNORE                       # prompt-like unsupervised positions
  return cfg, params, tokens, targets


@pytest.mark.parametrize("recurrence, mode, tied", [
    (None, "parallel", True),
    pytest.param(T2MLRConfig(l_start=1, l_end=1), "jacobi", False,
                 marks=pytest.mark.slow),
])
def test_chunked_loss_equals_the_full_loss_in_value_and_gradient(recurrence, mode, tied):
  cfg, params, tokens, targets = _setup(recurrence, tied)
  full = jax.value_and_grad(lambda p: loss(p, cfg, tokens, mode=mode, targets=targets))
  v_ref, g_ref = full(params)
  for chunk in (5, 64):                  # T = 13 = 5·2 + 3: a padded last chunk; one chunk
    f = jax.value_and_grad(lambda p: loss(p, cfg, tokens, mode=mode, targets=targets,
                                          loss_chunk=chunk))
    v, g = f(params)
    assert float(v) == pytest.approx(float(v_ref), abs=1e-6)
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g_ref)):
      np.testing.assert_allclose(a, b, atol=1e-6)
  _, aux = loss(params, cfg, tokens, mode=mode, targets=targets, loss_chunk=5,
                return_aux=True)
  assert int(aux["supervised_tokens"]) == 2 * 9


def test_chunked_loss_refuses_modes_that_compute_their_own_logits():
  cfg = ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=2, d_ff=64, max_seq_len=16,
                    recurrence=LRTConfig(gate_channels=8))
  params = init_params(cfg, jax.random.PRNGKey(0))
  tokens = np.zeros((1, 8), np.int32)
  with pytest.raises(ValueError, match="loss_chunk=4 needs"):
    loss(params, cfg, tokens, mode="interleaved", loss_chunk=4)
  with pytest.raises(ValueError, match="loss_chunk=0 is invalid"):
    loss(params, cfg, tokens, mode="parallel", loss_chunk=0)


def test_train_loss_chunk_is_validated_with_the_field_named():
  import os
  import sys

  from t2mlr_jax.train.config import validate
  sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "configs"))
  import s5_retrieval
  import s5_retrieval_lrt
  c = s5_retrieval.get_config("tiny")
  c.train.loss_chunk = 16
  validate(c)                                     # jacobi: chunked loss available
  c.train.loss_chunk = 0
  with pytest.raises(ValueError, match="train.loss_chunk=0 is invalid"):
    validate(c)
  c = s5_retrieval_lrt.get_config("tiny")
  c.train.loss_chunk = 16
  with pytest.raises(ValueError, match="train.loss_chunk=16 is invalid: allowed None for "
                                       "train.mode='interleaved'"):
    validate(c)


def test_chunked_loss_in_bfloat16_matches_the_full_loss():
  """A bf16-compute model (fp32 master weights): both losses compute fp32 logits from the
  same bf16 hidden states, so the value agrees to fp32 rounding; the gradients flow back
  through bf16 activations, recomputed per chunk, and agree to bf16's resolution (2^-7
  of each leaf's largest entry; observed 0.5%)."""
  cfg, _, tokens, targets = _setup()
  cfg = cfg.replace(dtype="bfloat16")
  params = init_params(cfg, jax.random.PRNGKey(0))
  v_ref, g_ref = jax.value_and_grad(
      lambda p: loss(p, cfg, tokens, mode="parallel", targets=targets))(params)
  v, g = jax.value_and_grad(
      lambda p: loss(p, cfg, tokens, mode="parallel", targets=targets, loss_chunk=5))(params)
  assert v.dtype == v_ref.dtype == np.float32
  assert float(v) == pytest.approx(float(v_ref), rel=1e-5)
  for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g_ref)):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    scale = max(float(np.abs(b).max()), 1e-12)
    assert float(np.abs(a - b).max()) <= 2 ** -7 * scale, (a.dtype, np.abs(a - b).max(), scale)
