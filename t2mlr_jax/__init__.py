"""t2mlr_jax: transformers with temporal middle-layer recurrence, in JAX/Flax.

Public API:
  ModelConfig, T2MLRConfig, RopeScaling   frozen, validated configuration
  init_params(cfg, rng)                   fresh parameters (recurrence = identity)
  forward(params, cfg, tokens, mode=...)  logits in the parallel/exact/jacobi modes
  generate(params, cfg, prompt, ...)      exact prefill + KV-cached decoding
"""

from t2mlr_jax.config import ModelConfig, RopeScaling, T2MLRConfig
from t2mlr_jax.model.decode import generate
from t2mlr_jax.model.modes import MODES, forward
from t2mlr_jax.model.transformer import init_params

__version__ = "0.1.0"

__all__ = ["ModelConfig", "T2MLRConfig", "RopeScaling", "init_params", "forward",
           "generate", "MODES", "__version__"]
