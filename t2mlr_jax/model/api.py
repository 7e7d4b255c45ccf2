"""One entry point over every registered model family (`registry.ModelFamily`: the
transformer, registered here with or without a recurrence, and the LSTM baseline in
`lstm.py`) for training and evaluation loops; and the one public loss every trainer
uses."""

from __future__ import annotations

from typing import Any, Optional

import jax.numpy as jnp

from t2mlr_jax import flops
from t2mlr_jax.config import ModelConfig
from t2mlr_jax.losses import chunked_cross_entropy, cross_entropy, next_token_labels, supervised
from t2mlr_jax.model import kernels, lstm  # noqa: F401  (lstm: its family registers itself)
from t2mlr_jax.model.modes import (
  forward,
  hidden_modes,
  hidden_states,
  mode_options as resolve_mode_options,
)
from t2mlr_jax.model.transformer import NO_DECAY, PARTITION_RULES, head, init_params
from t2mlr_jax.registry import FAMILIES, SCHEDULES, ModelFamily, family_of

AnyModelConfig = Any     # the config of a registered model family


def init_model(cfg: AnyModelConfig, rng):
  """Fresh parameters of any registered family's model."""
  return family_of(cfg).init_params(cfg, rng)


def apply_model(params, cfg: AnyModelConfig, batch, mode: str, **mode_options):
  """(logits, aux) of a batch dict with input_ids [B,T] and optional control_flow,
  positions, segment_ids, by the model's family (the LSTM ignores control flow and
  mode)."""
  return family_of(cfg).apply(params, cfg, batch, mode, **mode_options)


def _apply_transformer(params, cfg: ModelConfig, batch, mode: str, **mode_options):
  return forward(params, cfg, batch["input_ids"], mode=mode,
                 control_flow=batch.get("control_flow"), positions=batch.get("positions"),
                 segment_ids=batch.get("segment_ids"), return_aux=True, **mode_options)


def loss(params, cfg: AnyModelConfig, tokens, *, mode: str, targets=None, loss_mask=None,
         control_flow=None, positions=None, segment_ids=None, return_aux: bool = False,
         loss_chunk: Optional[int] = None, token_totals=None, **mode_options):
  """The training loss of any model under `mode` (a scalar; with return_aux, (loss, aux)).

  targets=None: next-token labels (position t predicts token t+1; the last position is
  not scored). targets [B, T]: position t is scored against targets[t] (label shift 0,
  the release's convention and our S5 data's); any negative target is ignored.
  loss_mask [B, T]: positions whose prediction counts (the others are ignored).
  A schedule whose passes return their own logits weights their losses by its
  `pass_loss` declaration: "interleaved" / "chunked": (Σ_p mean CE of pass p over its own
  positions) / (S+1), each pass's mean over its supervised positions; "multi_refine":
  Σ_k w_k·CE_k / Σ_k w_k over passes 0..K (refine_weights; uniform when empty); aux adds
  per_pass_losses [passes]. Every other mode: the mean CE of the logits over supervised
  positions. aux also holds the forward's aux and `supervised_tokens`. mode_options:
  see `forward` (and refine_weights, multi_refine's loss weights).
  loss_chunk: apply the LM head and the CE `loss_chunk` positions at a time (the same
  value and gradient without materialising [B, T, V] logits; parallel / exact / jacobi).
  token_totals: `loss_token_totals` of a larger batch this one is a part of: every mean
  divides by those counts instead of this batch's, so the parts' losses and gradients
  add up to the whole batch's (gradient accumulation).
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
  if loss_chunk is not None:
    if family_of(cfg).hidden_states is None or (cfg.recurrence is not None
                                                and mode not in hidden_modes()):
      raise ValueError(f"loss_chunk={loss_chunk} needs a transformer in one of the modes "
                       f"{hidden_modes()}, not mode={mode!r} of {type(cfg).__name__}")
    y, aux = hidden_states(params, cfg, tokens, mode=mode, control_flow=control_flow,
                           positions=positions, segment_ids=segment_ids, **mode_options)
    value, count = chunked_cross_entropy(lambda y_c: head(params, cfg, y_c), y, labels,
                                         loss_chunk, _total(token_totals, 0))
    aux = {**aux, "supervised_tokens": count}
    return (value, aux) if return_aux else value
  logits, aux = apply_model(params, cfg, batch, mode, **mode_options)
  aux = dict(aux)
  if "pass_logits" in aux:
    opts = resolve_mode_options(cfg, mode, labels.shape[1], **mode_options)
    value, aux["per_pass_losses"] = SCHEDULES.get(mode).pass_loss(
        aux.pop("pass_logits"), labels, opts, token_totals)
    count = jnp.sum(supervised(labels))
  else:
    value, count = cross_entropy(logits, labels, total=_total(token_totals, 0))
  aux["supervised_tokens"] = count
  return (value, aux) if return_aux else value


def _total(totals, i):
  return None if totals is None else totals[i]


def loss_token_totals(cfg: AnyModelConfig, mode: str, labels_BT, **mode_options):
  """The supervised-token counts `loss` divides by, from the labels alone (the library's
  rule: negative = not supervised): a schedule's `token_totals` declaration (LRT's
  interleaved / chunked passes: [S+1], pass 0 over every position, pass p over its own
  positions), else [1]."""
  labels_BT = jnp.asarray(labels_BT)
  schedule = SCHEDULES.get(mode) if mode in SCHEDULES else None
  if (schedule is None or schedule.token_totals is None
      or getattr(cfg, "recurrence", None) is None):
    return jnp.sum(supervised(labels_BT))[None]
  opts = resolve_mode_options(cfg, mode, labels_BT.shape[1], **mode_options)
  return schedule.token_totals(labels_BT, opts)


def num_params(cfg: AnyModelConfig) -> int:
  return cfg.num_params()


def _check_kernel(cfg: ModelConfig) -> None:
  kernels.check_available(cfg.attention, cfg.dtype, cfg.head_dim)


TRANSFORMER = FAMILIES.register(ModelFamily(
    name="transformer", config=ModelConfig, init_params=init_params,
    apply=_apply_transformer, forward_flops=flops.forward_flops,
    train_step_flops=flops.train_step_flops, modes=True, decodes=True,
    hidden_states=hidden_states, for_devices=kernels.for_devices, check=_check_kernel,
    no_decay=NO_DECAY, partition_rules=PARTITION_RULES, default=True, source=__name__))
