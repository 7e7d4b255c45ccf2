"""Migration from the official PyTorch T2MLR release (princeton-pli/T2MLR).

The official wrapper names the base model under `t2mlr_model.model.` and
`t2mlr_model.lm_head.`; the block at l_start moves under
`t2mlr_model.model.layers.{l_start}.model.` and its mixing module sits beside
it as `...layers.{l_start}.t2mlr_mixing_module.`:

    recurrent_projection.weight        W_rec [H, H] (out x in)      -> recurrence/w_rec/kernel
    recurrent_gate_proj.{weight,bias}  f_rec on concat(h, W_rec R)  -> recurrence/f_rec
    input_gate_proj.{weight,bias}      f_cur, same input            -> recurrence/f_cur
    rezero_gamma_recurrent_gate [1]    γ_rec (raw, used as tanh γ)  -> recurrence/gamma_rec
    rezero_gamma_input_gate [1]        γ_cur                        -> recurrence/gamma_cur

That is the `gated` mixer (the paper's Φ). Every mixer declares its own table (`Mixer.
official_names`, model/mixers.py): the release's module attribute → our parameter;
`mixer_params_from_official` maps any mixer's weights with it (Linear weights transposed
to kernels, a norm's weight to its scale, `Sequential` layers to `layer_i` in order,
[1] scalars to shape ()).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Any, Mapping, Union

import numpy as np
from safetensors.numpy import load_file

from t2mlr_jax.config import field_types
from t2mlr_jax.convert import hf
from t2mlr_jax.model import mixers
from t2mlr_jax.model.recurrence.t2mlr import T2MLRConfig

PREFIX = "t2mlr_model."
MIXER = "t2mlr_mixing_module."


def load_state_dict(path: str) -> dict:
  """A state dict from a .safetensors file or a torch .bin/.pt file."""
  if not os.path.isfile(path):
    raise ValueError(f"state dict file {path!r} does not exist")
  if path.endswith(".safetensors"):
    try:
      return load_file(path)
    except Exception as e:  # corrupt or truncated file
      raise ValueError(f"cannot read safetensors file {path!r}: {e}") from e
  if path.endswith((".bin", ".pt", ".pth")):
    import torch  # noqa: PLC0415  (optional: torch is no install requirement; .bin/.pt only)
    sd = torch.load(path, map_location="cpu", weights_only=True)
    return sd.get("state_dict", sd) if isinstance(sd, dict) else sd
  raise ValueError(f"state dict path {path!r}: allowed suffixes .safetensors, .bin, .pt, .pth")


def from_official(state_dict: Union[str, Mapping[str, Any]], hf_config: Mapping[str, Any], *,
                  l_start: int, l_end: int, **overrides):
  """(ModelConfig, params) from an official T2MLR checkpoint.

  l_end is inclusive; negative indices count from the end. `overrides` set
  what config.json cannot say: ModelConfig fields (rope_theta=None for the
  official NoPE S5 models, schedule_options=dict(d_forward=..)) and T2MLRConfig fields
  (residual, cache_norm, ...).
  """
  sd = load_state_dict(state_dict) if isinstance(state_dict, str) else state_dict
  rec_over = {k: v for k, v in overrides.items() if k in hf._T2MLR_FIELDS}
  model_over = {k: v for k, v in overrides.items() if k not in hf._T2MLR_FIELDS}
  rcfg = T2MLRConfig(l_start=l_start, l_end=l_end, **rec_over)
  cfg = hf.config_from_hf(hf_config, recurrence=rcfg, **model_over)
  start, _ = cfg.span
  base = PREFIX + "model."

  def layer_key(i):
    return f"{base}layers.{i}.model." if i == start else f"{base}layers.{i}."

  params = hf.base_params_from_state_dict(sd, cfg, layer_key, prefix=base,
                                          lm_head_key=PREFIX + "lm_head.weight")
  mixer = f"{base}layers.{start}.{MIXER}"
  params["recurrence"] = mixer_params_from_official(
      {k[len(mixer):]: v for k, v in sd.items() if k.startswith(mixer)}, cfg.recurrence,
      cfg.d_model)
  if cfg.recurrence.residual and cfg.recurrence.cache_norm == "rmsnorm":
    raise ValueError("cache_norm='rmsnorm' has no official counterpart: allowed "
                     "'clipped_rms' or 'none' for official checkpoints")
  return cfg, params


def _our_path(key: str, names: dict, layer_index: dict):
  """(our top-level name, the rest of our path) of one release key, or None for a buffer."""
  head, _, rest = key.partition(".")
  if head not in names:
    raise ValueError(f"official mixer weight {key!r} has no counterpart: allowed weights of "
                     f"{sorted(names)}")
  if names[head] is None:
    return None
  rest = rest[len("net."):] if rest.startswith("net.") else rest
  m = re.fullmatch(r"(\d+)\.(weight|bias)", rest)
  if m:
    rank = sorted(layer_index.get(head, ())).index(int(m.group(1)))
    rest = f"layer_{rank}.{m.group(2)}"
  leaf = {"weight": "kernel"}
  return (names[head],) + tuple(leaf.get(p, p) for p in rest.split(".") if p)


def mixer_params_from_official(sd: Mapping[str, Any], rcfg, d_model: int) -> dict:
  """params["recurrence"] of rcfg's mixer from the release's mixing-module weights (keys
  relative to the module, e.g. `recurrent_gate_proj.weight`); release weights the options
  leave unused are dropped, and every parameter must be given with its declared shape."""
  names = dict(mixers.MIXERS.get(rcfg.mixer).official_names)
  shapes = mixers.param_shapes(rcfg, d_model)
  layer_index = {}
  for key in sd:
    m = re.fullmatch(r"([^.]+)\.(?:net\.)?(\d+)\.(weight|bias)", key)
    if m:
      layer_index.setdefault(m.group(1), set()).add(int(m.group(2)))
  out, seen = {}, set()
  for key, value in sd.items():
    path = _our_path(key, names, layer_index)
    if path is None or path[0] not in shapes:
      continue
    parent = _get(shapes, path[:-1])
    if path[-1] == "kernel" and isinstance(parent, Mapping) and "scale" in parent:
      path = path[:-1] + ("scale",)      # a norm's weight: its scale, not a kernel
    declared = shapes
    for p in path:
      if not isinstance(declared, Mapping) or p not in declared:
        raise ValueError(f"official mixer weight {key!r} maps to recurrence/{'/'.join(path)}, "
                         f"which mixer {rcfg.mixer!r} with these options does not declare")
      declared = declared[p]
    array = hf.to_numpy(value).astype(np.float32)
    array = array.T if path[-1] == "kernel" else array
    if array.size != np.prod(declared.shape, dtype=int) or (
        array.ndim == len(declared.shape) and array.shape != declared.shape):
      raise ValueError(f"official {key} has shape {array.shape} (kernels transposed), "
                       f"expected {declared.shape} for recurrence/{'/'.join(path)}")
    node = out
    for p in path[:-1]:
      node = node.setdefault(p, {})
    node[path[-1]] = array.reshape(declared.shape)
    seen.add(path)
  missing = [jax_path for jax_path in _leaf_paths(shapes) if jax_path not in seen]
  if missing:
    raise ValueError(f"the official state dict lacks mixer weights for "
                     f"{['recurrence/' + '/'.join(p) for p in missing]}")
  return out


def _get(tree, path):
  """tree[path[0]][path[1]]..., or None where a key is missing."""
  for p in path:
    if not isinstance(tree, Mapping) or p not in tree:
      return None
    tree = tree[p]
  return tree


def _leaf_paths(tree, prefix=()):
  for k, v in tree.items():
    if isinstance(v, Mapping):
      yield from _leaf_paths(v, prefix + (k,))
    else:
      yield prefix + (k,)


# The release's recurrence settings (its T2MLRSettings, saved in a checkpoint's config.json)
# with their defaults there, and the T2MLRConfig field each is; the cache post-norm and the
# mixer's keys are mapped apart (`settings_from_official`).
RELEASE_SETTINGS = (
    ("connection_detach", False, "connection_detach"),
    ("recurrent_residual_to_recurrent_cache", False, "residual"),
    ("recurrent_residual_to_recurrent_cache_weight", 1.0, "residual_weight"),
    ("recurrent_residual_to_recurrent_cache_detach", False, "residual_detach"),
    ("recurrent_residual_to_recurrent_cache_post_norm_eps", 1e-6, "cache_norm_eps"),
    ("recurrent_residual_to_recurrent_cache_post_norm_clamp", 5.0, "cache_norm_clip"),
    ("recurrent_skip_to_l_end", False, "skip_to_l_end"),
    ("recurrent_skip_to_l_end_weight", 1.0, "skip_weight"),
    ("recurrent_skip_to_l_end_detach", False, "skip_detach"),
    ("recurrent_skip_to_l_end_post_norm", False, "skip_post_norm"),
    ("recurrent_skip_to_l_end_post_norm_eps", 1e-6, "skip_post_norm_eps"),
    ("recurrent_skip_to_l_end_post_norm_clamp", 5.0, "skip_post_norm_clamp"),
    ("use_recurrent_weight_curriculum", False, "use_recurrent_weight_curriculum"),
    ("recurrent_weight_curriculum_start", 0.0, "recurrent_weight_curriculum_start"),
    ("recurrent_weight_curriculum_end", 1.0, "recurrent_weight_curriculum_end"),
    ("recurrent_weight_curriculum_schedule", "linear", "recurrent_weight_curriculum_schedule"),
    ("recurrent_weight_curriculum_warmup_steps", None,
     "recurrent_weight_curriculum_warmup_steps"),
    ("recurrent_weight_curriculum_warmup_ratio", None,
     "recurrent_weight_curriculum_warmup_ratio"),
)
# the release's defaults of the settings its mixing modules read (`from_config`)
RELEASE_MIXER_DEFAULTS = dict(
    recurrent_weight=1.0, recurrent_alpha=0.5, use_recurrent_projection=False,
    recurrent_projection_dim=None, recurrent_state_proj_type="auto",
    recurrent_state_mlp_hidden_dim=None, recurrent_state_mlp_num_layers=2,
    recurrent_state_mlp_activation="gelu", recurrent_state_mlp_dropout=0.0,
    use_learnable_gate=False, use_learnable_recurrent_gate=None, use_learnable_input_gate=None,
    normalize_gates=False, recurrent_gate_init=0.2, input_gate_init=0.8,
    gate_weight_init_std=1e-3, gate_proj_type="linear", gate_mlp_hidden_dim=None,
    gate_mlp_num_layers=2, gate_mlp_activation="gelu", gate_mlp_dropout=0.0,
    pre_norm_streams=False, pre_norm_type="rmsnorm", post_norm=False, post_norm_eps=1e-6,
    post_norm_clamp=5.0, concat_recurrent=False)


# Settings the release's mixers never read: their forward takes the fixed weights from
# call arguments the wrapper never passes (gated: recurrent_weight 1.0, orig_weight 0.0;
# alpha_coupled / var_norm_gated: α 0.5), which are our options' defaults.
RELEASE_INERT = ("recurrent_weight", "orig_weight")


def settings_from_official(settings: Mapping[str, Any]) -> dict:
  """T2MLRConfig fields (for `from_official`'s overrides) of the release's recurrence
  settings: the mixer (`recurrent_mixing_module_name`) and its options (the settings its
  module reads, `mixing_module_kwargs` over them), the cache residual and its post-norm,
  the skip to l_end, connection_detach and the recurrent_weight curriculum; a setting not
  given takes the release's default. The fixed weights the release sets but never reads
  (`RELEASE_INERT`) map to what it computed with. l_start / l_end and the Jacobi depths
  are `from_official`'s own arguments."""
  given = dict(settings)
  out = {ours: given.get(theirs, default) for theirs, default, ours in RELEASE_SETTINGS}
  post_norm = given.get("recurrent_residual_to_recurrent_cache_post_norm", False)
  out["cache_norm"] = "clipped_rms" if post_norm else "none"
  mixer = given.get("recurrent_mixing_module_name", "none")
  entry = mixers.MIXERS.get(mixer, "recurrent_mixing_module_name")
  extra = given.get("mixing_module_kwargs") or {}
  if isinstance(extra, str):
    extra = json.loads(extra) if extra.strip() else {}
  values = {**RELEASE_MIXER_DEFAULTS, **{k: v for k, v in given.items()
                                         if k in RELEASE_MIXER_DEFAULTS}, **extra}
  for inert in RELEASE_INERT:     # what the release computed: its forward's own defaults
    values.pop(inert, None)
  declared = field_types(entry.options) if entry.options is not None else {}
  out["mixer"] = mixer
  out["mixer_options"] = mixers.canonical_options(
      mixer, tuple((k, v) for k, v in values.items() if k in declared))
  return out


def mixer_params_to_official(rec: Mapping[str, Any], rcfg, d_model: int) -> dict:
  """The release's mixing-module weights (keys relative to the module) of params[
  "recurrence"]: the inverse of `mixer_params_from_official` (kernels transposed back to
  out x in, a norm's scale to its weight, `layer_i` to the release's `Sequential` index:
  Linear and activation alternating, a Dropout after each activation when the MLP's
  dropout > 0, the state MLP's under `net.`; a scalar gate to shape [1])."""
  names = mixers.MIXERS.get(rcfg.mixer).official_names
  ours_to_release = {ours: theirs for theirs, ours in names if ours}
  opts = mixers.options_of(rcfg)
  out = {}
  for path in _leaf_paths(rec):
    if path[0] in ("cache_norm", mixers.FIXED_WEIGHT_LEAF):
      continue                        # ours alone (the release has no such weight)
    if path[0] not in ours_to_release:
      raise ValueError(f"recurrence/{'/'.join(path)} of mixer {rcfg.mixer!r} has no release "
                       f"counterpart: allowed {sorted(ours_to_release)}")
    array = np.asarray(_get(rec, path), np.float32)
    state_mlp = isinstance(rec[path[0]], Mapping) and "scaling" in rec[path[0]]
    dropout = getattr(opts, "recurrent_state_mlp_dropout" if state_mlp else
                      "gate_mlp_dropout", 0.0) or 0.0
    parts = [ours_to_release[path[0]]]
    for p in path[1:-1]:
      m = re.fullmatch(r"layer_(\d+)", p)
      if m:
        index = int(m.group(1)) * (3 if dropout > 0 else 2)
        parts.append(f"net.{index}" if state_mlp else str(index))
      else:
        parts.append(p)
    leaf = path[-1]
    if len(path) == 1:
      out[parts[0]] = array.reshape(1) if array.ndim == 0 else array
      continue
    parts.append({"kernel": "weight", "scale": "weight"}.get(leaf, leaf))
    out[".".join(parts)] = array.T if leaf == "kernel" else array
  return out


def settings_to_official(rcfg) -> dict:
  """The release's settings of a T2MLRConfig: the inverse of `settings_from_official`
  (l_start / l_end included; every mixer option written, those the release's settings do
  not name in `mixing_module_kwargs`). A fixed recurrent weight is written, but the
  release's mixers never read it (`RELEASE_INERT`)."""
  if rcfg.cache_norm == "rmsnorm":
    raise ValueError("cache_norm='rmsnorm' has no official counterpart: allowed "
                     "'clipped_rms' or 'none' for an export to the release")
  out = {theirs: getattr(rcfg, ours) for theirs, _, ours in RELEASE_SETTINGS}
  out["recurrent_residual_to_recurrent_cache_post_norm"] = rcfg.cache_norm == "clipped_rms"
  out.update(t2mlr_enabled=True, l_start=rcfg.l_start, l_end=rcfg.l_end,
             recurrent_mixing_module_name=rcfg.mixer)
  opts = mixers.options_of(rcfg)
  if opts is not None:        # every option, defaults included (the release's differ)
    values = dataclasses.asdict(opts)
    out.update({k: v for k, v in values.items() if k in RELEASE_MIXER_DEFAULTS})
    kwargs = {k: v for k, v in values.items() if k not in RELEASE_MIXER_DEFAULTS}
    if kwargs:
      out["mixing_module_kwargs"] = kwargs
  return out


def to_official(cfg, params) -> tuple[dict, dict]:
  """(state dict under the release's names, its settings) of a T2MLR model: what
  `from_official` and `settings_from_official` read back. The base model's weights
  follow the release's wrapper (layer l_start under `.model.`, the mixer beside it)."""
  start, _ = cfg.span
  sd = {}
  for key, value in hf._hf_state_dict(cfg, params).items():
    if key.startswith(f"model.layers.{start}."):
      key = key.replace(f"model.layers.{start}.", f"model.layers.{start}.model.", 1)
    sd[PREFIX + key] = np.asarray(value, np.float32)
  if cfg.tie_embeddings:                  # torch's state dict names the tied head too
    sd[PREFIX + "lm_head.weight"] = sd[PREFIX + "model.embed_tokens.weight"]
  mixer = f"{PREFIX}model.layers.{start}.{MIXER}"
  rec = params.get("recurrence") or {}
  sd.update({mixer + k: v for k, v in mixer_params_to_official(
      rec, cfg.recurrence, cfg.d_model).items()})
  return sd, settings_to_official(cfg.recurrence)
