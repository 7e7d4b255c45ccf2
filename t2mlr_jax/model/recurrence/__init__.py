"""The recurrence types behind one small interface the execution modes share.

A recurrence carries one fp32 vector per sequence from token t−1 to token t. Each type
is a module here (`t2mlr.py`, `lrt.py`) that answers five questions; the modes
(`modes.py`, `decode.py`) only orchestrate them:

    init_params(cfg, rng)            what it adds to the parameters outside the layers
                                     (None if nothing); `layer_module` (a Linen module
                                     or None) adds per-layer parameters inside `Block`
    read(cfg, state, positions, t)   the state a position sees (zero at a reset)
    enter(params, cfg, h, state, cf) how memory enters the residual stream at the first
                                     layer of the recurrent span -> (h, stats)
    memory(cfg, state, cf)           the memory every layer of the span and above reads
                                     inside `Block` (None: no per-layer path)
    carry(params, cfg, o, state, cf) what a position leaves for the next one, from the
                                     output of the span's last layer
    zero_state(cfg, B), stats(s, cf) the initial state, aux metrics of `enter`'s stats

The span is `cfg.recurrent_block` (T2MLR: l_start..l_end; LRT: 0..source layer): the
layers that exact mode and decoding run token by token. Layers below it never see the
recurrence and run in parallel; layers above it see it through their input and
`memory`, and run in parallel once the states are known. A type's own training
schedule (T2MLR's Jacobi sweeps, LRT's interleaved passes) lives beside the modes.

Control flow (every token): 0 padding, 1 non-recurrent, 2 recurrent. For every type a
cf-0 position writes a zero state and reads none; cf 1 reads no memory (the position
runs as the base model) but writes its state for the next token; cf 2 reads and writes.
"""

from __future__ import annotations

from types import ModuleType

from t2mlr_jax.config import LRTConfig, ModelConfig, T2MLRConfig
from t2mlr_jax.model.recurrence import lrt, t2mlr
from t2mlr_jax.model.recurrence.t2mlr import CF_PAD, CF_PLAIN, CF_RECURRENT

TYPES = {T2MLRConfig: t2mlr, LRTConfig: lrt}

__all__ = ["CF_PAD", "CF_PLAIN", "CF_RECURRENT", "of", "layer_module", "init_params",
           "uses_memory", "zero_state", "lrt", "t2mlr"]


def of(cfg: ModelConfig) -> ModuleType:
  """The module implementing cfg.recurrence's type."""
  return TYPES[type(cfg.recurrence)]


def init_params(cfg: ModelConfig, rng):
  return of(cfg).init_params(cfg, rng)


def layer_module(cfg: ModelConfig):
  return of(cfg).layer_module


def uses_memory(cfg: ModelConfig) -> bool:
  """Whether the recurrence feeds memory into the layers themselves (LRT)."""
  return cfg.recurrence is not None and layer_module(cfg) is not None


def zero_state(cfg: ModelConfig, batch: int):
  """The state before the first token (also the placeholder of a model without one)."""
  return (of(cfg) if cfg.recurrence is not None else t2mlr).zero_state(cfg, batch)
