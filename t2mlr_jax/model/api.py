"""One entry point over every model family: the transformer (with or without a
recurrence) and the LSTM baseline, for training and evaluation loops; and the one
public loss every trainer uses."""

from __future__ import annotations

from typing import Union

import jax.numpy as jnp

from t2mlr_jax.config import ModelConfig
from t2mlr_jax.losses import cross_entropy, next_token_labels
from t2mlr_jax.model import lstm
from t2mlr_jax.model.modes import forward
from t2mlr_jax.model.transformer import init_params

AnyModelConfig = Union[ModelConfig, lstm.LSTMConfig]


def init_model(cfg: AnyModelConfig, rng):
  if isinstance(cfg, lstm.LSTMConfig):
    return lstm.init_params(cfg, rng)
  return init_params(cfg, rng)


def apply_model(params, cfg: AnyModelConfig, batch, mode: str, **mode_options):
  """(logits, aux) of a batch dict with input_ids [B,T] and optional control_flow,
  positions, segment_ids. The LSTM ignores control flow and mode."""
  if isinstance(cfg, lstm.LSTMConfig):
    return lstm.forward(params, cfg, batch["input_ids"]), {}
  return forward(params, cfg, batch["input_ids"], mode=mode,
                 control_flow=batch.get("control_flow"), positions=batch.get("positions"),
                 segment_ids=batch.get("segment_ids"), return_aux=True, **mode_options)


def loss(params, cfg: AnyModelConfig, tokens, *, mode: str, targets=None, loss_mask=None,
         control_flow=None, positions=None, segment_ids=None, return_aux: bool = False,
         **mode_options):
  """The training loss of any model under `mode` (a scalar; with return_aux, (loss, aux)).

  targets=None: next-token labels (position t predicts token t+1; the last position is
  not scored). targets [B, T]: position t is scored against targets[t] (label shift 0,
  the release's convention and our S5 data's); any negative target is ignored.
  loss_mask [B, T]: positions whose prediction counts (the others are ignored).
  mode "interleaved" (LRT): (Σ_p mean CE of pass p over its own positions) / (S+1), each
  pass's mean over its supervised positions; aux adds per_pass_losses [S+1]. Every other
  mode: the mean CE of the logits over supervised positions. aux also holds the
  forward's aux and `supervised_tokens`. mode_options: d_forward, d_backward,
  jacobi_tol (jacobi); passes, kv_refresh (interleaved).
  """
  tokens = jnp.asarray(tokens)
  if targets is None:
    labels = next_token_labels(tokens)
  else:
    labels = jnp.asarray(targets)
    if labels.shape != tokens.shape:
      raise ValueError(f"targets must have the tokens' shape {tuple(tokens.shape)}, got "
                       f"{tuple(labels.shape)}")
  if loss_mask is not None:
    if tuple(loss_mask.shape) != tuple(tokens.shape):
      raise ValueError(f"loss_mask must have the tokens' shape {tuple(tokens.shape)}, got "
                       f"{tuple(loss_mask.shape)}")
    labels = jnp.where(jnp.asarray(loss_mask).astype(bool), labels, -1)
  batch = {"input_ids": tokens, "control_flow": control_flow, "positions": positions,
           "segment_ids": segment_ids}
  logits, aux = apply_model(params, cfg, batch, mode, **mode_options)
  aux = dict(aux)
  if mode == "interleaved" and "pass_logits" in aux:
    from t2mlr_jax.model.interleaved import pass_positions
    pass_logits = aux.pop("pass_logits")
    sets = pass_positions(tokens.shape[1], len(pass_logits) - 1)
    losses = [cross_entropy(pass_logits[0], labels)[0]]
    losses += [cross_entropy(lg, labels[:, P])[0] for lg, P in zip(pass_logits[1:], sets)]
    per_pass = jnp.stack(losses)
    value = jnp.mean(per_pass)
    aux["per_pass_losses"] = per_pass
    count = cross_entropy(pass_logits[0], labels)[1]
  else:
    value, count = cross_entropy(logits, labels)
  aux["supervised_tokens"] = count
  return (value, aux) if return_aux else value


def num_params(cfg: AnyModelConfig) -> int:
  return cfg.num_params()
