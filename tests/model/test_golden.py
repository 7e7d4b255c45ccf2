"""Our numbers against the official PyTorch release's outputs (tests/golden/, described in
tests/golden/README.md)."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import t2mlr_jax
from t2mlr_jax.convert.official import (
  MIXER,
  from_official,
  mixer_params_from_official,
  settings_from_official,
)
from t2mlr_jax.losses import cross_entropy, next_token_labels

from _util import TESTS_DIR

GOLDEN = os.environ.get("T2MLR_GOLDEN_DIR") or os.path.join(
    TESTS_DIR, "golden")
NPZ = os.path.join(GOLDEN, "t2mlr_official_small.npz")
TOL = 1e-5


@pytest.fixture(scope="module")
def golden():
  z = dict(np.load(NPZ))
  meta = json.load(open(os.path.join(GOLDEN, "t2mlr_official_small.json")))
  hf_config = {**meta["base_config"], "architectures": ["LlamaForCausalLM"]}
  state_dict = {k: v for k, v in z.items() if k.startswith("t2mlr_model.")}
  cfg, params = from_official(state_dict, hf_config, l_start=2, l_end=3)
  return z, cfg, params


def test_config_mapped(golden):
  _, cfg, params = golden
  assert (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_kv_heads) == (5, 48, 6, 3)
  assert cfg.rope_theta == 50000.0 and cfg.tie_embeddings
  assert cfg.span == (2, 3)
  assert float(params["recurrence"]["gamma_rec"]) == pytest.approx(0.9)


def test_parallel_and_exact(golden):
  z, cfg, params = golden
  ids = z["input_ids"]
  base = t2mlr_jax.forward(params, cfg, ids, mode="parallel")
  np.testing.assert_allclose(base, z["base_logits"], atol=TOL, rtol=0)
  for case in "AB":
    cf = z[f"control_flows_{case}"]
    logits = t2mlr_jax.forward(params, cfg, ids, mode="exact", control_flow=cf)
    np.testing.assert_allclose(logits, z[f"exact_logits_{case}"], atol=TOL, rtol=0)


@pytest.mark.parametrize("case", "AB")
@pytest.mark.parametrize("d_f,d_b", [(1, 1), (3, 2), (16, 4)])
def test_jacobi_logits(golden, case, d_f, d_b):
  z, cfg, params = golden
  logits = t2mlr_jax.forward(params, cfg, z["input_ids"], mode="jacobi",
                             control_flow=z[f"control_flows_{case}"], d_forward=d_f, d_backward=d_b)
  np.testing.assert_allclose(logits, z[f"jacobi_logits_{case}_Df{d_f}_Db{d_b}"], atol=TOL, rtol=0)


def _official_name_grads(grads, cfg):
  """Our gradient tree under the official parameter names (transposed back to out x in)."""
  out = _base_grads(grads, cfg)
  base = "t2mlr_model.model."
  start, _ = cfg.span
  mix = f"{base}layers.{start}.t2mlr_mixing_module."
  r = grads["recurrence"]
  out[mix + "rezero_gamma_recurrent_gate"] = r["gamma_rec"].reshape(1)
  out[mix + "rezero_gamma_input_gate"] = r["gamma_cur"].reshape(1)
  out[mix + "recurrent_projection.weight"] = r["w_rec"]["kernel"].T
  out[mix + "recurrent_gate_proj.weight"] = r["f_rec"]["kernel"].T
  out[mix + "recurrent_gate_proj.bias"] = r["f_rec"]["bias"]
  out[mix + "input_gate_proj.weight"] = r["f_cur"]["kernel"].T
  out[mix + "input_gate_proj.bias"] = r["f_cur"]["bias"]
  return out


def _base_grads(grads, cfg):
  """The base model's part of `_official_name_grads`."""
  out = {}
  base = "t2mlr_model.model."
  start, _ = cfg.span
  lin = {("attn", "q"): "self_attn.q_proj", ("attn", "k"): "self_attn.k_proj",
         ("attn", "v"): "self_attn.v_proj", ("attn", "o"): "self_attn.o_proj",
         ("mlp", "gate"): "mlp.gate_proj", ("mlp", "up"): "mlp.up_proj",
         ("mlp", "down"): "mlp.down_proj"}
  for i in range(cfg.n_layers):
    pre = f"{base}layers.{i}.model." if i == start else f"{base}layers.{i}."
    for (g, n), hf in lin.items():
      out[f"{pre}{hf}.weight"] = grads["layers"][g][n]["kernel"][i].T
    out[f"{pre}input_layernorm.weight"] = grads["layers"]["attn_norm"]["scale"][i]
    out[f"{pre}post_attention_layernorm.weight"] = grads["layers"]["mlp_norm"]["scale"][i]
  out[f"{base}embed_tokens.weight"] = grads["embed"]["embedding"]
  out[f"{base}norm.weight"] = grads["final_norm"]["scale"]
  return out


@pytest.mark.parametrize("case,d_f,d_b", [pytest.param("A", 4, 2, marks=pytest.mark.slow),
                                          pytest.param("A", 4, 4, marks=pytest.mark.slow),
                                          ("A", 16, 4), ("B", 4, 2)])
def test_loss_and_gradients(golden, case, d_f, d_b):
  z, cfg, params = golden
  ids = jnp.asarray(z["input_ids"])
  cf = z[f"control_flows_{case}"]

  def loss_fn(p):
    logits = t2mlr_jax.forward(p, cfg, ids, mode="jacobi", control_flow=cf,
                               d_forward=d_f, d_backward=d_b)
    return cross_entropy(logits, next_token_labels(ids))[0]

  loss, grads = jax.value_and_grad(loss_fn)(params)
  tag = f"{case}_Df{d_f}_Db{d_b}"
  np.testing.assert_allclose(loss, z[f"loss_{tag}"], atol=TOL, rtol=0)
  np.testing.assert_allclose(grads["recurrence"]["gamma_rec"], z[f"grad_gamma_rec_{tag}"][0], atol=TOL)
  np.testing.assert_allclose(grads["recurrence"]["gamma_cur"], z[f"grad_gamma_cur_{tag}"][0], atol=TOL)
  np.testing.assert_allclose(grads["recurrence"]["w_rec"]["kernel"].T,
                             z[f"grad_recurrent_projection_weight_{tag}"], atol=TOL)
  full = [k for k in z if k.startswith(f"gradall_{tag}.")]
  if full:
    ours = _official_name_grads(grads, cfg)
    assert len(full) == len(ours)
    for key in full:
      np.testing.assert_allclose(ours[key.split(".", 1)[1]], z[key], atol=TOL, rtol=0, err_msg=key)


def test_generate(golden):
  z, cfg, params = golden
  tokens, logits = t2mlr_jax.generate(params, cfg, z["generate_prompt"], max_new_tokens=6,
                                      prompt_control_flow=1, return_logits=True)
  P = z["generate_prompt"].shape[1]
  np.testing.assert_array_equal(tokens, z["generate_sequences"][:, P:])
  np.testing.assert_allclose(logits, z["generate_step_logits"], atol=TOL, rtol=0)
  plain = t2mlr_jax.generate(params, cfg.replace(recurrence=None), z["generate_prompt"],
                             max_new_tokens=6)
  np.testing.assert_array_equal(plain, z["generate_sequences_plain_base"][:, P:])


# ---------------------------------------------------------------- the release's options

OPTIONS = os.path.join(GOLDEN, "options_official_small")
OPTION_META = json.load(open(OPTIONS + ".json"))


@pytest.fixture(scope="module")
def option_arrays():
  return dict(np.load(OPTIONS + ".npz"))


def test_the_release_settings_of_the_goldens_map_to_the_paper_config(golden):
  """The S5 settings the first goldens were made with read as our defaults (the cache
  residual, detached, clipped RMS; the gated mixer), and compute the same logits."""
  z, cfg, _ = golden
  meta = json.load(open(os.path.join(GOLDEN, "t2mlr_official_small.json")))
  fields = settings_from_official(meta["t2mlr_settings"])
  assert fields["mixer"] == "gated" and fields["cache_norm"] == "clipped_rms"
  assert fields["residual"] and fields["residual_detach"] and not fields["connection_detach"]
  state_dict = {k: v for k, v in z.items() if k.startswith("t2mlr_model.")}
  mapped, params = from_official(state_dict, {**meta["base_config"], "architectures": [
      "LlamaForCausalLM"]}, l_start=2, l_end=3, **fields)
  logits = t2mlr_jax.forward(params, mapped, z["input_ids"], mode="exact",
                             control_flow=z["control_flows_B"])
  np.testing.assert_allclose(logits, z["exact_logits_B"], atol=TOL, rtol=0)


DEFAULT_SUITE_CASES = ("connection_detach", "residual_weighted", "skip_to_l_end")   # the rest: slow


@pytest.mark.parametrize("case", [c if c in DEFAULT_SUITE_CASES else pytest.param(
    c, marks=pytest.mark.slow) for c in sorted(OPTION_META["cases"])])
def test_each_release_option_equals_the_release(option_arrays, case):
  """The release's wrapper under one option (its settings read by settings_from_official):
  exact logits, Jacobi logits at two depths, the Jacobi loss and every gradient."""
  z, meta = option_arrays, OPTION_META
  sd = {k.split("/param/", 1)[1]: v for k, v in z.items()
        if k.startswith((f"{case}/param/", "base/param/"))}
  fields = settings_from_official(meta["cases"][case])
  cfg, params = from_official(sd, {**meta["base_config"], "architectures": [
      "LlamaForCausalLM"]}, l_start=meta["l_start"], l_end=meta["l_end"], **fields)
  ids, cf = jnp.asarray(z["input_ids"]), z["control_flows"]
  scale = np.abs(z[f"{case}/exact_logits"]).max()
  exact = t2mlr_jax.forward(params, cfg, ids, mode="exact", control_flow=cf)
  np.testing.assert_allclose(exact, z[f"{case}/exact_logits"], atol=TOL * scale, rtol=0)
  for d_f, d_b in meta["depths"]:
    logits = t2mlr_jax.forward(params, cfg, ids, mode="jacobi", control_flow=cf,
                               d_forward=d_f, d_backward=d_b)
    np.testing.assert_allclose(logits, z[f"{case}/jacobi_logits_Df{d_f}_Db{d_b}"],
                               atol=TOL * scale, rtol=0, err_msg=f"D_f={d_f}")
  d_f, d_b = meta["grad_depth"]

  def loss_fn(p):
    logits = t2mlr_jax.forward(p, cfg, ids, mode="jacobi", control_flow=cf, d_forward=d_f,
                               d_backward=d_b)
    return cross_entropy(logits, next_token_labels(ids))[0]

  loss, grads = jax.value_and_grad(loss_fn)(params)
  np.testing.assert_allclose(loss, z[f"{case}/loss"], atol=TOL, rtol=0)
  theirs = {k.split("/", 2)[2]: v for k, v in z.items()
            if k.startswith((f"{case}/grad/", f"{case}/grad_sums/"))}
  for key, ours in _base_grads(grads, cfg).items():
    ours = np.asarray(ours)
    if ours.ndim == 2:                  # stored as its row and column sums
      ours = np.concatenate([ours.sum(1), ours.sum(0)])
    np.testing.assert_allclose(ours, theirs[key], atol=TOL * max(1.0, np.abs(theirs[key]).max()),
                               rtol=0, err_msg=key)
  mix = f"t2mlr_model.model.layers.{cfg.span[0]}.{MIXER}"
  their_mixer = {k[len(mix):]: theirs.get(k, np.zeros_like(v)) for k, v in sd.items()
                 if k.startswith(mix)}           # a weight the options leave unused: no grad
  want = mixer_params_from_official(their_mixer, cfg.recurrence, cfg.d_model)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=TOL * max(
      1.0, np.abs(b).max()), rtol=0), dict(grads["recurrence"]), want)
