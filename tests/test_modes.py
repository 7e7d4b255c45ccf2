"""The execution modes agree where they must (SPEC §3 exactness, §10 conventions)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2mlr_jax import T2MLRConfig, forward, init_params
from t2mlr_jax.losses import cross_entropy, next_token_labels
from _util import active_params, max_abs, random_tokens, tiny_cfg

B, T = 3, 12
# Row 0: all recurrent. Row 1: a non-recurrent prompt of 4 then recurrent, with a
# non-recurrent token inside. Row 2: left padding of 3, then mixed.
CF = np.array([[2] * 12,
               [1, 1, 1, 1, 2, 2, 2, 1, 2, 2, 2, 2],
               [0, 0, 0, 1, 1, 2, 2, 2, 2, 2, 2, 2]], np.int32)


@pytest.mark.parametrize("l_start,l_end,n_layers,residual,cache_norm", [
    (1, 2, 4, True, "clipped_rms"),
    (0, 3, 4, True, "clipped_rms"),     # every layer recurrent: l_start=0, l_end=L-1
    (0, 0, 3, False, "clipped_rms"),    # residual off
    (2, -1, 4, True, "rmsnorm"),        # negative l_end, learned-gain norm
    (1, 1, 3, True, "none"),
])
def test_jacobi_with_enough_sweeps_equals_exact(l_start, l_end, n_layers, residual, cache_norm):
  rec = T2MLRConfig(l_start=l_start, l_end=l_end, residual=residual, cache_norm=cache_norm)
  cfg = tiny_cfg(n_layers=n_layers, recurrence=rec)
  params = active_params(cfg)
  tokens = random_tokens(cfg, B, T)
  exact = forward(params, cfg, tokens, mode="exact", control_flow=CF)
  jac = forward(params, cfg, tokens, mode="jacobi", control_flow=CF, d_forward=T, d_backward=2)
  assert max_abs(exact, jac) <= 1e-5
  # ... and the recurrence is really on: exact differs from the plain model.
  plain = forward(params, cfg, tokens, mode="parallel", control_flow=CF)
  assert max_abs(exact, plain) > 1e-2


def test_jacobi_prefix_exactness():
  """After D_f - 1 middle sweeps, positions < D_f are exact and position D_f is not."""
  cfg = tiny_cfg()
  params = active_params(cfg)
  tokens = random_tokens(cfg, 2, T)
  exact = forward(params, cfg, tokens, mode="exact")
  for d_f in (1, 3, 6):
    jac = forward(params, cfg, tokens, mode="jacobi", d_forward=d_f, d_backward=1)
    assert max_abs(exact[:, :d_f], jac[:, :d_f]) <= 1e-5
    assert max_abs(exact[:, d_f], jac[:, d_f]) > 1e-4


def test_packed_segments():
  """Packed documents: each segment computes what it computes alone, in every mode."""
  cfg = tiny_cfg()
  params = active_params(cfg)
  a, b = random_tokens(cfg, 1, 7, seed=1), random_tokens(cfg, 1, 5, seed=2)
  packed = np.concatenate([a, b], axis=1)
  seg = np.array([[0] * 7 + [1] * 5], np.int32)
  for mode, kw in (("exact", {}), ("jacobi", dict(d_forward=12, d_backward=2)),
                   ("parallel", {})):
    together = forward(params, cfg, packed, mode=mode, segment_ids=seg, **kw)
    alone_a = forward(params, cfg, a, mode=mode, **kw)
    alone_b = forward(params, cfg, b, mode=mode, **kw)
    assert max_abs(together[:, :7], alone_a) <= 1e-5, mode
    assert max_abs(together[:, 7:], alone_b) <= 1e-5, mode


def test_left_padding_matches_unpadded():
  cfg = tiny_cfg()
  params = active_params(cfg)
  tokens = random_tokens(cfg, 1, 9)
  padded = np.concatenate([np.zeros((1, 3), np.int32), tokens], axis=1)
  cf = np.array([[0] * 3 + [2] * 9], np.int32)
  pos = np.array([[0] * 3 + list(range(9))], np.int32)
  for mode in ("exact", "jacobi"):
    ref = forward(params, cfg, tokens, mode=mode, d_forward=9 if mode == "jacobi" else None)
    out = forward(params, cfg, padded, mode=mode, control_flow=cf, positions=pos,
                  d_forward=9 if mode == "jacobi" else None)
    assert max_abs(out[:, 3:], ref) <= 1e-5, mode


def test_gamma_zero_is_the_base_model():
  cfg = tiny_cfg()
  params = init_params(cfg, jax.random.PRNGKey(3))   # fresh: γ = 0
  base_cfg = cfg.replace(recurrence=None)
  base_params = {k: v for k, v in params.items() if k != "recurrence"}
  tokens = random_tokens(cfg, 2, T)
  base = forward(base_params, base_cfg, tokens, mode="parallel")
  np.testing.assert_array_equal(forward(params, cfg, tokens, mode="parallel"), base)
  assert max_abs(forward(params, cfg, tokens, mode="exact"), base) <= 1e-5
  assert max_abs(forward(params, cfg, tokens, mode="jacobi"), base) <= 1e-5
  # a plain model runs every mode as the plain transformer
  np.testing.assert_array_equal(forward(base_params, base_cfg, tokens, mode="exact"), base)


@pytest.mark.parametrize("mode", ["parallel", "exact", "jacobi"])
def test_causality(mode):
  cfg = tiny_cfg()
  params = active_params(cfg)
  tokens = random_tokens(cfg, 2, T)
  ref = forward(params, cfg, tokens, mode=mode)
  t = 6
  changed = tokens.copy()
  changed[:, t + 1:] = (changed[:, t + 1:] + 1) % cfg.vocab_size
  out = forward(params, cfg, changed, mode=mode)
  assert max_abs(out[:, :t + 1], ref[:, :t + 1]) <= 1e-6
  assert max_abs(out[:, t + 1:], ref[:, t + 1:]) > 1e-4


@pytest.mark.parametrize("mode", ["parallel", "exact", "jacobi"])
def test_scanned_equals_unrolled(mode):
  cfg = tiny_cfg()
  params = active_params(cfg)
  tokens = random_tokens(cfg, 2, 8)
  scanned = forward(params, cfg, tokens, mode=mode, control_flow=CF[:2, :8])
  unrolled = forward(params, cfg.replace(scan_layers=False), tokens, mode=mode,
                     control_flow=CF[:2, :8])
  assert max_abs(scanned, unrolled) <= 1e-5


def test_exact_mode_is_differentiable_bptt():
  """Exact mode trains by backpropagation through time; its gradient reaches γ_rec."""
  cfg = tiny_cfg()
  params = active_params(cfg)
  tokens = jnp.asarray(random_tokens(cfg, 2, 8))

  def loss(p, mode):
    kw = dict(d_forward=8, d_backward=8) if mode == "jacobi" else {}
    return cross_entropy(forward(p, cfg, tokens, mode=mode, **kw), next_token_labels(tokens))[0]

  g_exact = jax.grad(loss)(params, "exact")
  assert abs(float(g_exact["recurrence"]["gamma_rec"])) > 1e-6
  # Jacobi with D_f = D_b = T has the exact forward but a different (truncated-residual
  # free) gradient path; both are finite and nonzero.
  g_jac = jax.grad(loss)(params, "jacobi")
  assert np.isfinite(float(g_jac["recurrence"]["gamma_rec"]))


def test_return_aux():
  cfg = tiny_cfg()
  params = active_params(cfg)
  tokens = random_tokens(cfg, 2, T)
  _, aux = forward(params, cfg, tokens, mode="jacobi", d_forward=T + 1, d_backward=2,
                   return_aux=True)
  assert int(aux["jacobi_sweeps"]) == T + 1
  assert float(aux["jacobi_residual"]) <= 1e-5     # converged: the fixed point is reached
  assert 0.0 < float(aux["gate_rec"]) < 1.0 and 0.0 < float(aux["gate_cur"]) < 1.0
  _, aux = forward(params, cfg, tokens, mode="jacobi", d_forward=3, d_backward=1,
                   return_aux=True)
  assert int(aux["jacobi_sweeps"]) == 3 and float(aux["jacobi_residual"]) > 1e-3
  _, aux = forward(params, cfg, tokens, mode="exact", return_aux=True)
  assert set(aux) == {"gate_rec", "gate_cur"}


def test_jacobi_tolerance_stops_early_and_matches():
  cfg = tiny_cfg()
  params = active_params(cfg, gamma_rec=0.3)
  tokens = random_tokens(cfg, 2, T)
  tol_cfg = cfg.replace(recurrence=cfg.recurrence.replace(jacobi_tol=1e-6))
  fixed, aux_f = forward(params, cfg, tokens, mode="jacobi", d_forward=40, d_backward=2,
                         return_aux=True)
  adaptive, aux_a = forward(params, tol_cfg, tokens, mode="jacobi", d_forward=40, d_backward=2,
                            return_aux=True)
  assert int(aux_f["jacobi_sweeps"]) == 40
  assert int(aux_a["jacobi_sweeps"]) <= T + 3      # converges by T sweeps at the latest
  assert max_abs(fixed, adaptive) <= 1e-5


def test_bf16_compute_keeps_fp32_params_and_recurrence():
  cfg = tiny_cfg()
  params = active_params(cfg)
  tokens = random_tokens(cfg, 2, T)
  bf16 = cfg.replace(dtype="bfloat16")
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(params))
  for mode in ("exact", "jacobi"):
    kw = dict(d_forward=T) if mode == "jacobi" else {}
    ref = forward(params, cfg, tokens, mode=mode, **kw)
    out = forward(params, bf16, tokens, mode=mode, **kw)
    assert out.dtype == jnp.float32 and np.isfinite(np.asarray(out)).all()
    assert max_abs(out, ref) < 0.1          # bf16 activations, fp32 recurrence
  from t2mlr_jax.model.recurrence import t2mlr as rec
  h = jnp.ones((1, 2, cfg.d_model), jnp.bfloat16)
  z = rec.write(params["recurrence"], bf16, h, jnp.zeros((1, 2, cfg.d_model)), jnp.array([[2, 2]]))
  assert z.dtype == jnp.float32


@pytest.mark.slow       # 12 s: .ci/run's slow step
def test_nanochat_backbone_options_in_every_mode():
  """T2MLR over nanochat's backbone (windows that mask, α/β, QK-norm, relu², softcap,
  padded vocabulary, value embeddings): Jacobi with D_f = T is exact, and decoding
  follows exact."""
  from t2mlr_jax import generate
  cfg = tiny_cfg(norm_scale=False, embed_norm=True, qk_norm=True, mlp_type="relu2",
                 logit_softcap=10.0, resid_lambdas=True, x0_lambdas=True, window_pattern="SSL",
                 window_short=3, pad_vocab_to=16, max_seq_len=16, value_embeds="alternating",
                 ve_gate_channels=8)
  params = active_params(cfg)
  assert cfg.value_embed_layers == (1, 3)
  assert cfg.num_params() == sum(a.size for a in jax.tree.leaves(params))
  ve = params["value_embeds"]
  params = {**params, "value_embeds": {**ve, "gate": 0.5 + ve["gate"]}}
  tokens = random_tokens(cfg, 2, 10)
  exact = forward(params, cfg, tokens, mode="exact")
  jac = forward(params, cfg, tokens, mode="jacobi", d_forward=10, d_backward=2)
  assert max_abs(exact, jac) <= 1e-5
  full = forward(params, cfg.replace(window_pattern=None, window_short=None), tokens,
                 mode="exact")
  assert max_abs(exact, full) > 1e-3                     # the windows do mask
  zero_ve = {**params, "value_embeds": {**params["value_embeds"],
                                        "embedding": 0 * params["value_embeds"]["embedding"]}}
  assert max_abs(exact, forward(zero_ve, cfg, tokens, mode="exact")) > 1e-4   # VE matter
  new, step_logits = generate(params, cfg, tokens[:, :6], max_new_tokens=4, return_logits=True)
  ref = forward(params, cfg, np.concatenate([tokens[:, :6], np.asarray(new)], axis=1),
                mode="exact")
  assert max_abs(step_logits, ref[:, 5:9]) <= 1e-5


@pytest.mark.parametrize("kind", ["t2mlr"])       # LRT runs the same exact() code
def test_exact_takes_a_non_recurrent_prefix_from_one_parallel_pass(kind):
  """Rows with a non-recurrent (cf 1) prompt: exact mode alone (the prefix is collapsed
  into one parallel pass) equals the same rows batched with an all-recurrent row (no
  prefix to collapse: every position runs token by token); state and KVs too."""
  from t2mlr_jax.model import modes as m
  from test_recurrence_lrt import active as lrt_active, lrt_cfg
  if kind == "t2mlr":
    cfg = tiny_cfg()
    params = active_params(cfg)
  else:
    cfg = lrt_cfg()
    params = lrt_active(cfg)
  T = 10
  tokens = random_tokens(cfg, 3, T, seed=4)
  cf = np.full((3, T), 2, np.int32)
  cf[0, :6], cf[1, :4] = 1, 1
  cf[1, :2] = 0                                         # left padding, then the prompt
  pos = np.maximum(np.arange(T)[None] - np.array([[0], [2], [0]]), 0).astype(np.int32)
  run = lambda rows: m.exact(params, cfg, jnp.asarray(tokens[rows]),
                             m.seq_inputs(tokens[rows], cf[rows], pos[rows]))
  collapsed, full = run([0, 1]), run([0, 1, 2])
  assert max_abs(collapsed.logits, full.logits[:2]) < 2e-5
  assert max_abs(collapsed.state, full.state[:2]) < 2e-5
  for a, b in zip(jax.tree.leaves(collapsed.kvs["middle"]), jax.tree.leaves(full.kvs["middle"])):
    assert max_abs(a, b[:, :2]) < 2e-5


def test_jacobi_depths_override_independently_and_d_backward_is_clamped():
  """d_forward alone below the config's d_backward is allowed (D_b clamped to it), and
  d_backward alone above the config's d_forward is clamped too: the same logits and
  gradients as giving both explicitly."""
  cfg = tiny_cfg(n_layers=3, recurrence=T2MLRConfig(l_start=1, l_end=1, d_forward=6,
                                                    d_backward=4))
  params = active_params(cfg)
  tokens = random_tokens(cfg, 2, 8)

  def grad_of(**kw):
    return jax.grad(lambda p: jnp.mean(forward(p, cfg, tokens, mode="jacobi", **kw) ** 2))(params)

  pairs = [(dict(d_forward=2), dict(d_forward=2, d_backward=2)),
           (dict(d_backward=9), dict(d_forward=6, d_backward=6))]
  for given, explicit in pairs:
    assert max_abs(forward(params, cfg, tokens, mode="jacobi", **given),
                   forward(params, cfg, tokens, mode="jacobi", **explicit)) == 0.0
    g1, g2 = grad_of(**given), grad_of(**explicit)
    assert max(max_abs(a, b) for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2))) == 0.0
  # D_b truly differs from the clamped value's neighbour: fewer gradient sweeps change grads
  g_few = grad_of(d_forward=6, d_backward=1)
  g_all = grad_of(d_backward=9)
  assert max(max_abs(a, b) for a, b in zip(jax.tree.leaves(g_few), jax.tree.leaves(g_all))) > 0
  for bad in (dict(d_forward=0), dict(d_backward=0), dict(d_forward=2.5)):
    with pytest.raises(ValueError, match=next(iter(bad))):
      forward(params, cfg, tokens, mode="jacobi", **bad)


def test_explicit_positions_must_restart_at_segment_starts():
  """The memory resets where a position id is 0, so positions given with segment_ids
  that do not restart would let it cross documents: refused, naming the entry."""
  cfg = tiny_cfg(n_layers=3, recurrence=T2MLRConfig(l_start=1, l_end=1))
  params = active_params(cfg)
  tokens = random_tokens(cfg, 1, 6)
  seg = np.array([[0, 0, 0, 1, 1, -1]], np.int32)
  good = np.array([[0, 1, 2, 0, 1, 0]], np.int32)
  np.testing.assert_array_equal(
      forward(params, cfg, tokens, mode="exact", segment_ids=seg, positions=good),
      forward(params, cfg, tokens, mode="exact", segment_ids=seg))
  with pytest.raises(ValueError, match=r"positions\[0, 3\]=3"):
    forward(params, cfg, tokens, mode="exact", segment_ids=seg,
            positions=np.arange(6, dtype=np.int32)[None])
