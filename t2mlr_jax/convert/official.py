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
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Union

import numpy as np
from safetensors.numpy import load_file

from t2mlr_jax.convert import hf
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
  take = lambda name: hf._take(sd, mixer + name)
  params["recurrence"] = {
      "gamma_rec": np.float32(take("rezero_gamma_recurrent_gate").reshape(())),
      "gamma_cur": np.float32(take("rezero_gamma_input_gate").reshape(())),
      "w_rec": {"kernel": take("recurrent_projection.weight").T},
      "f_rec": {"kernel": take("recurrent_gate_proj.weight").T,
                "bias": take("recurrent_gate_proj.bias")},
      "f_cur": {"kernel": take("input_gate_proj.weight").T,
                "bias": take("input_gate_proj.bias")},
  }
  if cfg.recurrence.residual and cfg.recurrence.cache_norm == "rmsnorm":
    raise ValueError("cache_norm='rmsnorm' has no official counterpart: allowed "
                     "'clipped_rms' or 'none' for official checkpoints")
  D = cfg.d_model
  for name, shape in (("w_rec", (D, D)), ("f_rec", (2 * D, D)), ("f_cur", (2 * D, D))):
    got = params["recurrence"][name]["kernel"].shape
    if got != shape:
      raise ValueError(f"official {name} has shape {got[::-1]} (out x in), expected {shape[::-1]}")
  return cfg, params
