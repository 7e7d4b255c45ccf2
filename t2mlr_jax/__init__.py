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
"""

from t2mlr_jax.config import ModelConfig, RopeScaling, ScheduleOptions
from t2mlr_jax.model.api import loss
from t2mlr_jax.model.decode import generate, stream
from t2mlr_jax.model.modes import forward, mode_names
from t2mlr_jax.model.recurrence import register as register_recurrence
from t2mlr_jax.model.recurrence.lrt import LRTConfig
from t2mlr_jax.model.recurrence.t2mlr import T2MLRConfig
from t2mlr_jax.model.schedules import register as register_schedule
from t2mlr_jax.model.transformer import init_params
from t2mlr_jax.registry import RecurrenceType, Schedule

__version__ = "0.1.0"

__all__ = ["ModelConfig", "T2MLRConfig", "LRTConfig", "ScheduleOptions", "RopeScaling",
           "init_params",
           "forward", "loss", "generate", "stream", "mode_names", "RecurrenceType",
           "register_recurrence", "Schedule", "register_schedule", "__version__"]
