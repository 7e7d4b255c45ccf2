"""The cost model (docs/performance.md#cost-model): FLOPs of forward passes, train steps
and decoding.

Counts multiply-adds as 2 FLOPs, matmuls only (norms, softmax and elementwise
work are a few percent at these sizes). Attention over a full sequence counts
the T×T score and value matmuls XLA actually computes (the causal mask does not
skip work). Used by the benchmarks and by the training loop's MFU metric.
"""

from __future__ import annotations

from typing import Mapping, NamedTuple, Optional

import jax

from t2mlr_jax.accel.topologies import CARDS, GENERATIONS
from t2mlr_jax.config import ModelConfig
from t2mlr_jax.registry import SCHEDULES, recurrence_of, schedule_option_defaults

# Dense peak FLOP/s per device, for MFU (bf16 unless noted): the listed GPU cards and TPU
# generations from the topology tables (per core on v2 / v3, whose devices are cores; per
# chip otherwise; the T4's fp16, it has no bf16 tensor cores), other variants of a card
# by name ("NVIDIA H100 PCIe" matches "H100").
PEAK_FLOPS = {
    **{c.device_kind: c.peak_flops for c in CARDS.values()},
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


class PassCosts(NamedTuple):
  """FLOPs of the pieces a forward pass of a recurrent model is made of, for one batch:
  what a schedule's `flops` declaration adds up (`registry.Schedule`)."""
  head: float            # the LM head over every position
  lower: float           # the layers below the span (they never see the recurrence)
  middle: float          # the span's layers, without the recurrence's own matmuls
  upper: float           # the layers above the span
  span_mixer: float      # the recurrence's matmuls in a run of the span
  above_mixer: float     # ... in a pass from the span's first layer to the last layer
  full_mixer: float      # ... in a pass over every layer
  sweep0_mixer: float    # ... in Jacobi's sweep 0 (0 when the type's plain_state hook
                         # runs it without the recurrence: T2MLR)

  @property
  def full(self) -> float:
    """Every layer once with the recurrence, and the head (exact mode; pass 0)."""
    return self.head + self.lower + self.middle + self.upper + self.full_mixer

  @property
  def refined(self) -> float:
    """A pass from the span on (the layers below keep pass 0's output), and the head."""
    return self.head + self.middle + self.upper + self.above_mixer


def pass_costs(cfg: ModelConfig, batch: int, seq_len: int) -> PassCosts:
  tokens = batch * seq_len
  per_layer = layer_flops(cfg, batch, seq_len)
  sizes = {name: hi - lo for name, lo, hi in cfg.segments}
  n = {k: sizes.get(k, 0) for k in ("lower", "middle", "upper")}
  above = n["middle"] + n["upper"]
  span_mixer = mixer_flops(cfg, tokens, n["middle"])
  return PassCosts(
      head=head_flops(cfg, tokens), lower=n["lower"] * per_layer,
      middle=n["middle"] * per_layer, upper=n["upper"] * per_layer, span_mixer=span_mixer,
      above_mixer=mixer_flops(cfg, tokens, above), full_mixer=mixer_flops(cfg, tokens),
      sweep0_mixer=0.0 if recurrence_of(cfg).plain_state is not None else span_mixer)


def _schedule_flops(cfg, batch, seq_len, mode, sweeps, given) -> tuple[float, float]:
  """(forward FLOPs, FLOPs of what carries gradient) of a registered schedule: its own
  `flops` declaration over this model's pass costs, at the config's options with those
  given (None: the config's) over them."""
  schedule = SCHEDULES.get(mode)
  options = {k: cfg.schedule_options[k] for k in schedule.option_defaults()}
  options.update({k: v for k, v in given.items() if v is not None and k in options})
  return schedule.flops(pass_costs(cfg, batch, seq_len), options, sweeps)


def _given(schedule_options: Optional[Mapping], legacy: dict) -> dict:
  """The schedule options a call gives: the mapping and, as code written before it took
  one says, options as keywords (forward_flops(..., d_forward=8))."""
  if schedule_options is not None and not isinstance(schedule_options, Mapping):
    raise ValueError(f"schedule_options={schedule_options!r} is invalid: allowed a mapping "
                     "of the schedule's options, e.g. {'d_forward': 8}")
  given = {**dict(schedule_options or {}), **legacy}
  declared = schedule_option_defaults()
  unknown = sorted(set(given) - set(declared))
  if unknown:
    raise ValueError(f"schedule_options.{unknown[0]}={given[unknown[0]]!r} is invalid: "
                     f"allowed an option of a registered schedule: {list(declared)}")
  return given


def forward_flops(cfg: ModelConfig, batch: int, seq_len: int, mode: str = "parallel",
                  schedule_options: Optional[Mapping] = None, sweeps: Optional[int] = None,
                  **options) -> float:
  """FLOPs of one forward pass in `mode`.

  parallel: every layer once (LRT's zero-memory pass with its feedback matmuls).
  exact: every layer once plus the recurrence's matmuls (the token-by-token span does
  the same matmuls; its attention is over the causal prefix, counted as full here).
  A training schedule: its own declaration (`registry.Schedule.flops`) over `pass_costs`
  at the config's `schedule_options` with those given over them (a mapping, or keywords:
  `d_forward=8`), e.g. jacobi: lower once, sweep 0 + (sweeps − 1) span sweeps, the final
  span + upper pass; `sweeps` (the sweeps or passes actually run) defaults to the
  options'.
  """
  given = _given(schedule_options, options)
  tokens = batch * seq_len
  plain = head_flops(cfg, tokens) + cfg.n_layers * layer_flops(cfg, batch, seq_len)
  if cfg.recurrence is None:
    return plain
  if mode == "parallel":      # LRT's zero-memory pass still runs its feedback matmuls
    return plain + (mixer_flops(cfg, tokens) if cfg.recurrence.parallel_runs_mixer else 0.0)
  if mode == "exact":
    return pass_costs(cfg, batch, seq_len).full
  return _schedule_flops(cfg, batch, seq_len, mode, sweeps, given)[0]


def train_step_flops(cfg: ModelConfig, batch: int, seq_len: int, mode: str = "parallel",
                     schedule_options: Optional[Mapping] = None,
                     sweeps: Optional[int] = None, **options) -> float:
  """Forward + backward: 2× the forward FLOPs of what carries gradient (a schedule
  declares which part does: Jacobi's no-gradient sweeps do not); `schedule_options` as
  `forward_flops` takes them."""
  given = _given(schedule_options, options)
  if cfg.recurrence is None or mode in ("parallel", "exact"):
    return 3 * forward_flops(cfg, batch, seq_len, mode)
  fwd, grad = _schedule_flops(cfg, batch, seq_len, mode, sweeps, given)
  return fwd + 2 * grad


def train_flops_spent(cfg: ModelConfig, batch: int, seq_len: int, mode: str,
                      train_log: list) -> float:
  """The training FLOPs a run spent, from its train log: each window's steps
  (`loss_window`) at the step cost of the sweeps it ran on average, for a schedule that
  declares a `sweeps_metric` (Jacobi under a tolerance: the forward is linear in the
  sweeps, so the mean is exact); other schedules cost the same at every step."""
  metric = None
  if cfg.recurrence is not None and mode in SCHEDULES:
    metric = SCHEDULES.get(mode).sweeps_metric
  total = 0.0
  for record in train_log:
    steps = record.get("loss_window")
    if steps is None:
      raise ValueError("train_log: a record without 'loss_window' (written by an older "
                       "train loop?) cannot say how many steps it covers")
    sweeps = record.get(metric) if metric else None
    total += steps * train_step_flops(cfg, batch, seq_len, mode, sweeps=sweeps)
  return total


def exact_bptt_bytes(cfg: ModelConfig, batch: int, seq_len: int) -> float:
  """Bytes backpropagation through the exact mode keeps for its token-by-token loop: every
  step's key/value caches of the recurrent span (and their cotangents), quadratic in
  the sequence length. Matches XLA's compiled temporary memory to ~5% once this term
  dominates (T·B >= 512 at d_model 64); the rest of the step is not counted."""
  n_block = (sum(hi - lo for name, lo, hi in cfg.segments if name == "middle")
             if cfg.recurrence is not None else 0)
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
