"""Hugging Face Llama-family layout <-> ours: config.json fields and weight names.

Handles LlamaForCausalLM (SmolLM2, Llama 3.x with `llama3` RoPE scaling) and
Qwen2ForCausalLM (q/k/v biases), config.json in both the transformers 4.x form
(`rope_theta`, `rope_scaling`) and the 5.x form (`rope_parameters`). Anything
we would silently compute differently is refused with a ValueError.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from safetensors import safe_open
from safetensors.flax import save_file

from t2mlr_jax.config import ModelConfig, RopeScaling, split_schedule_options
from t2mlr_jax.model import recurrence as rec
from t2mlr_jax.model.recurrence.t2mlr import T2MLRConfig
from t2mlr_jax.model.transformer import init_params

ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM")
_MODEL_FIELDS = {f.name for f in dataclasses.fields(ModelConfig)}
_T2MLR_FIELDS = {f.name for f in dataclasses.fields(T2MLRConfig)}


def _rope_from_hf(hf: Mapping[str, Any]):
  """(rope_theta, RopeScaling | None) from a 4.x or 5.x config.json."""
  params = hf.get("rope_parameters")
  scaling = hf.get("rope_scaling")
  theta = hf.get("rope_theta")
  if params is not None:     # transformers 5.x: one dict holds theta and the type
    theta = params.get("rope_theta", theta)
    scaling = params if params.get("rope_type", "default") != "default" else None
  if theta is None:
    theta = 10000.0
  if scaling is None:
    return float(theta), None
  rope_type = scaling.get("rope_type", scaling.get("type"))
  if rope_type == "default":
    return float(theta), None
  if rope_type != "llama3":
    raise ValueError(f"rope_scaling type {rope_type!r} is not supported: allowed 'default' "
                     "or 'llama3' (refusing to load with wrong positions)")
  return float(theta), RopeScaling(
      rope_type="llama3", factor=float(scaling["factor"]),
      low_freq_factor=float(scaling["low_freq_factor"]),
      high_freq_factor=float(scaling["high_freq_factor"]),
      original_max_position_embeddings=int(scaling["original_max_position_embeddings"]))


def config_from_hf(hf: Mapping[str, Any], **overrides) -> ModelConfig:
  """A ModelConfig from a config.json dict. `overrides` set ModelConfig fields
  (e.g. rope_theta=None for NoPE) or, via recurrence=..., the recurrence."""
  archs = hf.get("architectures") or ["LlamaForCausalLM"]
  arch = archs[0]
  if arch not in ARCHITECTURES:
    raise ValueError(f"architecture {arch!r} is not supported: allowed {ARCHITECTURES}")
  act = hf.get("hidden_act", "silu")
  if act != "silu":
    raise ValueError(f"hidden_act={act!r} is not supported: allowed 'silu' (SwiGLU)")
  if hf.get("mlp_bias", False):
    raise ValueError("mlp_bias=True is not supported: allowed False")
  if arch == "Qwen2ForCausalLM" and hf.get("use_sliding_window", False):
    raise ValueError("use_sliding_window=True is not supported: allowed False")
  theta, scaling = _rope_from_hf(hf)
  D = hf["hidden_size"]
  n_heads = hf["num_attention_heads"]
  fields = dict(
      vocab_size=hf["vocab_size"], d_model=D, n_layers=hf["num_hidden_layers"],
      n_heads=n_heads, n_kv_heads=hf.get("num_key_value_heads") or n_heads,
      d_ff=hf["intermediate_size"], head_dim=hf.get("head_dim") or D // n_heads,
      max_seq_len=hf.get("max_position_embeddings", 2048), rope_theta=theta,
      rope_scaling=scaling, rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
      tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
      qkv_bias=True if arch == "Qwen2ForCausalLM" else bool(hf.get("attention_bias", False)),
  )
  unknown = sorted(set(overrides) - _MODEL_FIELDS)
  if unknown:
    raise ValueError(f"unknown override(s) {unknown}: allowed ModelConfig fields "
                     f"{sorted(_MODEL_FIELDS)}")
  return ModelConfig(**{**fields, **overrides})


def config_to_hf(cfg: ModelConfig) -> dict:
  """The config.json of the base model (LlamaForCausalLM, or Qwen2 with q/k/v bias)."""
  if cfg.rope_theta is None:
    raise ValueError("rope_theta=None (NoPE) has no Hugging Face Llama equivalent")
  arch = "Qwen2ForCausalLM" if cfg.qkv_bias else "LlamaForCausalLM"
  out = dict(
      architectures=[arch], model_type="qwen2" if cfg.qkv_bias else "llama",
      vocab_size=cfg.vocab_size, hidden_size=cfg.d_model,
      num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
      num_key_value_heads=cfg.n_kv_heads, intermediate_size=cfg.d_ff,
      head_dim=cfg.head_dim, max_position_embeddings=cfg.max_seq_len,
      rope_theta=cfg.rope_theta, rms_norm_eps=cfg.rms_norm_eps,
      tie_word_embeddings=cfg.tie_embeddings, hidden_act="silu",
      attention_bias=cfg.qkv_bias, mlp_bias=False, torch_dtype="float32")
  if cfg.rope_scaling is not None:
    out["rope_scaling"] = dataclasses.asdict(cfg.rope_scaling)
  return out


def to_numpy(value) -> np.ndarray:
  """A torch tensor (any float dtype, incl. bf16) or array-like as a float32/int numpy array."""
  if hasattr(value, "detach"):     # torch.Tensor without importing torch
    value = value.detach().cpu()
    if value.is_floating_point():
      value = value.float()
    return value.numpy()
  arr = np.asarray(value)
  return arr.astype(np.float32) if arr.dtype.kind == "f" or arr.dtype.name == "bfloat16" else arr


_LINEARS = {("attn", "q"): "self_attn.q_proj", ("attn", "k"): "self_attn.k_proj",
            ("attn", "v"): "self_attn.v_proj", ("attn", "o"): "self_attn.o_proj",
            ("mlp", "gate"): "mlp.gate_proj", ("mlp", "up"): "mlp.up_proj",
            ("mlp", "down"): "mlp.down_proj"}
_NORMS = {"attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm"}


def _take(sd: Mapping[str, Any], key: str) -> np.ndarray:
  if key not in sd:
    raise ValueError(f"missing weight {key!r} in the state dict")
  return to_numpy(sd[key])


def base_params_from_state_dict(sd: Mapping[str, Any], cfg: ModelConfig,
                                layer_key=lambda i: f"model.layers.{i}.",
                                prefix: str = "model.", lm_head_key: str = "lm_head.weight"):
  """Our stacked parameter tree (without recurrence) from HF-named weights.

  layer_key(i) gives the name prefix of layer i (the official T2MLR wrapper
  moves layer l_start under `.model.`). Shapes are checked against cfg.
  """
  layers: dict = {"attn": {}, "mlp": {}}
  for (group, name), hf_name in _LINEARS.items():
    kernels = [_take(sd, f"{layer_key(i)}{hf_name}.weight").T for i in range(cfg.n_layers)]
    layers[group][name] = {"kernel": np.stack(kernels)}
    if group == "attn" and name != "o" and cfg.qkv_bias:
      layers[group][name]["bias"] = np.stack(
          [_take(sd, f"{layer_key(i)}{hf_name}.bias") for i in range(cfg.n_layers)])
  for ours, hf_name in _NORMS.items():
    layers[ours] = {"scale": np.stack(
        [_take(sd, f"{layer_key(i)}{hf_name}.weight") for i in range(cfg.n_layers)])}
  params = {"embed": {"embedding": _take(sd, f"{prefix}embed_tokens.weight")},
            "layers": layers,
            "final_norm": {"scale": _take(sd, f"{prefix}norm.weight")}}
  if not cfg.tie_embeddings:
    params["lm_head"] = {"kernel": _take(sd, lm_head_key).T}
  check_shapes(params, cfg)
  return params


def check_shapes(params, cfg: ModelConfig):
  """Every base weight has the shape cfg implies (clear error instead of wrong numbers)."""
  expected = jax.eval_shape(lambda: init_params(cfg.replace(recurrence=None),
                                                jax.random.PRNGKey(0)))
  flat_exp = dict(jax.tree_util.tree_flatten_with_path(expected)[0])
  flat_got = dict(jax.tree_util.tree_flatten_with_path(
      {k: v for k, v in params.items() if k != "recurrence"})[0])
  name = lambda path: "/".join(str(getattr(p, "key", p)) for p in path)
  if set(map(name, flat_exp)) != set(map(name, flat_got)):
    missing = sorted(set(map(name, flat_exp)) - set(map(name, flat_got)))
    extra = sorted(set(map(name, flat_got)) - set(map(name, flat_exp)))
    raise ValueError(f"parameter tree mismatch: missing {missing}, unexpected {extra}")
  for path, leaf in flat_exp.items():
    got = flat_got[path]
    if tuple(got.shape) != tuple(leaf.shape):
      raise ValueError(f"weight {name(path)} has shape {tuple(got.shape)}, the config "
                       f"implies {tuple(leaf.shape)}")


# ------------------------------------------------------------------ directories

WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
RECURRENCE_WEIGHTS = "t2mlr_recurrence.safetensors"
RECURRENCE_CONFIG = "t2mlr_config.json"
# Keys of RECURRENCE_WEIGHTS (PyTorch layout: Linear weights are [out, in]).
RECURRENCE_KEYS = {
    "t2mlr.w_rec.weight": ("w_rec", "kernel"),      # [H, H], r = W_rec R
    "t2mlr.f_rec.weight": ("f_rec", "kernel"),      # [H, 2H] over concat(h, W_rec R)
    "t2mlr.f_rec.bias": ("f_rec", "bias"),          # [H]
    "t2mlr.f_cur.weight": ("f_cur", "kernel"),      # [H, 2H]
    "t2mlr.f_cur.bias": ("f_cur", "bias"),          # [H]
    "t2mlr.gamma_rec": ("gamma_rec",),              # [] raw γ (Φ uses tanh γ)
    "t2mlr.gamma_cur": ("gamma_cur",),              # []
    "t2mlr.cache_norm.weight": ("cache_norm", "scale"),   # [H], only with cache_norm="rmsnorm"
}
_IGNORED = ("rotary_emb.inv_freq",)


def _read_safetensors(path: str) -> dict:
  """All tensors of one .safetensors file as float32/int numpy arrays (bf16 included)."""
  if not os.path.isfile(path):
    raise ValueError(f"weights file {path!r} is missing")
  try:
    out = {}
    with safe_open(path, framework="flax") as f:
      for key in f.keys():
        out[key] = to_numpy(f.get_tensor(key))
    return out
  except ValueError:
    raise
  except Exception as e:   # truncated / corrupt header or data
    raise ValueError(f"cannot read safetensors file {path!r} (corrupt or truncated?): {e}") from e


def read_hf_state_dict(path: str) -> dict:
  """The weights of an HF directory: model.safetensors, or shards listed in the index."""
  index = os.path.join(path, WEIGHTS_INDEX)
  if os.path.isfile(index):
    with open(index) as f:
      weight_map = json.load(f).get("weight_map")
    if not weight_map:
      raise ValueError(f"{index} has no weight_map")
    sd = {}
    for shard in sorted(set(weight_map.values())):
      sd.update(_read_safetensors(os.path.join(path, shard)))
    missing = sorted(set(weight_map) - set(sd))
    if missing:
      raise ValueError(f"{index} lists tensors missing from its shards: {missing[:5]}")
    return sd
  single = os.path.join(path, WEIGHTS)
  if not os.path.isfile(single):
    raise ValueError(f"{path!r} has neither {WEIGHTS} nor {WEIGHTS_INDEX} "
                     "(only safetensors checkpoints are read)")
  return _read_safetensors(single)


def _check_unused(sd: Mapping[str, Any], cfg: ModelConfig) -> None:
  """Refuse weights we would silently ignore (e.g. more layers than config.json says)."""
  used = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
  for i in range(cfg.n_layers):
    for hf_name in list(_LINEARS.values()) + list(_NORMS.values()):
      used.add(f"model.layers.{i}.{hf_name}.weight")
      used.add(f"model.layers.{i}.{hf_name}.bias")
  extra = sorted(k for k in sd if k not in used and not k.endswith(_IGNORED))
  if extra:
    raise ValueError(f"the checkpoint has weights this config does not use: {extra[:5]}"
                     f"{' ...' if len(extra) > 5 else ''}")


def from_hf(path: str, *, recurrence=None, seed: int = 0, **overrides):
  """(ModelConfig, params) from a local Hugging Face directory (config.json + safetensors).

  With `recurrence` (a type that declares `retrofit`: T2MLR, LRT with init="identity", a
  user's), it is added with fresh parameters that keep the pretrained function exactly
  (T2MLR: γ = 0); if the directory holds t2mlr_recurrence.safetensors (written by `to_hf`)
  and `recurrence` is T2MLR, those weights are used instead. `overrides` set ModelConfig
  fields.
  """
  recurrence = check_retrofit(recurrence, "from_hf")
  cfg_path = os.path.join(path, "config.json")
  if not os.path.isfile(cfg_path):
    raise ValueError(f"{path!r} has no config.json: not a Hugging Face model directory")
  with open(cfg_path) as f:
    hf_config = json.load(f)
  rec_path = os.path.join(path, RECURRENCE_CONFIG)
  if recurrence is None and os.path.isfile(rec_path):
    with open(rec_path) as f:
      saved = json.load(f)
    # the schedule options: their own key, or (exports written before they moved to their
    # schedules) beside the type's fields
    options = saved.pop("schedule_options", {})
    fields, moved = split_schedule_options({"type": T2MLRConfig.type, **saved})
    fields.pop("type")
    recurrence = T2MLRConfig(**fields)
    overrides.setdefault("schedule_options", {**moved, **options})
  cfg = config_from_hf(hf_config, recurrence=recurrence, **overrides)
  sd = read_hf_state_dict(path)
  _check_unused(sd, cfg)
  params = base_params_from_state_dict(sd, cfg)
  weights = os.path.join(path, RECURRENCE_WEIGHTS)
  if isinstance(cfg.recurrence, T2MLRConfig) and os.path.isfile(weights):
    params["recurrence"] = recurrence_from_state_dict(_read_safetensors(weights), cfg)
    return cfg, params
  return cfg, retrofit(cfg, params, seed)


def recurrence_from_state_dict(sd: Mapping[str, Any], cfg: ModelConfig) -> dict:
  """Our T2MLR parameter tree from t2mlr_recurrence.safetensors' tensors (the layout of
  RECURRENCE_KEYS; kernels stored [out, in] as torch does)."""
  out: dict = {}
  for key, where in RECURRENCE_KEYS.items():
    if key not in sd:
      if where[0] == "cache_norm" and cfg.recurrence.cache_norm != "rmsnorm":
        continue
      raise ValueError(f"missing recurrence weight {key!r}")
    value = to_numpy(sd[key])
    value = value.T if where[-1] == "kernel" else value
    node = out
    for k in where[:-1]:
      node = node.setdefault(k, {})
    node[where[-1]] = value.reshape(()) if where[0].startswith("gamma") else value
  return out


def _hf_state_dict(cfg: ModelConfig, params) -> dict:
  sd = {"model.embed_tokens.weight": params["embed"]["embedding"],
        "model.norm.weight": params["final_norm"]["scale"]}
  layers = params["layers"]
  for i in range(cfg.n_layers):
    for (group, name), hf_name in _LINEARS.items():
      sd[f"model.layers.{i}.{hf_name}.weight"] = layers[group][name]["kernel"][i].T
      if "bias" in layers[group][name]:
        sd[f"model.layers.{i}.{hf_name}.bias"] = layers[group][name]["bias"][i]
    for ours, hf_name in _NORMS.items():
      sd[f"model.layers.{i}.{hf_name}.weight"] = layers[ours]["scale"][i]
  if not cfg.tie_embeddings:
    sd["lm_head.weight"] = params["lm_head"]["kernel"].T
  return sd


def _write_atomically(path: str, write) -> None:
  """`write(tmp)` then rename onto `path`: an interrupted export leaves no partial file
  under a name a loader reads."""
  tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.partial")
  try:
    write(tmp)
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


def _save_safetensors(tensors: dict, path: str, dtype: str) -> None:
  target = jnp.bfloat16 if dtype == "bfloat16" else jnp.float32
  _write_atomically(path, lambda tmp: save_file(
      {k: jnp.asarray(np.ascontiguousarray(v)).astype(target) for k, v in tensors.items()},
      tmp))


def _save_json(obj, path: str) -> None:
  def write(tmp):
    with open(tmp, "w") as f:
      json.dump(obj, f, indent=2)
  _write_atomically(path, write)


# Backbone options a Llama config.json cannot express, with the value it implies.
LLAMA_DEFAULTS = {"norm_scale": True, "embed_norm": False, "qk_norm": False,
                  "mlp_type": "swiglu", "logit_softcap": None, "resid_lambdas": False,
                  "x0_lambdas": False, "window_pattern": None, "value_embeds": None}


def check_recurrence_type(recurrence, where: str) -> None:
  """Only T2MLR has a Hugging Face layout (RECURRENCE_KEYS, t2mlr_recurrence.safetensors):
  a model with another type is saved with checkpoint.export."""
  if recurrence is not None and not isinstance(recurrence, T2MLRConfig):
    raise ValueError(f"{where}: recurrence={type(recurrence).__name__} is invalid: allowed "
                     "None or a T2MLRConfig (a model with another recurrence type is saved "
                     "with checkpoint.export)")


def check_retrofit(recurrence, where: str):
  """The recurrence config to add to a pretrained model (None: none), as its type's
  `retrofit` declaration gives it; a type without one, or a config whose fresh init would
  change the pretrained function, is refused (before any weight is read)."""
  if recurrence is None:
    return None
  entry = rec.RECURRENCES.get(type(recurrence).type, "recurrence.type")
  name = type(recurrence).__name__
  if entry.retrofit is None:
    able = [t.name for t in rec.RECURRENCES.values() if t.retrofit is not None]
    raise ValueError(f"{where}: recurrence={name} is invalid: allowed None or a type that "
                     f"declares how it is added to a pretrained model (retrofit): {able}")
  try:
    return entry.retrofit(recurrence)
  except ValueError as e:
    raise ValueError(f"{where}: recurrence={name} is invalid: {e}") from None


def _flat(tree) -> dict:
  """{path of names: leaf} of a parameter tree."""
  key = lambda k: str(getattr(k, "key", getattr(k, "name", k)))
  return {tuple(map(key, path)): leaf
          for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _nested(flat: dict) -> dict:
  """The parameter tree of `_flat`'s {path: leaf}."""
  out: dict = {}
  for path, leaf in flat.items():
    node = out
    for k in path[:-1]:
      node = node.setdefault(k, {})
    node[path[-1]] = leaf
  return out


def split_base(params, cfg: ModelConfig) -> tuple[dict, dict]:
  """(the base model's parameters, the rest as {path: leaf}): the leaves a model without
  cfg's recurrence has, and those its recurrence added (its own, its layers')."""
  base = set(_flat(jax.eval_shape(lambda: init_params(cfg.replace(recurrence=None),
                                                      jax.random.PRNGKey(0)))))
  flat = _flat(params)
  return (_nested({p: v for p, v in flat.items() if p in base}),
          {p: v for p, v in flat.items() if p not in base})


def retrofit(cfg: ModelConfig, base, seed: int = 0):
  """A pretrained model's parameters `base` with cfg's recurrence added: each leaf of a
  fresh init (`init_params(cfg)`) that `base` lacks. cfg.recurrence is what `check_retrofit`
  returned, so the model computes the pretrained function until it trains."""
  if cfg.recurrence is None:
    return base
  have = set(_flat(base))
  fresh = jax.jit(lambda r: {"/".join(p): v for p, v in _flat(init_params(cfg, r)).items()
                             if p not in have})(jax.random.PRNGKey(seed))
  return _nested({**_flat(base), **{tuple(p.split("/")): v
                                    for p, v in jax.device_get(fresh).items()}})


def check_llama_compatible(cfg: ModelConfig) -> None:
  """Refuse models whose function a Llama config.json would not reproduce (before
  anything is read or written: a refused export leaves no directory behind)."""
  config_to_hf(cfg)                      # raises what config.json cannot state (NoPE)
  differ = {k: getattr(cfg, k) for k, v in LLAMA_DEFAULTS.items() if getattr(cfg, k) != v}
  if differ:
    raise ValueError(f"to_hf: this model sets {differ}, which a Hugging Face Llama config "
                     f"cannot express (allowed {({k: LLAMA_DEFAULTS[k] for k in differ})}); "
                     "save it with checkpoint.export instead")
  check_recurrence_type(cfg.recurrence, "to_hf")


def to_hf(cfg: ModelConfig, params, path: str, *, dtype: str = "float32",
          tokenizer=None) -> None:
  """Write an HF directory: config.json + model.safetensors (the base model, loadable by
  `AutoModelForCausalLM.from_pretrained`), and for T2MLR models
  t2mlr_recurrence.safetensors (RECURRENCE_KEYS layout) + t2mlr_config.json.
  `tokenizer` (an HFTokenizer, e.g. from_gguf's): tokenizer.json and
  tokenizer_config.json are written too, and config.json names its BOS / EOS / PAD ids
  (what transformers' generate stops at), so the directory is a complete HF model.

  Each file is written under a temporary name and renamed, config.json last: a directory
  with a config.json holds the whole export."""
  if dtype not in ("float32", "bfloat16"):
    raise ValueError(f"dtype={dtype!r} is invalid: allowed 'float32' or 'bfloat16'")
  check_llama_compatible(cfg)
  params = jax.device_get(params)
  os.makedirs(path, exist_ok=True)
  hf_config = config_to_hf(cfg)
  hf_config["torch_dtype"] = dtype
  if tokenizer is not None:
    if not hasattr(tokenizer, "save"):
      raise ValueError(f"tokenizer={type(tokenizer).__name__} is invalid: allowed None or "
                       "an HFTokenizer (t2mlr_jax.data.tokenizer.load_tokenizer)")
    tokenizer.save(path)
    for name in ("bos", "eos", "pad"):
      token_id = getattr(tokenizer, f"{name}_id", None)
      if token_id is not None:
        hf_config[f"{name}_token_id"] = int(token_id)
  _save_safetensors(_hf_state_dict(cfg, params), os.path.join(path, WEIGHTS), dtype)
  if cfg.recurrence is not None:
    rec = params["recurrence"]
    tensors = {}
    for key, where in RECURRENCE_KEYS.items():
      node = rec
      try:
        for k in where:
          node = node[k]
      except KeyError:
        continue
      node = np.asarray(node)
      tensors[key] = node.T if where[-1] == "kernel" else node
    _save_safetensors(tensors, os.path.join(path, RECURRENCE_WEIGHTS), "float32")
    _save_json({**dataclasses.asdict(cfg.recurrence),
                "schedule_options": cfg.schedule_options.to_dict()},
               os.path.join(path, RECURRENCE_CONFIG))
  _save_json(hf_config, os.path.join(path, "config.json"))
