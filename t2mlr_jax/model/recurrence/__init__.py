"""The recurrence types behind one interface that every mode and schedule shares.

A recurrence carries a state per sequence from token t−1 to token t: whatever pytree
the type's `zero_state(cfg, B)` returns (T2MLR, LRT: one fp32 [B, D] array; a type may
carry several vectors or a matrix), handed to its functions with a time axis after the
batch ([B, T, ...] leaves) and moved only through `span.py`'s helpers elsewhere. Each type
is one module here (`t2mlr.py`, `lrt.py`) answering the same questions; the modes
(`modes.py`, `decode.py`) and the training schedules (`schedules/`) only orchestrate
them, through `span.py` (the recurrent span run over all positions, and the state each
position reads from the one before it). Adding a type = a config class (its fields,
`span`, `num_params`, `mixer_flops`) and a module answering the functions below, which
ends by registering its `registry.RecurrenceType` (`register`); the module may live
anywhere (a user's file: `--user_module`). "none" (`none.py`) is the model without one.

    init_params(cfg, rng)             what it adds to the parameters outside the layers
                                      (None if nothing); `layer_module` (a Linen module
                                      or None) adds per-layer parameters inside `Block`
    zero_state(cfg, B)                the state before the first token (its shape:
                                      any pytree of [B, ...] arrays)
    read(cfg, state, positions, slots)  the state a position sees (zero at a reset)
    enter(params, cfg, h, state, cf)  how the state enters the residual stream at the first
                                      layer of the recurrent span -> (h, stats)
    memory(cfg, state, cf)            what every layer of the span and above reads
                                      inside `Block` (None: no per-layer path)
    carry(params, cfg, o, state, cf)  what a position leaves for the next one, from the
                                      output of the span's last layer
    stats(stats, cf), layer_stats(collected, cfg)
                                      metrics of `enter`'s stats / of what the per-layer
                                      module sowed ("intermediates")
    scalars(params, cfg)              learned scalars a training log shows
    value_embed_rows(params, cfg, tokens)  the type's own per-layer value-embedding
                                      inputs, gathered once per call (None: none)

Hooks a schedule uses where a type needs something of its own (None: declined):

    plain_state(cfg, o, cf)           Jacobi's sweep 0: the state from a span run without
                                      the recurrence (T2MLR, the release's raw output);
                                      declined: sweep 0 runs the span from zero state
    refresh_kv(params, cfg, rope, buf, extras, old, memory, unvisited)
                                      refinement passes' K/V refresh (LRT); declined:
                                      `kv_refresh` is refused for the type
    span_exit(params, cfg, o, state, cf)
                                      the span's last output as the layers above and
                                      `carry` read it (T2MLR's skip to l_end); declined
                                      (or left undefined): o as it is
    at_step(params, cfg, step, num_steps), fixed_leaves(cfg)
                                      leaves the trainer sets before every step from
                                      the step number (T2MLR's recurrent_weight
                                      curriculum) and their names, which the optimizer
                                      never updates; declined: none

The span is `cfg.span` (T2MLR: l_start..l_end; LRT: 0..source layer): the
layers that exact mode and decoding run token by token. Layers below it never see the
recurrence and run in parallel once; layers above it see it through their input and
`memory`, and run in parallel once the states are known.

Control flow (every token, `control_flow.py`): 0 padding, 1 non-recurrent, 2 recurrent.
For every type a cf-0 position writes a zero state and reads none; cf 1 reads no memory
(the position runs as the base model) but writes its state for the next token; cf 2
reads and writes.
"""

from __future__ import annotations

from t2mlr_jax import registry
from t2mlr_jax.config import ModelConfig
from t2mlr_jax.model.control_flow import CF_PAD, CF_PLAIN, CF_RECURRENT

# the built-in types register themselves on import (each file ends with its declaration)
from t2mlr_jax.model.recurrence import lrt, none, t2mlr  # noqa: F401
from t2mlr_jax.registry import RECURRENCES, RecurrenceType

__all__ = ["CF_PAD", "CF_PLAIN", "CF_RECURRENT", "RECURRENCES", "RecurrenceType", "of",
           "register", "layer_module", "init_params", "uses_memory", "zero_state"]


def register(entry: RecurrenceType) -> RecurrenceType:
  """Register a recurrence type (a user's file calls this at import, then configs name it
  by `entry.name`: `recurrence_config(name)`, `ModelConfig(recurrence=ItsConfig())`)."""
  return RECURRENCES.register(entry)


of = registry.recurrence_of      # the registered type of cfg.recurrence


def init_params(cfg: ModelConfig, rng):
  return of(cfg).init_params(cfg, rng)


def layer_module(cfg: ModelConfig):
  return of(cfg).layer_module


def uses_memory(cfg: ModelConfig) -> bool:
  """Whether the recurrence feeds memory into the layers themselves (LRT)."""
  return layer_module(cfg) is not None


def zero_state(cfg: ModelConfig, batch: int):
  """The state before the first token (also the placeholder of a model without one)."""
  return of(cfg).zero_state(cfg, batch)
