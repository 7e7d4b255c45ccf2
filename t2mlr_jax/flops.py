"""The cost model (SPEC §8): FLOPs of forward passes, train steps and decoding.

Counts multiply-adds as 2 FLOPs, matmuls only (norms, softmax and elementwise
work are a few percent at these sizes). Attention over a full sequence counts
the T×T score and value matmuls XLA actually computes (the causal mask does not
skip work). Used by the benchmarks and by the training loop's MFU metric.
"""

from __future__ import annotations

from typing import Optional

import jax

from t2mlr_jax.config import ModelConfig
from t2mlr_jax.model import recurrence
from t2mlr_jax.topologies import GENERATIONS

# Dense peak FLOP/s per device, for MFU (bf16 unless noted): GPUs here, TPUs from the
# topology table (per core on v2 / v3, whose devices are cores; per chip otherwise).
PEAK_FLOPS = {
    "H200": 989e12, "H100": 989e12, "A100": 312e12, "L4": 121e12,
    **{g.device_kind: g.peak_bf16_flops for g in GENERATIONS.values()},
}


def layer_matmul_flops(cfg: ModelConfig, tokens: int) -> float:
  """Projections + MLP of one layer for `tokens` tokens (no attention scores)."""
  D, F, K = cfg.d_model, cfg.d_ff, cfg.head_dim
  q, kv = cfg.n_heads * K, cfg.n_kv_heads * K
  mlp = 3 if cfg.mlp_type == "swiglu" else 2
  per_token = 2 * (D * q + 2 * D * kv + q * D) + 2 * mlp * D * F
  return float(per_token * tokens)


def attention_flops(cfg: ModelConfig, queries: int, keys: int) -> float:
  """QK^T and PV for `queries` queries over `keys` keys (one sequence, one layer)."""
  return float(2 * 2 * cfg.n_heads * cfg.head_dim * queries * keys)


def layer_flops(cfg: ModelConfig, batch: int, seq_len: int) -> float:
  """One layer over a batch of full sequences."""
  return batch * (layer_matmul_flops(cfg, seq_len) + attention_flops(cfg, seq_len, seq_len))


def head_flops(cfg: ModelConfig, tokens: int) -> float:
  return float(2 * cfg.d_model * cfg.vocab_size * tokens)


def mixer_flops(cfg: ModelConfig, tokens: int, layers: Optional[int] = None) -> float:
  """The recurrence's own matmuls over `layers` layers from the span's first on (default
  all; its config's `mixer_flops`): T2MLR's fusion, 5H² multiply-adds once; LRT, in every
  layer, W_k and W_v and the triple gate."""
  return 0.0 if cfg.recurrence is None else cfg.recurrence.mixer_flops(cfg, tokens, layers)


def _sweep0_mixer(cfg: ModelConfig, tokens: int, span_layers: int) -> float:
  """Jacobi's sweep 0 runs the span without the recurrence when the type has the
  `plain_state` hook (T2MLR), else from zero state, mixer included (LRT)."""
  if recurrence.of(cfg).plain_state is not None:
    return 0.0
  return mixer_flops(cfg, tokens, span_layers)


def _segment_layers(cfg: ModelConfig) -> dict:
  sizes = {name: hi - lo for name, lo, hi in cfg.segments}
  return {k: sizes.get(k, 0) for k in ("lower", "middle", "upper", "all")}


def forward_flops(cfg: ModelConfig, batch: int, seq_len: int, mode: str = "parallel",
                  d_forward: Optional[int] = None, sweeps: Optional[int] = None) -> float:
  """FLOPs of one forward pass in `mode`.

  jacobi: lower once, sweep 0 + (sweeps - 1) span sweeps with the mixer, then
  the final span + upper pass (SPEC §8); `sweeps` defaults to d_forward.
  interleaved / chunked: pass 0 over every layer, then the S passes whose queries cover
  each position once (attending over all T keys) from the span's first layer on.
  multi_refine: pass 0, then K passes from the span on (`sweeps` overrides K).
  exact: every layer once plus the mixer (the token-by-token middle block does the
  same matmuls; its attention is over the causal prefix, counted as full here).
  """
  tokens = batch * seq_len
  per_layer = layer_flops(cfg, batch, seq_len)
  out = head_flops(cfg, tokens)
  if cfg.recurrence is None:
    return out + cfg.n_layers * per_layer
  if mode == "parallel":      # LRT's zero-memory pass still runs its feedback matmuls
    mixer = mixer_flops(cfg, tokens) if cfg.recurrence.parallel_runs_mixer else 0.0
    return out + cfg.n_layers * per_layer + mixer
  n = _segment_layers(cfg)
  full = out + cfg.n_layers * per_layer + mixer_flops(cfg, tokens)
  if mode == "exact":
    return full
  # a pass from the span on (the layers below never see the recurrence: they run once)
  above = n["middle"] + n["upper"]
  refined = out + above * per_layer + mixer_flops(cfg, tokens, above)
  if mode in ("interleaved", "chunked"):   # pass 0 + passes covering each position once
    return full + refined
  if mode == "multi_refine":
    return full + (sweeps if sweeps is not None else cfg.recurrence.refine_passes) * refined
  if mode != "jacobi":
    raise ValueError(f"mode={mode!r} is invalid: allowed 'parallel', 'exact', 'jacobi', "
                     "'interleaved', 'chunked', 'multi_refine'")
  d_f = d_forward or cfg.recurrence.d_forward
  s = d_f if sweeps is None else sweeps
  middle = n["middle"] * per_layer
  span_mixer = mixer_flops(cfg, tokens, n["middle"])
  return (out + n["lower"] * per_layer + middle                        # lower + sweep 0
          + _sweep0_mixer(cfg, tokens, n["middle"])
          + (s - 1) * (middle + span_mixer)                            # span sweeps
          + middle + n["upper"] * per_layer + mixer_flops(cfg, tokens, above))  # final pass


def train_step_flops(cfg: ModelConfig, batch: int, seq_len: int, mode: str = "parallel",
                     d_forward: Optional[int] = None, d_backward: Optional[int] = None,
                     sweeps: Optional[int] = None) -> float:
  """Forward + backward (2× the forward FLOPs of what carries gradient; every LRT
  schedule keeps the gradient of every pass)."""
  fwd = forward_flops(cfg, batch, seq_len, mode, d_forward, sweeps)
  if cfg.recurrence is None or mode != "jacobi":
    return 3 * fwd
  tokens = batch * seq_len
  per_layer = layer_flops(cfg, batch, seq_len)
  n = _segment_layers(cfg)
  d_f = d_forward or cfg.recurrence.d_forward
  d_b = d_backward or cfg.recurrence.d_backward
  grad_sweeps = min(d_b, d_f - 1)
  above = n["middle"] + n["upper"]
  middle = n["middle"] * per_layer + mixer_flops(cfg, tokens, n["middle"])
  sweep0 = n["middle"] * per_layer + _sweep0_mixer(cfg, tokens, n["middle"])
  with_grad = (head_flops(cfg, tokens) + n["lower"] * per_layer      # lower: once
               + above * per_layer + mixer_flops(cfg, tokens, above)  # final pass
               + grad_sweeps * middle
               + (sweep0 if d_b == d_f else 0.0))                     # sweep 0 if it has grad
  return fwd + 2 * with_grad


def train_flops_spent(cfg: ModelConfig, batch: int, seq_len: int, mode: str,
                      train_log: list) -> float:
  """The training FLOPs a run spent, from its train log: each window's steps
  (`loss_window`) at the step cost of its mean Jacobi sweeps (the forward is linear in
  the sweeps, so the mean is exact); other schedules cost the same at every step."""
  total = 0.0
  for record in train_log:
    steps = record.get("loss_window")
    if steps is None:
      raise ValueError("train_log: a record without 'loss_window' (written by an older "
                       "train loop?) cannot say how many steps it covers")
    sweeps = record.get("jacobi_sweeps") if mode == "jacobi" else None
    total += steps * train_step_flops(cfg, batch, seq_len, mode, sweeps=sweeps)
  return total


def exact_bptt_bytes(cfg: ModelConfig, batch: int, seq_len: int) -> float:
  """Bytes backpropagation through the exact mode keeps for its token-by-token loop: every
  step's key/value caches of the recurrent block (and their cotangents), quadratic in
  the sequence length. Matches XLA's compiled temporary memory to ~5% once this term
  dominates (T·B >= 512 at d_model 64); the rest of the step is not counted."""
  n_block = _segment_layers(cfg)["middle"] if cfg.recurrence is not None else 0
  itemsize = 2 if cfg.dtype in ("bfloat16", "float16") else 4
  return float(2 * 2 * seq_len * seq_len * batch * cfg.n_kv_heads * cfg.head_dim * n_block
               * itemsize)


def decode_flops_per_token(cfg: ModelConfig, context: int) -> float:
  """One decode step with `context` cached keys."""
  return (cfg.n_layers * (layer_matmul_flops(cfg, 1) + attention_flops(cfg, 1, context))
          + head_flops(cfg, 1) + mixer_flops(cfg, 1))


def peak_flops(device=None) -> Optional[float]:
  """Dense peak FLOP/s of a JAX device (None when unknown, e.g. CPUs)."""
  device = device or jax.devices()[0]
  kind = getattr(device, "device_kind", "")
  if kind in PEAK_FLOPS:            # exact first: "TPU v5" (v5p) is a prefix of "TPU v5 lite"
    return PEAK_FLOPS[kind]
  for name, value in PEAK_FLOPS.items():
    if name.lower() in kind.lower():
      return value
  return None


def mfu(flops: float, seconds: float, num_devices: int = 1, device=None) -> Optional[float]:
  peak = peak_flops(device)
  if peak is None or seconds <= 0:
    return None
  return flops / seconds / (peak * num_devices)
