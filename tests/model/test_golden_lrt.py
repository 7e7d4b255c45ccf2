"""Our LRT against the official release's outputs (tests/golden/lrt_official_small.*):
the full pass, the true sequential recurrence, interleaved training (loss, per-pass
losses, merged logits, h_final, every gradient by official name), and the K/V refresh.
Tolerances from tests/golden/README.md."""

import json
import os

import jax
import numpy as np
import pytest

import t2mlr_jax
from t2mlr_jax.convert.official_lrt import from_official_lrt, to_official_lrt

from _util import TESTS_DIR

GOLDEN = os.environ.get("T2MLR_GOLDEN_DIR") or os.path.join(
    TESTS_DIR, "golden")
LOGITS, LOSS = 2e-5, 1e-5


@pytest.fixture(scope="module")
def golden():
  z = dict(np.load(os.path.join(GOLDEN, "lrt_official_small.npz")))
  meta = json.load(open(os.path.join(GOLDEN, "lrt_official_small.json")))
  names = [e["name"] for e in meta["state_dict"]]
  cfg, params = from_official_lrt({n: z[n] for n in names}, meta["gpt_config"],
                                  rope_table_dtype="float32")   # the main arrays' table
  return z, meta, cfg, params


def _loss(params, cfg, z, **kw):
  return t2mlr_jax.loss(params, cfg, z["tokens"], mode="interleaved", targets=z["targets"],
                        return_aux=True, **kw)


def _grad_close(ours, ref, name):
  scale = float(np.max(np.abs(ref)))
  err = float(np.max(np.abs(np.asarray(ours, np.float64) - ref)))
  assert err <= 5e-5 * scale + 1e-12, f"{name}: max|Δg| {err:.3g} > 5e-5 · {scale:.3g}"


def test_config_and_round_trip(golden):
  z, meta, cfg, params = golden
  assert cfg.padded_vocab == 64 and cfg.vocab_size == 61
  assert cfg.layer_windows == (8, 8, 8, 16)
  back = to_official_lrt(cfg, params)
  assert set(back) == {e["name"] for e in meta["state_dict"]}
  for name, a in back.items():
    np.testing.assert_array_equal(a, z[name], err_msg=name)


def test_full_pass_and_sequential(golden):
  z, _, cfg, params = golden
  full = t2mlr_jax.forward(params, cfg, z["tokens"], mode="parallel")
  np.testing.assert_allclose(full, z["full/logits"], atol=LOGITS, rtol=0)
  seq = t2mlr_jax.forward(params, cfg, z["tokens"], mode="exact")
  np.testing.assert_allclose(seq, z["seq/logits"], atol=LOGITS, rtol=0)
  assert float(np.max(np.abs(seq - full))) > 0.5       # the recurrence matters here


@pytest.mark.parametrize("refresh", [False, True])
def test_interleaved_loss_and_merged_logits(golden, refresh):
  z, _, cfg, params = golden
  tag = "interleaved_kvrefresh" if refresh else "interleaved"
  value, aux = _loss(params, cfg, z, kv_refresh=refresh)
  np.testing.assert_allclose(value, z[f"{tag}/loss"], atol=LOSS, rtol=0)
  np.testing.assert_allclose(aux["per_pass_losses"], z[f"{tag}/per_pass_losses"], atol=LOSS)
  merged, faux = t2mlr_jax.forward(params, cfg, z["tokens"], mode="interleaved",
                                   kv_refresh=refresh, return_aux=True)
  np.testing.assert_allclose(merged, z[f"{tag}/merged_logits"], atol=LOGITS, rtol=0)
  np.testing.assert_allclose(faux["pass_logits"][0], z["full/logits"], atol=LOGITS, rtol=0)
  if not refresh:
    np.testing.assert_allclose(faux["h_final"], z["interleaved/h_final"], atol=LOSS, rtol=0)


def test_interleaved_gradients(golden):
  z, _, cfg, params = golden
  grads = jax.grad(lambda p: _loss(p, cfg, z)[0])(params)
  ours = to_official_lrt(cfg, grads)
  refs = {k[len("grad/"):]: v for k, v in z.items() if k.startswith("grad/")}
  assert set(ours) == set(refs)
  for name, ref in refs.items():
    _grad_close(ours[name], ref, name)


def test_kv_refresh_gradients(golden):
  z, _, cfg, params = golden
  grads = jax.grad(lambda p: _loss(p, cfg, z, kv_refresh=True)[0])(params)
  ours = to_official_lrt(cfg, grads)
  full = {k.split("/", 1)[1]: v for k, v in z.items() if k.startswith("grad_kvrefresh/")}
  sums = {k.split("/", 1)[1]: v for k, v in z.items() if k.startswith("grad_kvrefresh_sums/")}
  assert full and sums
  for name, ref in full.items():
    _grad_close(ours[name], ref, name)
  for name, ref in sums.items():
    g = np.asarray(ours[name], np.float64)
    _grad_close(np.concatenate([g.sum(1), g.sum(0)]), ref, name + " (sums)")


def test_release_bfloat16_rotary_table(golden):
  """By default the converter keeps the release's bf16-rounded rotary table: the
  rope_bf16/* arrays (the release as it runs)."""
  z, meta, _, params = golden
  cfg, _ = from_official_lrt({e["name"]: z[e["name"]] for e in meta["state_dict"]},
                             meta["gpt_config"])
  assert cfg.rope_table_dtype == "bfloat16"
  full = t2mlr_jax.forward(params, cfg, z["tokens"], mode="parallel")
  np.testing.assert_allclose(full, z["rope_bf16/full_logits"], atol=LOGITS, rtol=0)
  seq = t2mlr_jax.forward(params, cfg, z["tokens"], mode="exact")
  np.testing.assert_allclose(seq, z["rope_bf16/seq_logits"], atol=LOGITS, rtol=0)
  merged = t2mlr_jax.forward(params, cfg, z["tokens"], mode="interleaved")
  np.testing.assert_allclose(merged, z["rope_bf16/interleaved_merged_logits"], atol=LOGITS, rtol=0)
  value, aux = _loss(params, cfg, z)
  np.testing.assert_allclose(value, z["rope_bf16/interleaved_loss"], atol=LOSS, rtol=0)
  np.testing.assert_allclose(aux["per_pass_losses"], z["rope_bf16/interleaved_per_pass_losses"],
                             atol=LOSS, rtol=0)
  assert float(np.max(np.abs(full - z["full/logits"]))) > 1e-4   # the rounding matters


def test_unsupported_official_config(golden):
  z, meta, _, _ = golden
  sd = {e["name"]: z[e["name"]] for e in meta["state_dict"]}
  with pytest.raises(ValueError, match="use_moe"):
    from_official_lrt(sd, {**meta["gpt_config"], "use_moe": True})
  with pytest.raises(ValueError, match="missing weight 'value_embeds.1.weight'"):
    from_official_lrt(sd, {**meta["gpt_config"], "use_interleaved": False})
  with pytest.raises(ValueError, match="passes"):
    from_official_lrt(sd, {**meta["gpt_config"], "use_interleaved": False}, passes=2)
  with pytest.raises(ValueError, match="ignore"):
    from_official_lrt({**sd, "extra.weight": np.zeros(3)}, meta["gpt_config"])


def test_plain_nanochat_with_value_embeddings():
  """The release's plain GPT (use_interleaved=False: value embeddings on alternating
  layers, no recurrence), tests/golden/nanochat_plain_small.*: logits, loss and every
  gradient by official name."""
  z = dict(np.load(os.path.join(GOLDEN, "nanochat_plain_small.npz")))
  meta = json.load(open(os.path.join(GOLDEN, "nanochat_plain_small.json")))
  names = [k for k in z if "/" not in k and k not in ("tokens", "targets", "logits", "loss")]
  cfg, params = from_official_lrt({n: z[n] for n in names}, meta["gpt_config"],
                                  rope_table_dtype="float32")
  assert cfg.recurrence is None and cfg.value_embed_layers == (1, 3)
  assert set(to_official_lrt(cfg, params)) == set(names)
  logits = t2mlr_jax.forward(params, cfg, z["tokens"], mode="parallel")
  np.testing.assert_allclose(logits, z["logits"], atol=LOGITS, rtol=0)
  value, grads = jax.value_and_grad(
      lambda p: t2mlr_jax.loss(p, cfg, z["tokens"], mode="parallel", targets=z["targets"]))(params)
  np.testing.assert_allclose(value, z["loss"], atol=LOSS, rtol=0)
  ours = to_official_lrt(cfg, grads)
  for name in names:
    _grad_close(ours[name], z["grad/" + name], name)


REFINE = "lrt_refine_official_small"


@pytest.fixture(scope="module")
def refine_golden(golden):
  z = dict(np.load(os.path.join(GOLDEN, REFINE + ".npz")))
  meta = json.load(open(os.path.join(GOLDEN, REFINE + ".json")))
  return z, meta


@pytest.mark.parametrize("case", ["k2", "k2_detach", *(
    pytest.param(c, marks=pytest.mark.slow)
    for c in ("k3", "k2_weighted", "k2_nodetach_last", "k2_width0"))])
def test_multi_refine_equals_the_releases(golden, refine_golden, case):
  """The release's multi-refinement training (a133a67, tests/golden/make_lrt_refine_goldens.py)
  on the same model: each pass's logits, the per-pass and weighted losses, and the
  gradient of every parameter (whole, or its row and column sums). Positions run 0..T-1
  with no documents, so our memory resets at t = 0 only, as the release's."""
  base, base_meta, _, _ = golden
  z, meta = refine_golden
  official = meta["cases"][case]["gpt_config"]
  state = {e["name"]: base[e["name"]] for e in base_meta["state_dict"]}
  state.update({k.split("/param/", 1)[1]: v for k, v in z.items()
                if k.startswith(f"{case}/param/")})
  width = official["ve_gate_channels"]
  cfg, params = from_official_lrt(state, {**base_meta["gpt_config"], "ve_gate_channels": width},
                                  rope_table_dtype="float32")
  options = dict(refine_passes=official["multi_refine_num_passes"],
                 refine_weights=tuple(official["multi_refine_loss_weights"]),
                 refine_detach=official["multi_refine_detach"])

  def loss(p):
    return t2mlr_jax.loss(p, cfg, z["tokens"], mode="multi_refine", targets=z["targets"],
                          return_aux=True, **options)

  (value, aux), grads = jax.value_and_grad(loss, has_aux=True)(params)
  np.testing.assert_allclose(value, z[f"{case}/loss"], atol=LOSS, rtol=0)
  np.testing.assert_allclose(aux["per_pass_losses"], z[f"{case}/per_pass_losses"], atol=LOSS)
  _, faux = t2mlr_jax.forward(params, cfg, z["tokens"], mode="multi_refine", return_aux=True,
                              refine_passes=options["refine_passes"],
                              refine_detach=options["refine_detach"])
  np.testing.assert_allclose(np.asarray(faux["pass_logits"]), z[f"{case}/pass_logits"],
                             atol=LOGITS, rtol=0)
  ours = to_official_lrt(cfg, grads)
  refs = {k.split("/grad/", 1)[1]: v for k, v in z.items() if k.startswith(f"{case}/grad/")}
  assert set(refs) == set(ours)
  for name, ref in refs.items():
    g = np.asarray(ours[name], np.float64)
    if g.shape != ref.shape:
      g = np.concatenate([g.sum(1), g.sum(0)])
    _grad_close(g, ref, name)
