"""The official LRT release (a nanochat fork) <-> ours: `GPTConfig` fields and weights.

Official names (linear weights [out, in]; ours [in, out], stacked over layers):

    transformer.wte.weight [Vp, D]                      embed/embedding
    lm_head.weight [Vp, D]                              lm_head/kernel (transposed)
    transformer.h.i.attn.c_q / c_k / c_v / c_proj       layers/attn/q / k / v / o/kernel[i]
    transformer.h.i.mlp.c_fc / c_proj                   layers/mlp/up / down/kernel[i]
    transformer.h.i.attn.triple_gate.weight [3Hkv, C]   layers/memory/gate[i]
    resid_lambdas / x0_lambdas / interleaved_lambdas    layers/resid_lambda / x0_lambda /
                                                        memory/gamma
    interleaved_projections.i.W_v.weight                layers/memory/w_v[i]   (V feedback)
    interleaved_key_projections.i.W_v.weight            layers/memory/w_k[i]   (K feedback)
    interleaved_init_value_embeds.i.weight [Vp, kv]     layers/memory/ve[i]

The release's plain GPT (use_interleaved=False) converts too, as a nanochat backbone
without recurrence: value_embeds.i.weight [Vp, kv] and transformer.h.i.attn.ve_gate
[Hkv, C] of its value-embedding layers -> value_embeds/embedding[j], gate[j].

Padded vocabulary rows are kept (`pad_vocab_to`), so official -> ours -> official is
exact. RoPE: the release rotates the other way ([x1·cos + x2·sin, −x1·sin + x2·cos]).
We convert it by an exact weight transform instead of a config option: negating the
second half of every head's rows of c_q, c_k and the key feedback W_k turns the
release's rotation into ours (RoPE, QK-norm and the gate mix commute with that sign
flip; q·k is unchanged), so the model runs our one RoPE. The release stores its
rotary table in bfloat16; converted configs do too (`rope_table_dtype="bfloat16"`,
override with "float32" for the exact-table variant). `to_official_lrt` applies
the same flip (its own inverse), to parameters or to any tree shaped like them
(gradients compare by official name).

Both of the release's training schedules convert (its commit a133a67 adds the second):
`use_interleaved` (interleaved passes, our `interleaved`) and `use_multi_refine` (full
refinement passes, our `multi_refine`); their counts, detach and loss weights become
`schedule_options` (passes, kv_refresh, refine_passes, refine_detach, refine_weights).
`ve_gate_channels` 0 is the full width, a133a67's default (e0d0f6e's was 32). A release
checkpoint directory (`model_NNNNNN.pt` + `meta_NNNNNN.json`, as its
`checkpoint_manager.save_checkpoint` writes them) reads with `load_official_checkpoint`
and writes with `save_official_checkpoint`; official -> ours -> official gives the same
state dict and model_config.
"""

from __future__ import annotations

import glob
import json
import os
import re
from typing import Any, Mapping, Optional, Union

import numpy as np

from t2mlr_jax.config import FLOAT32_EPS, ModelConfig
from t2mlr_jax.convert.hf import to_numpy
from t2mlr_jax.convert.official import load_state_dict
from t2mlr_jax.model.recurrence.lrt import LRTConfig
from t2mlr_jax.registry import schedule_option_defaults

SUPPORTED = ("sequence_len", "vocab_size", "n_layer", "n_head", "n_kv_head", "n_embd",
             "window_pattern", "use_value_embeds", "ve_every_layer", "use_x0_residual",
             "use_resid_lambdas", "ve_gate_channels", "use_interleaved",
             "interleaved_num_passes", "interleaved_kv_refresh", "use_multi_refine",
             "multi_refine_num_passes", "multi_refine_detach", "multi_refine_loss_weights")
# the release's schedule flag -> our schedule (train.mode)
SCHEDULES = {"use_interleaved": "interleaved", "use_multi_refine": "multi_refine"}
# a133a67's fields: a config naming one defaults ve_gate_channels to 0 (full width)
_A133A67 = ("use_multi_refine", "multi_refine_num_passes", "multi_refine_detach",
            "multi_refine_loss_weights")


def _load(path: str) -> dict:
  if not os.path.isfile(path):
    raise ValueError(f"state dict file {path!r} does not exist")
  if path.endswith(".npz"):
    with np.load(path) as z:
      return dict(z)
  return load_state_dict(path)


def config_from_official(config: Mapping[str, Any], padded_vocab: int, **overrides) -> ModelConfig:
  """A ModelConfig with an LRTConfig from the release's GPTConfig fields."""
  unknown = sorted(set(config) - set(SUPPORTED))
  if unknown:
    raise ValueError(f"official config field(s) {unknown} are not supported: allowed "
                     f"{list(SUPPORTED)}")
  get = lambda k, d: config.get(k, d)
  on = [flag for flag in SCHEDULES if get(flag, False)]
  if len(on) > 1:
    raise ValueError(f"official config sets {' and '.join(on)}: allowed one training "
                     "schedule (the release refuses both)")
  lrt = bool(on)
  V = int(get("vocab_size", 32768))
  if padded_vocab < V:
    raise ValueError(f"transformer.wte.weight has {padded_vocab} rows < vocab_size={V}")
  pad = 64 if -(-V // 64) * 64 == padded_vocab else padded_vocab
  D, N = int(get("n_embd", 768)), int(get("n_head", 6))
  C = int(get("ve_gate_channels", 0 if any(k in config for k in _A133A67) else 32))
  rec_over = {k: v for k, v in overrides.items() if k in LRTConfig.__dataclass_fields__}
  sched_over = {k: v for k, v in overrides.items()
                if k in schedule_option_defaults() and k not in rec_over}
  model_over = {k: v for k, v in overrides.items() if k not in {**rec_over, **sched_over}}
  rec, ve, options = None, None, {}
  if lrt:       # the interleaved init value embeddings replace the plain ones
    rec = LRTConfig(gate_channels=C, **rec_over)
    options = {"passes": int(get("interleaved_num_passes", 2)),
               "kv_refresh": bool(get("interleaved_kv_refresh", False))}
    if any(k in config for k in _A133A67):
      options.update(refine_passes=int(get("multi_refine_num_passes", 2)),
                     refine_detach=bool(get("multi_refine_detach", False)),
                     refine_weights=tuple(float(w) for w in
                                          get("multi_refine_loss_weights", ()) or ()))
    options.update(sched_over)
  elif rec_over or sched_over:
    raise ValueError(f"{sorted({**rec_over, **sched_over})[0]} is an LRT option: allowed "
                     "only with use_interleaved=True or use_multi_refine=True")
  elif get("use_value_embeds", True):
    ve = "every" if get("ve_every_layer", False) else "alternating"
  model_over.setdefault("rope_table_dtype", "bfloat16")
  return ModelConfig(
      vocab_size=V, pad_vocab_to=pad, d_model=D, n_layers=int(get("n_layer", 12)),
      n_heads=N, n_kv_heads=int(get("n_kv_head", N)), d_ff=4 * D,
      max_seq_len=int(get("sequence_len", 2048)), rope_theta=10000.0,
      rms_norm_eps=FLOAT32_EPS, norm_scale=False, embed_norm=True, qk_norm=True,
      mlp_type="relu2", logit_softcap=15.0, resid_lambdas=bool(get("use_resid_lambdas", True)),
      x0_lambdas=bool(get("use_x0_residual", True)),
      window_pattern=get("window_pattern", "SSSL"), tie_embeddings=False,
      value_embeds=ve, ve_gate_channels=C, recurrence=rec, schedule_options=options,
      **model_over)


def _rope_flip(cfg: ModelConfig, kernel_in_out: np.ndarray) -> np.ndarray:
  """Negate the second half of each head's output columns ([.., in, heads·K])."""
  K = cfg.head_dim
  cols = kernel_in_out.shape[-1]
  sign = np.tile(np.concatenate([np.ones(K // 2), -np.ones(K // 2)]), cols // K)
  return (kernel_in_out * sign.astype(kernel_in_out.dtype)).astype(kernel_in_out.dtype)


def _take(sd, name, shape):
  if name not in sd:
    raise ValueError(f"missing weight {name!r} in the official state dict")
  a = np.asarray(to_numpy(sd[name]), np.float32)
  if tuple(a.shape) != tuple(shape):
    raise ValueError(f"official {name} has shape {tuple(a.shape)}, expected {tuple(shape)}")
  return a


def from_official_lrt(state_dict_or_path: Union[str, Mapping[str, Any]],
                      config: Mapping[str, Any], **overrides):
  """(ModelConfig, params) from an official LRT state dict (or a .safetensors / .pt / .npz
  path) and its GPTConfig fields. `overrides` set ModelConfig or LRTConfig fields."""
  sd = (_load(state_dict_or_path) if isinstance(state_dict_or_path, str)
        else dict(state_dict_or_path))
  if "transformer.wte.weight" not in sd:
    raise ValueError("missing weight 'transformer.wte.weight' in the official state dict")
  cfg = config_from_official(config, int(np.shape(sd["transformer.wte.weight"])[0]),
                             **overrides)
  D, L, Vp = cfg.d_model, cfg.n_layers, cfg.padded_vocab
  q_dim, kv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
  C = (cfg.recurrence.gate_channels if cfg.recurrence else cfg.ve_gate_channels) or D
  h = lambda i, n: f"transformer.h.{i}.{n}.weight"
  stack = lambda f: np.stack([f(i) for i in range(L)])
  lin = lambda n, shape: stack(lambda i: _take(sd, h(i, n), shape).T)
  layers = {
      "attn": {"q": {"kernel": _rope_flip(cfg, lin("attn.c_q", (q_dim, D)))},
               "k": {"kernel": _rope_flip(cfg, lin("attn.c_k", (kv, D)))},
               "v": {"kernel": lin("attn.c_v", (kv, D))},
               "o": {"kernel": lin("attn.c_proj", (D, q_dim))}},
      "mlp": {"up": {"kernel": lin("mlp.c_fc", (cfg.d_ff, D))},
              "down": {"kernel": lin("mlp.c_proj", (D, cfg.d_ff))}},
  }
  if cfg.recurrence is not None:
    layers["memory"] = {
          "gamma": _take(sd, "interleaved_lambdas", (L,)),
          "gate": stack(lambda i: _take(sd, h(i, "attn.triple_gate"), (3 * cfg.n_kv_heads, C)).T),
          "w_v": stack(lambda i: _take(sd, f"interleaved_projections.{i}.W_v.weight", (kv, D)).T),
          "w_k": _rope_flip(cfg, stack(lambda i: _take(
              sd, f"interleaved_key_projections.{i}.W_v.weight", (kv, D)).T)),
          "ve": stack(lambda i: _take(sd, f"interleaved_init_value_embeds.{i}.weight", (Vp, kv))),
    }
  if cfg.resid_lambdas:
    layers["resid_lambda"] = _take(sd, "resid_lambdas", (L,))
  if cfg.x0_lambdas:
    layers["x0_lambda"] = _take(sd, "x0_lambdas", (L,))
  params = {"embed": {"embedding": _take(sd, "transformer.wte.weight", (Vp, D))},
            "lm_head": {"kernel": _take(sd, "lm_head.weight", (Vp, D)).T},
            "layers": layers}
  if cfg.value_embeds is not None:
    ve_layers = cfg.value_embed_layers
    params["value_embeds"] = {
        "embedding": np.stack([_take(sd, f"value_embeds.{i}.weight", (Vp, kv))
                               for i in ve_layers]),
        "gate": np.stack([_take(sd, h(i, "attn.ve_gate"), (cfg.n_kv_heads, C)).T
                          for i in ve_layers])}
  expected = set(to_official_lrt(cfg, params))
  extra = sorted(set(sd) - expected)
  if extra:
    raise ValueError(f"official state dict has weights we would ignore: {extra[:5]} "
                     f"({len(extra)} in all)")
  return cfg, params


def to_official_lrt(cfg: ModelConfig, tree) -> dict:
  """{official name: np.ndarray} of a tree shaped like our params (or its gradients)."""
  rcfg = cfg.recurrence
  if rcfg is not None and (not isinstance(rcfg, LRTConfig) or rcfg.projection != "layerwise"
                           or not (rcfg.residual and rcfg.key and rcfg.value and rcfg.value_embeds)
                           or rcfg.source_layer != -1):
    raise ValueError("to_official_lrt needs a model the release can hold: no recurrence, or "
                     "LRT with layerwise projections, every feedback path on, source_layer=-1")
  if cfg.norm_scale or cfg.mlp_type != "relu2" or cfg.tie_embeddings or not cfg.qk_norm:
    raise ValueError("to_official_lrt needs the nanochat backbone (norm_scale=False, "
                     "qk_norm, mlp_type='relu2', untied head)")
  a = lambda x: np.asarray(x, np.float32)
  lay = tree["layers"]
  out = {"transformer.wte.weight": a(tree["embed"]["embedding"]),
         "lm_head.weight": a(tree["lm_head"]["kernel"]).T}
  if cfg.resid_lambdas:
    out["resid_lambdas"] = a(lay["resid_lambda"])
  if cfg.x0_lambdas:
    out["x0_lambdas"] = a(lay["x0_lambda"])
  q = _rope_flip(cfg, a(lay["attn"]["q"]["kernel"]))
  k = _rope_flip(cfg, a(lay["attn"]["k"]["kernel"]))
  for j, i in enumerate(cfg.value_embed_layers):
    out[f"value_embeds.{i}.weight"] = a(tree["value_embeds"]["embedding"][j])
    out[f"transformer.h.{i}.attn.ve_gate.weight"] = a(tree["value_embeds"]["gate"][j]).T
  for i in range(cfg.n_layers):
    p = f"transformer.h.{i}."
    out[p + "attn.c_q.weight"] = q[i].T
    out[p + "attn.c_k.weight"] = k[i].T
    out[p + "attn.c_v.weight"] = a(lay["attn"]["v"]["kernel"][i]).T
    out[p + "attn.c_proj.weight"] = a(lay["attn"]["o"]["kernel"][i]).T
    out[p + "mlp.c_fc.weight"] = a(lay["mlp"]["up"]["kernel"][i]).T
    out[p + "mlp.c_proj.weight"] = a(lay["mlp"]["down"]["kernel"][i]).T
  if rcfg is None:
    return out
  out["interleaved_lambdas"] = a(lay["memory"]["gamma"])
  w_k = _rope_flip(cfg, a(lay["memory"]["w_k"]))
  for i in range(cfg.n_layers):
    out[f"transformer.h.{i}.attn.triple_gate.weight"] = a(lay["memory"]["gate"][i]).T
    out[f"interleaved_projections.{i}.W_v.weight"] = a(lay["memory"]["w_v"][i]).T
    out[f"interleaved_key_projections.{i}.W_v.weight"] = w_k[i].T
    out[f"interleaved_init_value_embeds.{i}.weight"] = a(lay["memory"]["ve"][i])
  return out


def official_schedule(config: Mapping[str, Any]) -> Optional[str]:
  """Our schedule (train.mode) for the one the release's config trains with; None for its
  plain GPT."""
  return next((mode for flag, mode in SCHEDULES.items() if config.get(flag, False)), None)


def schedule_of_mode(cfg: ModelConfig, mode: str) -> Optional[str]:
  """The release's schedule for a run trained with train.mode `mode` ("auto": the type's
  own); None without recurrence. A mode the release has not is refused."""
  if cfg.recurrence is None:
    return None
  mode = cfg.recurrence.default_schedule if mode == "auto" else mode
  if mode not in SCHEDULES.values():
    raise ValueError(f"train.mode={mode!r} has no counterpart in the official LRT release: "
                     f"give --schedule, allowed one of {tuple(SCHEDULES.values())}")
  return mode


def config_to_official(cfg: ModelConfig, schedule: Optional[str] = None) -> dict:
  """The release's (a133a67) GPTConfig keyword arguments for our config, its training
  schedule `schedule` (interleaved or multi_refine; LRT only). An LRT model writes
  use_value_embeds=True and ve_every_layer=False, the release's defaults (it ignores them
  under feedback)."""
  rec = cfg.recurrence
  allowed = tuple(SCHEDULES.values())
  if rec is None and schedule is not None:
    raise ValueError(f"schedule={schedule!r} is invalid for a model without recurrence: "
                     "allowed None")
  if rec is not None and schedule not in allowed:
    raise ValueError(f"schedule={schedule!r} is invalid: allowed one of {allowed}")
  opts = cfg.schedule_options
  flags = {flag: mode == schedule for flag, mode in SCHEDULES.items()}
  return {
      "sequence_len": cfg.max_seq_len, "vocab_size": cfg.vocab_size, "n_layer": cfg.n_layers,
      "n_head": cfg.n_heads, "n_kv_head": cfg.n_kv_heads, "n_embd": cfg.d_model,
      "window_pattern": cfg.window_pattern,
      "use_value_embeds": rec is not None or cfg.value_embeds is not None,
      "ve_every_layer": rec is None and cfg.value_embeds == "every",
      "use_x0_residual": bool(cfg.x0_lambdas), "use_resid_lambdas": bool(cfg.resid_lambdas),
      "ve_gate_channels": int(rec.gate_channels if rec is not None else cfg.ve_gate_channels),
      "use_interleaved": flags["use_interleaved"],
      "interleaved_num_passes": int(opts.passes),
      "interleaved_kv_refresh": bool(opts.kv_refresh),
      "use_multi_refine": flags["use_multi_refine"],
      "multi_refine_num_passes": int(opts.refine_passes),
      "multi_refine_detach": bool(opts.refine_detach),
      "multi_refine_loss_weights": [float(w) for w in opts.refine_weights],
  }


def _checkpoint_steps(directory: str) -> list[int]:
  names = glob.glob(os.path.join(directory, "model_*.pt"))
  return sorted(int(m.group(1)) for m in
                (re.fullmatch(r"model_(\d+)\.pt", os.path.basename(n)) for n in names) if m)


def load_official_checkpoint(directory: str, step: Optional[int] = None, **overrides):
  """(cfg, params, schedule, meta) of a release checkpoint directory (model_NNNNNN.pt and
  meta_NNNNNN.json; `step` None: the largest). torch.compile's `_orig_mod.` prefixes are
  dropped and bfloat16 weights read as float32, as the release's build_model does."""
  steps = _checkpoint_steps(directory) if os.path.isdir(directory) else []
  if not steps:
    raise ValueError(f"{directory!r} holds no release checkpoint (model_NNNNNN.pt with "
                     "meta_NNNNNN.json)")
  if step is None:
    step = steps[-1]
  if step not in steps:
    raise ValueError(f"step={step} is invalid: allowed one of {steps} (in {directory})")
  meta_path = os.path.join(directory, f"meta_{step:06d}.json")
  if not os.path.isfile(meta_path):
    raise ValueError(f"{meta_path} is missing: the release writes it beside model_{step:06d}.pt")
  with open(meta_path, encoding="utf-8") as f:
    meta = json.load(f)
  if "model_config" not in meta:
    raise ValueError(f"{meta_path} has no model_config")
  sd = load_state_dict(os.path.join(directory, f"model_{step:06d}.pt"))
  sd = {k.removeprefix("_orig_mod."): v for k, v in sd.items()}
  cfg, params = from_official_lrt(sd, meta["model_config"], **overrides)
  return cfg, params, official_schedule(meta["model_config"]), meta


def save_official_checkpoint(cfg: ModelConfig, params, directory: str, step: int,
                             schedule: Optional[str] = None, meta: Optional[dict] = None) -> str:
  """Write params as the release's checkpoint at `step` (model_NNNNNN.pt: float32 tensors;
  meta_NNNNNN.json: `meta` with model_config = config_to_official(cfg, schedule)); returns
  the model file's path. The release loads it with its checkpoint_manager.build_model."""
  import torch  # noqa: PLC0415  (optional: torch is no install requirement; .pt only)
  model_config = config_to_official(cfg, schedule)
  state = {k: torch.from_numpy(np.array(v, np.float32))      # (a writable copy)
           for k, v in to_official_lrt(cfg, params).items()}
  os.makedirs(directory, exist_ok=True)
  path = os.path.join(directory, f"model_{step:06d}.pt")
  torch.save(state, path)
  with open(os.path.join(directory, f"meta_{step:06d}.json"), "w", encoding="utf-8") as f:
    json.dump({**(meta or {"step": step}), "model_config": model_config}, f, indent=2)
  return path
