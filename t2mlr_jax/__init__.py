"""t2mlr_jax: transformers with temporal middle-layer recurrence, in JAX/Flax.

Public API:
  ModelConfig, RopeScaling                frozen, validated configuration
  T2MLRConfig, LRTConfig                  the recurrence types (ModelConfig.recurrence)
  ScheduleOptions                         the schedules' options (ModelConfig.schedule_options)
  init_params(cfg, rng)                   fresh parameters
  forward(params, cfg, tokens, mode=...)  logits: parallel / exact / jacobi / interleaved
  loss(params, cfg, tokens, mode=...)     the training loss of any model and mode
  generate(params, cfg, prompt, ...)      exact prefill + KV-cached decoding
  stream(params, cfg, prompt, ...)        the same tokens, yielded one step at a time
  mode_names()                            every mode forward/loss take now
  RecurrenceType, register_recurrence     add a recurrence type (docs/design.md)
  Schedule, register_schedule             add a training schedule

The names load on first use (PEP 562), so `import t2mlr_jax` is cheap and a command line's
argument errors print before JAX loads; `from t2mlr_jax import forward` works as usual.
"""

import importlib

__version__ = "0.1.0"

# name -> (module, attribute): where each public name lives
_API = {
    "ModelConfig": ("t2mlr_jax.config", "ModelConfig"),
    "RopeScaling": ("t2mlr_jax.config", "RopeScaling"),
    "ScheduleOptions": ("t2mlr_jax.config", "ScheduleOptions"),
    "T2MLRConfig": ("t2mlr_jax.model.recurrence.t2mlr", "T2MLRConfig"),
    "LRTConfig": ("t2mlr_jax.model.recurrence.lrt", "LRTConfig"),
    "init_params": ("t2mlr_jax.model.transformer", "init_params"),
    "forward": ("t2mlr_jax.model.modes", "forward"),
    "loss": ("t2mlr_jax.model.api", "loss"),
    "generate": ("t2mlr_jax.model.decode", "generate"),
    "stream": ("t2mlr_jax.model.decode", "stream"),
    "mode_names": ("t2mlr_jax.model.modes", "mode_names"),
    "RecurrenceType": ("t2mlr_jax.registry", "RecurrenceType"),
    "register_recurrence": ("t2mlr_jax.model.recurrence", "register"),
    "Schedule": ("t2mlr_jax.registry", "Schedule"),
    "register_schedule": ("t2mlr_jax.model.schedules", "register"),
}

__all__ = [*_API, "__version__"]


def __getattr__(name):
  """A public name, imported from its module the first time it is asked for."""
  if name not in _API:
    raise AttributeError(f"module 't2mlr_jax' has no attribute {name!r}")
  module, attribute = _API[name]
  value = getattr(importlib.import_module(module), attribute)
  globals()[name] = value
  return value


def __dir__():
  return sorted([*globals(), *_API])
