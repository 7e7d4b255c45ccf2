"""An LSTM language model: the recurrent baseline of the S5 experiments (docs/training.md,
"Recipes of the official runs").

Multi-layer LSTM with tied (or untied) embeddings; each layer's input
projection is one matmul over the whole sequence and only the recurrent
matmul runs inside `lax.scan` over time.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from t2mlr_jax.config import _Replaceable, invalid
from t2mlr_jax.registry import FAMILIES, ModelFamily


@dataclasses.dataclass(frozen=True)
class LSTMConfig(_Replaceable):
  vocab_size: int = 188
  d_model: int = 360          # embedding size = hidden size
  n_layers: int = 4
  tie_embeddings: bool = True
  init_std: float = 1.0         # embedding N(0, init_std): PyTorch's nn.Embedding default
  max_seq_len: int = 2048

  def __post_init__(self):
    for name in ("vocab_size", "d_model", "n_layers", "max_seq_len"):
      value = getattr(self, name)
      if not isinstance(value, int) or value < 1:
        invalid(name, value, "an integer >= 1")

  def num_params(self) -> int:
    D = self.d_model
    total = self.vocab_size * D + self.n_layers * (2 * D * 4 * D + 4 * D)
    return total + (0 if self.tie_embeddings else D * self.vocab_size + self.vocab_size)


@functools.partial(jax.jit, static_argnums=0)
def init_params(cfg: LSTMConfig, rng) -> dict:
  """Uniform(±1/√D) LSTM weights (PyTorch's default), forget-gate bias 1."""
  D = cfg.d_model
  keys = jax.random.split(rng, 2 * cfg.n_layers + 2)
  bound = 1.0 / jnp.sqrt(D)
  uni = lambda k, shape: jax.random.uniform(k, shape, jnp.float32, -bound, bound)
  bias = jnp.zeros((4 * D,), jnp.float32).at[D:2 * D].set(1.0)   # gates: i, f, g, o
  params = {
      "embed": {"embedding": cfg.init_std * jax.random.normal(keys[0], (cfg.vocab_size, D))},
      "lstm": {"w_ih": {"kernel": jnp.stack([uni(keys[2 + 2 * i], (D, 4 * D))
                                             for i in range(cfg.n_layers)])},
               "w_hh": {"kernel": jnp.stack([uni(keys[3 + 2 * i], (D, 4 * D))
                                             for i in range(cfg.n_layers)])},
               "bias": jnp.tile(bias, (cfg.n_layers, 1))},
  }
  if not cfg.tie_embeddings:
    params["lm_head"] = {"kernel": cfg.init_std * jax.random.normal(keys[1], (D, cfg.vocab_size)),
                         "bias": jnp.zeros((cfg.vocab_size,), jnp.float32)}
  return params


def _layer(x_BTD, w_ih, w_hh, b):
  B, _, D = x_BTD.shape
  pre_TB4D = jnp.swapaxes(x_BTD @ w_ih + b, 0, 1)

  def step(carry, pre_B4D):
    h, c = carry
    gates = pre_B4D + h @ w_hh
    i, f, g, o = jnp.split(gates, 4, axis=-1)
    c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
    h = jax.nn.sigmoid(o) * jnp.tanh(c)
    return (h, c), h

  zeros = jnp.zeros((B, D), x_BTD.dtype)
  _, h_TBD = jax.lax.scan(step, (zeros, zeros), pre_TB4D)
  return jnp.swapaxes(h_TBD, 0, 1)


def forward(params, cfg: LSTMConfig, tokens_BT):
  """Logits [B, T, V] (fp32); position t sees tokens 0..t."""
  x = params["embed"]["embedding"][tokens_BT]
  lp = params["lstm"]

  def layer(x, p):
    return _layer(x, p[0], p[1], p[2]), None

  x, _ = jax.lax.scan(layer, x, (lp["w_ih"]["kernel"], lp["w_hh"]["kernel"], lp["bias"]))
  if cfg.tie_embeddings:
    return x @ params["embed"]["embedding"].T
  return x @ params["lm_head"]["kernel"] + params["lm_head"]["bias"]


def apply(params, cfg: LSTMConfig, batch, mode: str, **options):
  """(logits, {}) of a batch: the LSTM reads the tokens only (no control flow or mode)."""
  return forward(params, cfg, batch["input_ids"]), {}


def forward_flops(cfg: LSTMConfig, batch: int, seq_len: int, mode: str = "parallel") -> float:
  """Per token and layer the input and recurrent matmuls (D × 4D each), then the head."""
  D, tokens = cfg.d_model, batch * seq_len
  return float(tokens * (cfg.n_layers * 2 * 2 * D * 4 * D + 2 * D * cfg.vocab_size))


def train_step_flops(cfg: LSTMConfig, batch: int, seq_len: int, mode: str = "parallel"):
  return 3 * forward_flops(cfg, batch, seq_len)


FAMILY = FAMILIES.register(ModelFamily(
    name="lstm", config=LSTMConfig, init_params=init_params, apply=apply,
    forward_flops=forward_flops, train_step_flops=train_step_flops,
    bounded_context=False,        # no positions: any length runs
    no_decay=("bias",), partition_rules=((r"lstm/.*kernel$", ("embed", "mlp")),),
    source=__name__))
