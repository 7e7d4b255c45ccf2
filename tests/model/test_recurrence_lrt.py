"""LRT's modes agree where they must (docs/models.md, "LRT"): interleaved with S = T is
the true recurrence, merged logits are exact before S, identity init is the base
transformer, generate follows the exact recurrence, padding and packing reset the
memory."""

import jax
import numpy as np
import pytest

import t2mlr_jax
from t2mlr_jax import LRTConfig, ModelConfig, T2MLRConfig, forward, generate, init_params
from t2mlr_jax.config import recurrence_from_dict
from t2mlr_jax.registry import schedule_option_defaults

from _util import active_lrt_params as active, max_abs, random_tokens

T = 8


def lrt_cfg(nanochat=True, **rec_kw):
  """A tiny LRT model: nanochat's backbone (windows that mask at T = 8, GQA, padded
  vocabulary) or the Llama backbone; `rec_kw`: LRTConfig fields and schedule options."""
  options = {k: rec_kw.pop(k) for k in list(rec_kw) if k in schedule_option_defaults()}
  base = dict(vocab_size=37, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, d_ff=64,
              max_seq_len=16, rope_theta=10000.0)
  if nanochat:
    base.update(norm_scale=False, embed_norm=True, qk_norm=True, mlp_type="relu2",
                logit_softcap=15.0, resid_lambdas=True, x0_lambdas=True, window_pattern="SL",
                window_short=3, pad_vocab_to=8)
  rec = LRTConfig(**{"gate_channels": 8, **rec_kw})
  return ModelConfig(**base, recurrence=rec, schedule_options=options)


@pytest.mark.parametrize("nanochat, refresh", [
    (True, False),
    pytest.param(False, True, marks=pytest.mark.slow),
    pytest.param(True, True, marks=pytest.mark.slow),
    pytest.param(False, False, marks=pytest.mark.slow)])
def test_interleaved_with_S_equal_T_is_exact(nanochat, refresh):
  cfg = lrt_cfg(nanochat)
  params = active(cfg)
  tokens = random_tokens(cfg, 2, T)
  exact = forward(params, cfg, tokens, mode="exact")
  merged = forward(params, cfg, tokens, mode="interleaved", passes=T, kv_refresh=refresh)
  assert max_abs(exact, merged) <= 1e-5
  plain = forward(params, cfg, tokens, mode="parallel")
  assert max_abs(exact, plain) > 1e-2            # the memory changes the logits


def test_merged_logits_exact_before_S_only():
  cfg = lrt_cfg(passes=3)
  params = active(cfg)
  tokens = random_tokens(cfg, 2, T)
  exact = forward(params, cfg, tokens, mode="exact")
  merged, aux = forward(params, cfg, tokens, mode="interleaved", return_aux=True)
  assert max_abs(exact[:, :3], merged[:, :3]) <= 1e-5
  assert max_abs(exact[:, 3:], merged[:, 3:]) > 1e-4
  # per-pass logits: pass 0 everywhere, pass p at t ≡ p-1 (mod 3), uneven (3, 3, 2)
  assert [a.shape[1] for a in aux["pass_logits"]] == [T, 3, 3, 2]
  np.testing.assert_array_equal(aux["pass_logits"][3], merged[:, 2::3])


def test_loss_is_the_mean_of_pass_losses():
  cfg = lrt_cfg(passes=2)
  params = active(cfg)
  tokens = random_tokens(cfg, 2, T)
  value, aux = t2mlr_jax.loss(params, cfg, tokens, mode="interleaved", return_aux=True)
  assert aux["per_pass_losses"].shape == (3,)
  np.testing.assert_allclose(value, aux["per_pass_losses"].mean(), rtol=1e-6)
  full = t2mlr_jax.loss(params, cfg, tokens, mode="parallel")
  np.testing.assert_allclose(aux["per_pass_losses"][0], full, rtol=1e-6)


@pytest.mark.parametrize("nanochat", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_identity_init_equals_base_transformer(nanochat):
  cfg = lrt_cfg(nanochat, init="identity")
  params = init_params(cfg, jax.random.PRNGKey(3))
  base_cfg = cfg.replace(recurrence=None)
  base_params = {**params, "layers": {k: v for k, v in params["layers"].items()
                                      if k != "memory"}}
  tokens = random_tokens(cfg, 2, T)
  base = forward(base_params, base_cfg, tokens, mode="parallel")
  for mode, kw in (("parallel", {}), ("exact", {}), ("interleaved", {"passes": 3})):
    out = forward(params, cfg, tokens, mode=mode, **kw)
    assert max_abs(out, base) <= 1e-5, mode
  np.testing.assert_array_equal(forward(params, cfg, tokens, mode="parallel"), base)


@pytest.mark.slow       # 16 s: .ci/run's slow step
def test_source_layer_and_variants():
  """An upper-middle source layer, LRT-shared and the ablations: interleaved S = T is
  still exact, and the parameter count matches the tree."""
  for rec_kw in ({"source_layer": 1}, {"projection": "shared"},
                 {"key": False, "value_embeds": False, "residual": False}):
    cfg = lrt_cfg(**rec_kw)
    params = active(cfg, seed=1)
    assert cfg.num_params() == sum(a.size for a in jax.tree.leaves(params)), rec_kw
    tokens = random_tokens(cfg, 2, T, seed=1)
    exact = forward(params, cfg, tokens, mode="exact")
    merged = forward(params, cfg, tokens, mode="interleaved", passes=T)
    assert max_abs(exact, merged) <= 1e-5, rec_kw
    assert max_abs(exact, forward(params, cfg, tokens, mode="parallel")) > 1e-3, rec_kw


def test_control_flow_one_reads_no_memory():
  cfg = lrt_cfg()
  params = active(cfg)
  tokens = random_tokens(cfg, 2, T)
  cf = np.ones((2, T), np.int32)
  np.testing.assert_allclose(forward(params, cfg, tokens, mode="exact", control_flow=cf),
                             forward(params, cfg, tokens, mode="parallel"), atol=1e-5)


@pytest.mark.slow       # 15 s: .ci/run's slow step (test_data_lm covers packed documents in every mode)
def test_packed_segments_reset_the_memory():
  cfg = lrt_cfg()
  params = active(cfg)
  a, b = random_tokens(cfg, 1, 5, seed=1), random_tokens(cfg, 1, 3, seed=2)
  packed = np.concatenate([a, b], axis=1)
  seg = np.array([[0] * 5 + [1] * 3], np.int32)
  for mode, kw in (("exact", {}), ("interleaved", {"passes": 8})):
    together = forward(params, cfg, packed, mode=mode, segment_ids=seg, **kw)
    kw_a, kw_b = ({"passes": 5}, {"passes": 3}) if kw else ({}, {})
    assert max_abs(together[:, :5], forward(params, cfg, a, mode=mode, **kw_a)) <= 1e-5, mode
    assert max_abs(together[:, 5:], forward(params, cfg, b, mode=mode, **kw_b)) <= 1e-5, mode
  # the release's rule (memory zero only at t = 0) carries memory across the boundary
  rel = cfg.replace(recurrence=cfg.recurrence.replace(reset_at_segment_start=False))
  together = forward(params, rel, packed, mode="exact", segment_ids=seg)
  assert max_abs(together[:, 5:], forward(params, rel, b, mode="exact")) > 1e-4


@pytest.mark.slow       # T2MLR's twin in test_modes runs by default
def test_left_padding_matches_unpadded():
  cfg = lrt_cfg()
  params = active(cfg)
  tokens = random_tokens(cfg, 1, 6, seed=7)
  padded = np.concatenate([np.zeros((1, 2), np.int32), tokens], axis=1)
  side = dict(control_flow=np.array([[0, 0] + [2] * 6], np.int32),
              positions=np.array([[0, 0] + list(range(6))], np.int32))
  for mode, kw, kw_pad in (("exact", {}, {}), ("interleaved", {"passes": 6}, {"passes": 8})):
    ref = forward(params, cfg, tokens, mode=mode, **kw)
    out = forward(params, cfg, padded, mode=mode, **side, **kw_pad)
    assert max_abs(out[:, 2:], ref) <= 1e-5, mode


@pytest.fixture(scope="module")
def model():
  cfg = lrt_cfg()
  return cfg, active(cfg, seed=5)


@pytest.mark.parametrize("prompt_cf", [2, pytest.param(1, marks=pytest.mark.slow)])
def test_generate_follows_the_exact_recurrence(model, prompt_cf):
  cfg, params = model
  prompt = random_tokens(cfg, 2, 5, seed=4)
  new, step_logits = generate(params, cfg, prompt, max_new_tokens=4, return_logits=True,
                              prompt_control_flow=prompt_cf)
  full = np.concatenate([prompt, np.asarray(new)], axis=1)
  cf = np.array([[prompt_cf] * 5 + [2] * 4] * 2, np.int32)
  ref = forward(params, cfg, full, mode="exact", control_flow=cf)
  assert max_abs(step_logits, ref[:, 4:8]) <= 1e-5


def test_left_padded_generate_equals_one_at_a_time(model):
  cfg, params = model
  rows = [random_tokens(cfg, 1, n, seed=10 + n)[0] for n in (5, 3)]
  P = 5
  prompt = np.zeros((2, P), np.int32)
  for r, row in enumerate(rows):
    prompt[r, P - len(row):] = row
  batched, logits = generate(params, cfg, prompt, max_new_tokens=4, prompt_lengths=[5, 3],
                             return_logits=True)
  for r, row in enumerate(rows):
    alone, alone_logits = generate(params, cfg, row[None], max_new_tokens=4, return_logits=True)
    np.testing.assert_array_equal(batched[r], alone[0])
    assert max_abs(logits[r], alone_logits[0]) <= 1e-5


@pytest.mark.parametrize("make,field", [
    (lambda: lrt_cfg(passes=0), "passes"),
    (lambda: LRTConfig(projection="tied"), "projection"),
    (lambda: LRTConfig(init="zero"), "init"),
    (lambda: lrt_cfg(source_layer=3), "source_layer"),
    (lambda: lrt_cfg(source_layer=-4), "source_layer"),
    (lambda: lrt_cfg().replace(window_short=17), "window_short"),
    (lambda: lrt_cfg().replace(window_long=32), "window_long"),
    (lambda: lrt_cfg().replace(window_pattern="SXL"), "window_pattern"),
    (lambda: ModelConfig(recurrence={"type": "lrt", "l_start": 1}), "l_start"),
    (lambda: ModelConfig(recurrence={"type": "t2mlr", "passes": 0}), "passes"),
    (lambda: ModelConfig(recurrence={"type": "lrt", "d_backward": 0}), "d_backward"),
    (lambda: recurrence_from_dict({"type": "rnn"}), "type"),
])
def test_bad_config(make, field):
  with pytest.raises(ValueError, match=field):
    make()


def test_bad_mode_options(model):
  cfg, params = model
  tokens = random_tokens(cfg, 1, T)
  with pytest.raises(ValueError, match="passes"):
    forward(params, cfg, tokens, mode="interleaved", passes=T + 1)
  with pytest.raises(ValueError, match="d_forward is not an option of mode='interleaved'"):
    forward(params, cfg, tokens, mode="interleaved", d_forward=4)
  with pytest.raises(ValueError, match="prefill"):
    generate(params, cfg, tokens, max_new_tokens=2, prefill="sweeps")
  t2 = ModelConfig(vocab_size=37, d_model=32, n_layers=3, n_heads=4, d_ff=64,
                   recurrence=T2MLRConfig(l_start=1, l_end=1))
  t2_params = init_params(t2, jax.random.PRNGKey(0))
  with pytest.raises(ValueError, match="kv_refresh=True is invalid for a t2mlr model"):
    forward(t2_params, t2, tokens, mode="interleaved", kv_refresh=True)
  with pytest.raises(ValueError, match="passes is not an option of mode='jacobi'"):
    forward(t2_params, t2, tokens, mode="jacobi", passes=2)


def test_serialized_config_round_trip():
  cfg = lrt_cfg(passes=3, projection="shared")
  d = cfg.to_dict()
  assert d["recurrence"]["type"] == "lrt"
  assert ModelConfig(**d) == cfg
  old = ModelConfig(recurrence=T2MLRConfig()).to_dict()
  old["recurrence"].pop("type")          # exports written before the tag existed
  assert isinstance(ModelConfig(**old).recurrence, T2MLRConfig)


@pytest.mark.slow       # T2MLR's twin runs by default
def test_exact_bptt_gradient_matches_finite_differences():
  """LRT's exact mode backpropagates through the token-by-token recurrence: directional
  derivatives of the loss along random directions in every memory path (γ, the triple
  gate, value embeddings, W_k, W_v), a backbone weight (W_v of attention) and all memory
  parameters at once agree with finite differences to 1% (nanochat backbone; weights of
  std 0.1 keep every direction's derivative far above fp32 noise). The check has teeth:
  multi_refine with K = T and refine_detach (the exact forward, the gradient cut between
  passes) fails all seven directions; without refine_detach it passes them."""
  from model.test_modes import directional_derivative_checks
  cfg = lrt_cfg().replace(init_std=0.1)
  params = active(cfg)
  tokens = jax.numpy.asarray(random_tokens(cfg, 2, T))
  groups = [(k, lambda n, k=k: f"['memory']['{k}']" in n)
            for k in ("gamma", "gate", "ve", "w_k", "w_v")]
  groups += [("backbone W_v", lambda n: "['attn']['v']" in n),
             ("all memory", lambda n: "['memory']" in n)]
  directional_derivative_checks(lambda p: t2mlr_jax.loss(p, cfg, tokens, mode="exact"),
                                params, groups)


def test_interleaved_aux_values():
  """interleaved's aux: pass_logits[0] is the parallel (zero-memory) pass; h_final is the
  memory source every position was last left with, the LM head's input, so the merged
  logits are the head applied to it, and it equals the exact recurrence's normed final
  hidden state at the positions the schedule makes exact (all of them when S = T, the
  first S otherwise); gate_means is [L, 3] and exactly 1 (= 2σ(0)) with zero gate weights."""
  from t2mlr_jax.model.layers import final_norm
  from t2mlr_jax.model.modes import hidden_states
  from t2mlr_jax.model.transformer import head
  cfg = lrt_cfg()
  params = active(cfg)
  tokens = random_tokens(cfg, 2, T)
  y, _ = hidden_states(params, cfg, tokens, mode="exact")
  h_exact = final_norm(params, cfg, y)            # source_layer -1: the LM head's input
  parallel = forward(params, cfg, tokens, mode="parallel")
  for passes in (T, 3):
    merged, aux = forward(params, cfg, tokens, mode="interleaved", passes=passes,
                          return_aux=True)
    assert max_abs(aux["pass_logits"][0], parallel) <= 1e-5
    h_final = aux["h_final"]
    assert h_final.shape == (2, T, cfg.d_model)
    assert max_abs(head(params, cfg, h_final), merged) <= 1e-5
    assert max_abs(h_final[:, :passes], h_exact[:, :passes]) <= 1e-5, passes
    if passes < T:
      assert max_abs(h_final[:, passes:], h_exact[:, passes:]) > 1e-3
  mem = params["layers"]["memory"]
  still = {**params, "layers": {**params["layers"],
                                "memory": {**mem, "gate": jax.numpy.zeros_like(mem["gate"])}}}
  _, aux = forward(still, cfg, tokens, mode="interleaved", passes=3, return_aux=True)
  np.testing.assert_array_equal(aux["gate_means"], np.ones((cfg.n_layers, 3), np.float32))
