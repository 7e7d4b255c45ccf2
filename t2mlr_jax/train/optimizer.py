"""Optimizers (docs/training.md): AdamW or Muon, both with linear warm-up + cosine to a
minimum LR, grad-norm clipping and an LR multiplier for the recurrence's parameters (×100
when fine-tuning a pretrained model).

- `adamw`: one AdamW over every leaf; no weight decay on the leaves the backbone
  and the model's recurrence type declare (`ModelFamily.no_decay`: the transformer's norm
  scales, biases, α / β; `RecurrenceType.no_decay`: T2MLR's γ_rec / γ_cur, LRT's γ).
- `muon`: nanochat's split (the LRT release's optimizer). `param_groups` labels every
  leaf by its per-layer shape and place:
    matrices    every 2-D weight, per layer for the stacked [L, in, out] leaves (attention,
                MLP, LRT's W_k / W_v / gates, T2MLR's W_rec / f_rec / f_cur, value-
                embedding gates): optax's `contrib.muon` at `matrix_lr` with explicit
                dimension numbers (reduction axis −2, output axis −1, the layer axis a
                batch axis), momentum `muon_momentum`, decoupled `weight_decay`;
    embeddings  the token embedding and value-embedding tables (nanochat's and LRT's):
                AdamW at `embedding_lr`;
    unembedding the LM head: AdamW at `unembedding_lr`;
    scalars     everything else (norm scales, biases, α / β / γ, gate biases): AdamW at
                `scalar_lr` (as nanochat: α at ×0.01, β with b1 0.96).
  The AdamW groups use (adam_b1, adam_b2), eps `adam_eps`, no weight decay, and, with
  `dmodel_lr_scale`, nanochat's ×(d_model/768)^−0.5 on the embedding and unembedding
  LRs. Every group follows the same warm-up/cosine multiplier. A tied embedding is
  one leaf: it is in the embeddings group.
`recurrence_lr_mult` scales the updates of every recurrence leaf (`recurrence_mask`:
params["recurrence"] and LRT's per-layer `memory`) after its group's optimizer, under
either optimizer. `freeze_base_model` (the official T2MLR release's option) trains the
recurrence leaves alone: every other leaf gets a zero update and no optimizer state
(`optax.multi_transform` with `set_to_zero`), and the gradient clip's norm is the
recurrence's. `OptimizerConfig` is the typed `optimizer` group (fields, defaults,
checks); `make_optimizer` takes it.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import optax
from optax import contrib

from t2mlr_jax.config import invalid
from t2mlr_jax.model import recurrence
from t2mlr_jax.registry import FAMILIES, RECURRENCES, family_of

OPTIMIZERS = ("adamw", "muon")
MUON_GROUPS = ("matrices", "embeddings", "unembedding", "scalars")
STACKED = ("layers", "value_embeds")       # top-level trees with a leading layer axis
# the backbone's token-indexed tables (a recurrence type declares its own)
EMBEDDING_LEAVES = (("embed", "embedding"), ("value_embeds", "embedding"))


def _fail(field, value, allowed):
  invalid(field, value, allowed, prefix="config field ")


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
  """The `optimizer` group, typed and checked on construction (`as_optimizer_config`,
  config.optimizer_config): "adamw" reads lr, b1, b2, eps, weight_decay; "muon" matrix_lr,
  embedding_lr, unembedding_lr, scalar_lr, adam_b1/b2/eps, muon_momentum, weight_decay (the
  matrices'), dmodel_lr_scale; both warmup/min_lr_frac, grad_clip, recurrence_lr_mult,
  freeze_base_model."""
  name: str = "adamw"               # "adamw" or "muon"
  lr: float = 5e-4                  # adamw: peak learning rate
  b1: float = 0.9
  b2: float = 0.95
  eps: float = 1e-8
  weight_decay: float = 0.01
  warmup_frac: float = 0.05         # linear warmup over this fraction of num_steps
  min_lr_frac: float = 0.01         # cosine decay to lr * min_lr_frac
  grad_clip: float = 1.0            # global-norm clip (0: off)
  recurrence_lr_mult: float = 1.0   # learning-rate multiplier of the recurrence's parameters
  freeze_base_model: bool = False   # train the recurrence's parameters alone
  matrix_lr: float = 0.02           # muon: hidden matrices
  embedding_lr: float = 0.2         # muon: embeddings (Adam)
  unembedding_lr: float = 0.004     # muon: LM head (Adam)
  scalar_lr: float = 0.5            # muon: scalars (Adam)
  adam_b1: float = 0.8
  adam_b2: float = 0.95
  adam_eps: float = 1e-10
  muon_momentum: float = 0.95
  dmodel_lr_scale: bool = True      # muon: scale Adam rates by (d_model / 768)^-0.5

  def __post_init__(self):
    if self.name not in OPTIMIZERS:
      _fail("optimizer.name", self.name, f"one of {OPTIMIZERS}")
    if not self.lr > 0:
      _fail("optimizer.lr", self.lr, "> 0")
    if not 0 <= self.warmup_frac < 1:
      _fail("optimizer.warmup_frac", self.warmup_frac, "a fraction in [0, 1)")
    if not 0 <= self.min_lr_frac <= 1:
      _fail("optimizer.min_lr_frac", self.min_lr_frac, "a fraction in [0, 1]")
    self._check_fractions("b1", "b2")
    if self.weight_decay < 0:
      _fail("optimizer.weight_decay", self.weight_decay, ">= 0")
    if not self.grad_clip >= 0:
      _fail("optimizer.grad_clip", self.grad_clip, ">= 0 (0 disables clipping)")
    if not self.recurrence_lr_mult > 0:
      _fail("optimizer.recurrence_lr_mult", self.recurrence_lr_mult, "> 0")
    if self.name == "muon":
      for name in ("matrix_lr", "embedding_lr", "unembedding_lr", "scalar_lr", "adam_eps"):
        if not getattr(self, name) > 0:
          _fail(f"optimizer.{name}", getattr(self, name), "> 0")
      self._check_fractions("adam_b1", "adam_b2", "muon_momentum")

  def _check_fractions(self, *names):
    for name in names:
      if not 0 <= getattr(self, name) < 1:
        _fail(f"optimizer.{name}", getattr(self, name), "in [0, 1)")


def as_optimizer_config(opt_config) -> OptimizerConfig:
  """An OptimizerConfig as it is; an `optimizer` group (ConfigDict, dict) typed in one call
  (a field it lacks at its default, keys that are no field ignored)."""
  if isinstance(opt_config, OptimizerConfig):
    return opt_config
  return OptimizerConfig(**{f.name: opt_config[f.name] for f in dataclasses.fields(
      OptimizerConfig) if f.name in opt_config})


def _keys(path) -> tuple:
  return tuple(str(getattr(k, "key", getattr(k, "name", k))) for k in path)


def _leaf_name(path) -> str:
  return _keys(path)[-1]


def _in_recurrence(path) -> bool:
  keys = _keys(path)
  return keys[0] == "recurrence" or (keys[0] == "layers" and "memory" in keys)


def _declarations(cfg) -> tuple:
  """The registered entries whose declarations apply to `cfg`'s parameters: its model
  family and, for a model with a recurrence field, its recurrence type; with no config,
  every registered family and type."""
  if cfg is None:
    return FAMILIES.values() + RECURRENCES.values()
  if hasattr(cfg, "recurrence"):
    return (family_of(cfg), recurrence.of(cfg))
  return (family_of(cfg),)


def no_decay_leaves(cfg=None) -> frozenset:
  """Leaf names weight decay leaves alone: those the model family (the transformer's
  `transformer.NO_DECAY`: norm scales, biases, α / β) and the recurrence type
  (`RecurrenceType.no_decay`) declare."""
  return frozenset().union(*(d.no_decay for d in _declarations(cfg)))


def decay_mask(params, cfg=None):
  """True where weight decay applies: matrices and embeddings, not the declared scalars,
  norms and biases (`no_decay_leaves`)."""
  names = no_decay_leaves(cfg)
  return jax.tree_util.tree_map_with_path(lambda path, _: _leaf_name(path) not in names,
                                          params)


def recurrence_mask(params):
  """True on the recurrence's own parameters (T2MLR's and LRT's)."""
  return jax.tree_util.tree_map_with_path(lambda path, _: _in_recurrence(path), params)


def _muon_group(path, leaf, embeddings: tuple) -> str:
  keys = _keys(path)
  if keys[:2] == ("lm_head", "kernel"):
    return "unembedding"
  if any(keys[i:i + 2] == tuple(pair) for pair in embeddings for i in range(len(keys) - 1)):
    return "embeddings"
  per_layer_ndim = leaf.ndim - (1 if keys[0] in STACKED else 0)
  return "matrices" if per_layer_ndim == 2 else "scalars"


def param_groups(params, cfg=None):
  """The Muon optimizer's group of every leaf (a tree of MUON_GROUPS names): the LM head,
  the token-indexed tables (the backbone's and those a recurrence type declares in
  `embedding_leaves`), 2-D weights per layer, and the rest."""
  embeddings = EMBEDDING_LEAVES + tuple(p for d in _declarations(cfg)
                                        for p in getattr(d, "embedding_leaves", ()))
  return jax.tree_util.tree_map_with_path(
      lambda path, leaf: _muon_group(path, leaf, embeddings), params)


def make_schedule(opt_config, num_steps: int, peak=None) -> optax.Schedule:
  """0 → peak (default lr) over warmup_frac·num_steps, then cosine to min_lr_frac·peak."""
  warmup = int(round(opt_config.warmup_frac * num_steps))
  peak = opt_config.lr if peak is None else peak
  if warmup == 0:
    return optax.cosine_decay_schedule(peak, max(num_steps, 1), alpha=opt_config.min_lr_frac)
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=peak, warmup_steps=warmup,
      decay_steps=max(num_steps, warmup + 1), end_value=peak * opt_config.min_lr_frac)


def _muon(opt_config, num_steps: int, d_model, cfg):
  """(multi_transform over MUON_GROUPS, the matrices' schedule)."""
  o = opt_config
  scale = (d_model / 768) ** -0.5 if (o.dmodel_lr_scale and d_model) else 1.0
  sched = lambda lr: make_schedule(o, num_steps, peak=lr)
  adam = lambda lr, b1=o.adam_b1: optax.adamw(sched(lr), b1=b1, b2=o.adam_b2, eps=o.adam_eps,
                                              weight_decay=0.0)
  dims = lambda params: jax.tree.map(
      lambda a: contrib.MuonDimensionNumbers(reduction_axis=a.ndim - 2, output_axis=a.ndim - 1),
      params)
  matrices = contrib.muon(sched(o.matrix_lr), beta=o.muon_momentum,
                          weight_decay=o.weight_decay, muon_weight_dimension_numbers=dims)
  scalar_kind = {"resid_lambda": "alpha", "x0_lambda": "beta"}
  scalars = optax.multi_transform(
      {"alpha": adam(o.scalar_lr * 0.01), "beta": adam(o.scalar_lr, b1=0.96),
       "other": adam(o.scalar_lr)},
      lambda p: jax.tree_util.tree_map_with_path(
          lambda path, _: scalar_kind.get(_leaf_name(path), "other"), p))
  transforms = {"matrices": matrices, "embeddings": adam(o.embedding_lr * scale),
                "unembedding": adam(o.unembedding_lr * scale), "scalars": scalars}
  return (optax.multi_transform(transforms, lambda p: param_groups(p, cfg)),
          sched(o.matrix_lr))


def make_optimizer(opt_config: OptimizerConfig, num_steps: int, cfg=None):
  """(optax transform, the schedule reported as `lr`: AdamW's, or Muon's matrix LR) of the
  typed `opt_config` (an `optimizer` group is typed first: `as_optimizer_config`). Masks
  follow the tree structure, so one transform serves any model. `cfg`, the model's config
  (a ModelConfig, the LSTM's, or None), gives the recurrence type whose no-decay leaves and
  embedding tables apply (None: every registered type's) and the d_model of Muon's
  dmodel_lr_scale."""
  o = as_optimizer_config(opt_config)
  if o.freeze_base_model and cfg is not None and getattr(cfg, "recurrence", None) is None:
    raise ValueError("optimizer.freeze_base_model=True is invalid for a model without a "
                     "recurrence (model.recurrence is None): nothing would train; allowed: "
                     "False")
  parts = []
  if o.grad_clip:
    parts.append(optax.clip_by_global_norm(o.grad_clip))
  if o.name == "muon":
    tx, schedule = _muon(o, num_steps, getattr(cfg, "d_model", None), cfg)
    parts.append(tx)
  else:
    schedule = make_schedule(o, num_steps)
    parts.append(optax.adamw(schedule, b1=o.b1, b2=o.b2, eps=o.eps,
                             weight_decay=o.weight_decay, mask=lambda p: decay_mask(p, cfg)))
  if o.recurrence_lr_mult != 1.0:
    parts.append(optax.masked(optax.scale(o.recurrence_lr_mult), recurrence_mask))
  tx = optax.chain(*parts)
  fixed = fixed_leaves(cfg)
  if o.freeze_base_model or fixed:
    tx = optax.multi_transform({"train": tx, "frozen": optax.set_to_zero()},
                               functools.partial(_frozen_labels, base=o.freeze_base_model,
                                                 fixed=fixed))
  return tx, schedule


def fixed_leaves(cfg) -> tuple:
  """Names of the recurrence's leaves the trainer sets per step and nothing learns
  (`RecurrenceType.fixed_leaves`: the recurrent_weight curriculum's); () without a config."""
  if getattr(cfg, "recurrence", None) is None:
    return ()
  declared = recurrence.of(cfg).fixed_leaves
  return () if declared is None else tuple(declared(cfg))


def _frozen_labels(params, base: bool, fixed: tuple):
  """'frozen' (no update, no optimizer state) on the base model's leaves when `base`
  (freeze_base_model) and on the recurrence's `fixed` leaves; 'train' elsewhere."""
  def label(path, leaf):
    if _in_recurrence(path):
      return "frozen" if _leaf_name(path) in fixed else "train"
    return "frozen" if base else "train"
  return jax.tree_util.tree_map_with_path(label, params)
