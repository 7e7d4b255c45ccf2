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

import os
import re
from typing import Any, Mapping, Union

import numpy as np
from safetensors.numpy import load_file

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
