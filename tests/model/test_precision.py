"""Numerics on accelerators (docs/design.md#precision): the recurrence's matmuls run in
full fp32 whatever the backend's default matmul precision (TPU: bf16 passes, recent GPUs:
TF32), and the LM head's logits are accumulated and returned in fp32 by a bf16 model.

The suite's conftest forces `highest` precision globally, which would hide a missing
`precision=`: these tests lower the training loss and its gradient under
jax.default_matmul_precision("default") and read the StableHLO, finding each op by the
jax.named_scope it was built under."""

import re

import jax
import numpy as np
import pytest

from t2mlr_jax import LRTConfig, ModelConfig, T2MLRConfig, init_params
from t2mlr_jax.model.api import loss as model_loss

DOT = re.compile(r"stablehlo\.dot_general .*precision = \[(\w+), (\w+)\] : \((.*)\) -> "
                 r"(tensor<[^>]*>) loc\((#loc\d+)\)\s*$")


def _dots(text: str, scope: str) -> list[tuple]:
  """(precisions, operand types, result type) of every dot_general built under `scope`."""
  ids = set(re.findall(r'^(#loc\d+) = loc\("[^"]*\b%s\b[^"]*"' % scope, text, re.M))
  found = []
  for line in text.splitlines():
    m = DOT.search(line)
    if m and m.group(5) in ids:
      found.append(((m.group(1), m.group(2)), m.group(3), m.group(4)))
  return found


def _lowered_grad(cfg, mode):
  params = init_params(cfg, jax.random.PRNGKey(0))
  tokens = np.arange(16, dtype=np.int32).reshape(2, 8) % cfg.vocab_size
  f = jax.value_and_grad(lambda p: model_loss(p, cfg, tokens, mode=mode))
  with jax.default_matmul_precision("default"):
    return jax.jit(f).lower(params).as_text(debug_info=True)


def _base(**kw):
  return dict(vocab_size=64, d_model=32, n_layers=3, n_heads=2, d_ff=64, max_seq_len=32,
              dtype="bfloat16", **kw)


@pytest.mark.parametrize("mode", ["jacobi", "exact"])
def test_t2mlr_matmuls_are_fp32_highest_in_forward_and_backward(mode):
  cfg = ModelConfig(**_base(recurrence=T2MLRConfig(l_start=1, l_end=1),
                            schedule_options=dict(d_forward=3, d_backward=2)))
  text = _lowered_grad(cfg, mode)
  for scope in ("t2mlr_w_rec", "t2mlr_gates"):
    dots = _dots(text, scope)
    assert len(dots) >= 2, (scope, len(dots))        # forward and its gradient
    for precision, operands, _ in dots:
      assert precision == ("HIGHEST", "HIGHEST"), (scope, precision)
      assert "bf16" not in operands, (scope, operands)


def test_lrt_feedback_and_gate_matmuls_are_fp32_highest():
  cfg = ModelConfig(**_base(recurrence=LRTConfig(gate_channels=8), schedule_options=dict(passes=2)))
  text = _lowered_grad(cfg, "interleaved")
  for scope in ("lrt_gate", "lrt_feedback_w_k", "lrt_feedback_w_v"):
    dots = _dots(text, scope)
    assert len(dots) >= 2, (scope, len(dots))
    assert all(p == ("HIGHEST", "HIGHEST") and "bf16" not in ops for p, ops, _ in dots), scope


@pytest.mark.parametrize("tied", [True, False])
def test_bf16_model_logits_are_accumulated_in_fp32(tied):
  cfg = ModelConfig(**_base(tie_embeddings=tied))
  text = _lowered_grad(cfg, "parallel")
  dots = _dots(text, "lm_head")
  logits = [d for d in dots if d[2] == "tensor<2x8x64xf32>"]     # [B, T, V]
  assert len(logits) == 1, dots
  assert logits[0][1].count("bf16") == 2                 # bf16 operands, fp32 result
