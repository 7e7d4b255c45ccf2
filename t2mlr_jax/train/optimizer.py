"""Optimizer (SPEC §6): AdamW, linear warm-up + cosine to a minimum LR, grad-norm
clipping, no weight decay on γ / norms / biases, an LR multiplier for the
recurrence parameters (×100 when fine-tuning a pretrained model)."""

from __future__ import annotations

import jax
import optax

NO_DECAY_LEAVES = ("scale", "bias", "gamma_rec", "gamma_cur")


def _leaf_name(path) -> str:
  last = path[-1]
  return str(getattr(last, "key", getattr(last, "name", last)))


def _in_recurrence(path) -> bool:
  return any(getattr(k, "key", None) == "recurrence" for k in path)


def decay_mask(params):
  """True where weight decay applies: matrices and embeddings, not γ, norms or biases."""
  return jax.tree_util.tree_map_with_path(
      lambda path, _: _leaf_name(path) not in NO_DECAY_LEAVES, params)


def recurrence_mask(params):
  return jax.tree_util.tree_map_with_path(lambda path, _: _in_recurrence(path), params)


def make_schedule(opt_config, num_steps: int) -> optax.Schedule:
  """0 → lr over warmup_frac·num_steps, then cosine to min_lr_frac·lr at num_steps."""
  warmup = int(round(opt_config.warmup_frac * num_steps))
  peak = opt_config.lr
  if warmup == 0:
    return optax.cosine_decay_schedule(peak, max(num_steps, 1), alpha=opt_config.min_lr_frac)
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=peak, warmup_steps=warmup,
      decay_steps=max(num_steps, warmup + 1), end_value=peak * opt_config.min_lr_frac)


def make_optimizer(opt_config, num_steps: int):
  """(optax transform, schedule). The transform is mask-aware by tree structure."""
  schedule = make_schedule(opt_config, num_steps)
  parts = []
  if opt_config.grad_clip:
    parts.append(optax.clip_by_global_norm(opt_config.grad_clip))
  parts.append(optax.adamw(schedule, b1=opt_config.b1, b2=opt_config.b2, eps=opt_config.eps,
                           weight_decay=opt_config.weight_decay, mask=decay_mask))
  if opt_config.recurrence_lr_mult != 1.0:
    parts.append(optax.masked(optax.scale(opt_config.recurrence_lr_mult), recurrence_mask))
  return optax.chain(*parts), schedule
