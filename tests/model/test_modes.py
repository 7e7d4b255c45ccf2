"""The execution modes agree where they must (docs/models.md: Jacobi's exactness, control
flow, conventions)."""

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

  grad = jax.jit(jax.grad(loss), static_argnums=1)
  g_exact = grad(params, "exact")
  assert abs(float(g_exact["recurrence"]["gamma_rec"])) > 1e-6
  # Jacobi with D_f = D_b = T has the exact forward and a different gradient path (the
  # unrolled parallel sweeps instead of the token loop); both are finite and nonzero ...
  g_jac = grad(params, "jacobi")
  assert np.isfinite(float(g_jac["recurrence"]["gamma_rec"]))
  # ... and the same gradient: after T sweeps every cache on a gradient path is converged
  # (sweep k is exact at positions <= k), so the unrolled sweeps differentiate the same
  # function as BPTT, stop_gradients (residual_detach, the clipped norm's scale) included.
  for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(g_exact)[0],
                          jax.tree.leaves(g_jac)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7, err_msg=jax.tree_util.keystr(path))


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
  tol_cfg = cfg.replace(schedule_options=cfg.schedule_options.replace(jacobi_tol=1e-6))
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
  z = rec.carry(params, bf16, h, jnp.zeros((1, 2, cfg.d_model)), jnp.array([[2, 2]]))
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
  from model.test_recurrence_lrt import active as lrt_active, lrt_cfg
  from t2mlr_jax.model import modes as m
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
  d_backward alone above the config's d_forward is clamped too; each is validated alone."""
  from t2mlr_jax.model.modes import mode_options
  cfg = tiny_cfg(n_layers=3, recurrence=T2MLRConfig(l_start=1, l_end=1),
                 schedule_options=dict(d_forward=6, d_backward=4))
  resolved = lambda **kw: mode_options(cfg, "jacobi", 8, **kw)
  assert resolved() == {"d_forward": 6, "d_backward": 4, "jacobi_tol": None}
  assert resolved(d_forward=2) == {"d_forward": 2, "d_backward": 2, "jacobi_tol": None}
  assert resolved(d_backward=9) == {"d_forward": 6, "d_backward": 6, "jacobi_tol": None}
  assert resolved(d_forward=3, d_backward=1, jacobi_tol=0.1)["d_backward"] == 1
  params = active_params(cfg)
  tokens = random_tokens(cfg, 2, 8)
  _, aux = forward(params, cfg, tokens, mode="jacobi", d_forward=2, return_aux=True)
  assert int(aux["jacobi_sweeps"]) == 2
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


# ------------------------------------------------------- BPTT against finite differences


def directional_derivative_checks(loss_fn, params, groups, eps=0.1, rtol=1e-2, atol=3e-6,
                                  seed=0):
  """jax.grad of `loss_fn` against central finite differences along one random unit
  direction per group of leaves (`groups`: (name, keystr -> bool)). The differences are
  Richardson-extrapolated, (8·[f(ε) − f(−ε)] − [f(2ε) − f(−2ε)]) / 12ε, whose error is
  O(ε⁴), so a large ε keeps fp32 rounding of the loss (~1e-6) well below the tolerance.
  One compiled value_and_grad serves every evaluation."""
  value_and_grad = jax.jit(jax.value_and_grad(loss_fn))
  _, grad = value_and_grad(params)
  flat, treedef = jax.tree_util.tree_flatten_with_path(params)
  names = [jax.tree_util.keystr(path) for path, _ in flat]
  leaves = [leaf for _, leaf in flat]
  grads = jax.tree.leaves(grad)
  rng = np.random.RandomState(seed)

  def f(v, e):
    moved = [x + e * d for x, d in zip(leaves, v)]
    return float(value_and_grad(jax.tree.unflatten(treedef, moved))[0])

  for group, pick in groups:
    v = [np.asarray(rng.randn(*np.shape(x)), np.float32) * bool(pick(n))
         for n, x in zip(names, leaves)]
    norm = np.sqrt(sum(float(np.sum(d * d)) for d in v))
    assert norm > 0, f"group {group} selects no parameter"
    v = [d / norm for d in v]
    analytic = sum(float(np.vdot(np.asarray(g, np.float64), d)) for g, d in zip(grads, v))
    numeric = (8 * (f(v, eps) - f(v, -eps)) - (f(v, 2 * eps) - f(v, -2 * eps))) / (12 * eps)
    assert abs(analytic - numeric) <= atol + rtol * abs(analytic), (group, analytic, numeric)
    assert abs(analytic) > 10 * atol, (group, analytic)     # the check has something to see


def test_exact_bptt_gradient_matches_finite_differences():
  """Exact mode's gradient (backpropagation through the token-by-token recurrence) is the
  derivative of the loss: directional derivatives along random directions in W_rec, each
  gate, γ_rec/γ_cur, the cache norm's gain, a backbone weight (every layer's W_v) and all
  recurrence parameters at once agree with finite differences to 1%. The cache is fully
  differentiable here (residual_detach=False, learned-gain RMSNorm: no stop_gradient
  inside the recurrence) and the embeddings have std 0.5, so each direction's derivative
  is far above fp32 noise. The check has teeth: a gradient truncated to the last two
  steps (Jacobi with D_f = T, D_b = 1: the same forward) fails six of the seven
  directions (off by 30% to several times the derivative, signs flipped); the fully
  unrolled one (D_b = T) passes all."""
  rec = T2MLRConfig(l_start=1, l_end=1, residual_detach=False, cache_norm="rmsnorm")
  cfg = tiny_cfg(n_layers=3, recurrence=rec)
  params = active_params(cfg)
  params["embed"] = {"embedding": 25.0 * params["embed"]["embedding"]}
  tokens = jnp.asarray(random_tokens(cfg, 2, 8))
  import t2mlr_jax
  groups = [("w_rec", lambda n: "w_rec" in n), ("f_rec", lambda n: "f_rec" in n),
            ("f_cur", lambda n: "f_cur" in n), ("gammas", lambda n: "gamma" in n),
            ("cache_norm", lambda n: "cache_norm" in n),
            ("backbone W_v", lambda n: "['attn']['v']" in n),
            ("all recurrence", lambda n: "['recurrence']" in n)]
  directional_derivative_checks(lambda p: t2mlr_jax.loss(p, cfg, tokens, mode="exact"),
                                params, groups)


# ------------------------------------------------------------ aux values, recomputed by hand


def _hand_sweep(params, cfg, tokens, cf, h_lo=None, R=None):
  """One Jacobi step (docs/models.md#jacobi) written out: with h_lo=None, the layers
  below the span and sweep 0 (the plain middle block; its raw output, shifted, is the
  first cache); else one middle sweep from cache R. Returns (h_lo, next cache)."""
  from t2mlr_jax.model import modes
  from t2mlr_jax.model.recurrence import t2mlr as rec
  from t2mlr_jax.model.sequence import context
  from t2mlr_jax.model.span import previous_states
  from t2mlr_jax.model.transformer import embed, run_layers, segment_params
  inp = modes.seq_inputs(tokens, cf)
  x0 = embed(params, cfg, tokens)
  ctx = context(params, cfg, inp, tokens, x0)
  (_, lo, hi), = [s for s in cfg.segments if s[0] == "middle"]
  p_mid = segment_params(params, lo, hi)
  if h_lo is None:
    h_lo = run_layers(segment_params(params, 0, lo), cfg, x0, ctx, 0)[0] if lo else x0
    o = run_layers(p_mid, cfg, h_lo, ctx, lo)[0]
    return h_lo, previous_states(cfg, jnp.where((inp.control_flow == 0)[..., None], 0.0, o),
                                 inp.positions)
  x, _ = rec.enter(params, cfg, h_lo, R, inp.control_flow)
  o = run_layers(p_mid, cfg, x, ctx, lo)[0]
  return h_lo, previous_states(cfg, rec.carry(params, cfg, o, R, inp.control_flow),
                               inp.positions)


_hand_sweep = jax.jit(_hand_sweep, static_argnums=1)


def _hand_caches(params, cfg, tokens, cf, n):
  """(h_lo, [R_0, ..., R_n], [δ_0, ..., δ_n]) with δ_k = max|R_k − R_{k−1}|, R_{−1} = 0."""
  tokens, cf = jnp.asarray(tokens), jnp.asarray(cf)
  h, R = _hand_sweep(params, cfg, tokens, cf)
  Rs = [R]
  for _ in range(n):
    Rs.append(_hand_sweep(params, cfg, tokens, cf, h, Rs[-1])[1])
  deltas = [max_abs(Rs[0], 0.0)] + [max_abs(Rs[k], Rs[k - 1]) for k in range(1, n + 1)]
  return np.asarray(h, np.float64), Rs, deltas


def _hand_gate_means(p_rec, h, R, cf):
  """Mean σ(f_rec g), σ(f_cur g) with g = [h, W_rec R], over the cf = 2 positions, in fp64."""
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), p_rec)
  sig = lambda z: 1.0 / (1.0 + np.exp(-z))
  g = np.concatenate([h, np.asarray(R, np.float64) @ p["w_rec"]["kernel"]], axis=-1)
  w = (np.asarray(cf) == 2)[..., None]
  n = w.sum() * h.shape[-1]
  return tuple(float((sig(g @ p[k]["kernel"] + p[k]["bias"]) * w).sum() / n)
               for k in ("f_rec", "f_cur"))


def test_return_aux_values_by_hand():
  """Jacobi's aux (tolerance off): jacobi_sweeps = D_f; jacobi_residual = max|R_k − R_{k−1}|
  of the last sweep; gate_rec / gate_cur = the mean gates of the final pass over the cf = 2
  positions, all recomputed from sweeps written out by hand. Exact mode's mean gates are
  those at the converged cache."""
  cfg = tiny_cfg()
  params = active_params(cfg)
  tokens, cf = random_tokens(cfg, 2, T), CF[:2]       # row 1 has cf-1 positions: not averaged
  h, Rs, deltas = _hand_caches(params, cfg, tokens, cf, T)
  assert deltas[T] <= 1e-6 and min(deltas[1:T]) > 1e-2    # moving until T sweeps, then fixed
  for d_f, d_b in ((3, 1), (5, 2), (T + 1, 2)):
    _, aux = forward(params, cfg, tokens, mode="jacobi", d_forward=d_f, d_backward=d_b,
                     control_flow=cf, return_aux=True)
    assert int(aux["jacobi_sweeps"]) == d_f
    np.testing.assert_allclose(float(aux["jacobi_residual"]), deltas[d_f - 1], rtol=1e-5,
                               atol=1e-6, err_msg=f"D_f={d_f}")
    want = _hand_gate_means(params["recurrence"], h, Rs[d_f - 1], cf)
    np.testing.assert_allclose([float(aux["gate_rec"]), float(aux["gate_cur"])], want,
                               rtol=1e-5, err_msg=f"D_f={d_f}")
  _, aux = forward(params, cfg, tokens, mode="exact", control_flow=cf, return_aux=True)
  np.testing.assert_allclose([float(aux["gate_rec"]), float(aux["gate_cur"])],
                             _hand_gate_means(params["recurrence"], h, Rs[T], cf), rtol=1e-5)
  # the gates move with the cache: the unconverged D_f = 3 means are not the exact ones
  assert abs(_hand_gate_means(params["recurrence"], h, Rs[2], cf)[0] - float(aux["gate_rec"])) > 1e-3


def test_jacobi_tolerance_sweep_count_by_hand():
  """With jacobi_tol the no-gradient sweeps stop at the first k with δ_k < tol (capped at
  D_f − 1 − D_b), then the D_b gradient sweeps run: jacobi_sweeps = 1 + k + D_b and the
  residual is δ_{k + D_b}. Here the caches move (δ ≥ 0.6) until all T positions are
  exact, so a tolerance below every nonzero δ stops at k = T: 15 sweeps of the 40 allowed,
  residual 0, logits = exact."""
  cfg = tiny_cfg()
  params = active_params(cfg, gamma_rec=0.3)
  tokens = random_tokens(cfg, 2, T)
  cf = np.full((2, T), 2, np.int32)
  _, _, deltas = _hand_caches(params, cfg, tokens, cf, T + 2)
  tol = 0.5 * min(deltas[:T])
  d_f, d_b = 40, 2
  k = next(j for j in range(len(deltas)) if deltas[j] < tol)
  assert k == T
  tol_cfg = cfg.replace(schedule_options=cfg.schedule_options.replace(jacobi_tol=tol))
  logits, aux = forward(params, tol_cfg, tokens, mode="jacobi", d_forward=d_f, d_backward=d_b,
                        return_aux=True)
  assert int(aux["jacobi_sweeps"]) == 1 + k + d_b == T + 3
  assert float(aux["jacobi_residual"]) <= 1e-6 and deltas[k + d_b] <= 1e-6
  assert max_abs(logits, forward(params, cfg, tokens, mode="exact")) <= 1e-5


def test_jacobi_tolerance_does_not_stop_on_sweep_zero():
  """max|R_0| (sweep 0's raw middle output, 0.08 here) measures no convergence: a tolerance
  between it and the smallest real change (δ_k ≥ 0.6 for 1 <= k < T) must still sweep
  until the caches stop moving (k = T). Stopping on δ_0 ran no sweep and left the logits
  0.48 off the exact ones; `generate(prefill="jacobi", prefill_tol=...)` shares the loop
  (`schedules.jacobi._iterate`)."""
  cfg = tiny_cfg()
  params = active_params(cfg, gamma_rec=0.3)
  tokens = random_tokens(cfg, 2, T)
  _, _, deltas = _hand_caches(params, cfg, tokens, np.full((2, T), 2, np.int32), T)
  tol = float(np.sqrt(deltas[0] * min(deltas[1:T])))
  assert deltas[0] < tol < min(deltas[1:T])
  tol_cfg = cfg.replace(schedule_options=cfg.schedule_options.replace(jacobi_tol=tol))
  logits, aux = forward(params, tol_cfg, tokens, mode="jacobi", d_forward=40, d_backward=2,
                        return_aux=True)
  assert int(aux["jacobi_sweeps"]) == T + 3
  assert max_abs(logits, forward(params, cfg, tokens, mode="exact")) <= 1e-5
