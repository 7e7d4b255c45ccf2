"""The T2MLR fusion and cache update at initialisation and against docs/models.md#t2mlr by
hand."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import t2mlr_jax
from t2mlr_jax import T2MLRConfig, forward, generate, init_params
from t2mlr_jax.model.recurrence import t2mlr as rec
from t2mlr_jax.model.span import previous_states

from _util import active_params, max_abs, random_tokens, tiny_cfg


def test_initialisation():
  cfg = tiny_cfg(recurrence=T2MLRConfig(l_start=1, l_end=2, gate_init=0.25, gate_gain=0.5))
  H = cfg.d_model
  p = init_params(cfg, jax.random.PRNGKey(0))["recurrence"]
  assert set(p) == {"gamma_rec", "gamma_cur", "w_rec", "f_rec", "f_cur"}
  assert sum(x.size for x in jax.tree.leaves(p)) == 5 * H * H + 2 * H + 2
  assert float(p["gamma_rec"]) == 0.0 and float(p["gamma_cur"]) == 0.0
  assert p["gamma_rec"].dtype == jnp.float32
  np.testing.assert_allclose(p["f_rec"]["bias"], np.log(0.25 / 0.75), rtol=1e-6)
  assert p["f_rec"]["kernel"].shape == (2 * H, H)
  # Xavier-normal with gain 0.5: std = 0.5 * sqrt(2 / (2H + H))
  assert abs(float(jnp.std(p["f_cur"]["kernel"])) / (0.5 * np.sqrt(2 / (3 * H))) - 1) < 0.1
  w = p["w_rec"]["kernel"]
  assert float(jnp.max(jnp.abs(w))) <= 1 / np.sqrt(H) and float(jnp.std(w)) > 0.3 / np.sqrt(H)


def test_enter_and_carry_by_hand():
  cfg = tiny_cfg()
  H = cfg.d_model
  p = init_params(cfg, jax.random.PRNGKey(1))["recurrence"]
  p = {**p, "gamma_rec": jnp.float32(0.7), "gamma_cur": jnp.float32(-0.3)}
  k1, k2 = jax.random.split(jax.random.PRNGKey(2))
  h, R = jax.random.normal(k1, (1, 3, H)), jax.random.normal(k2, (1, 3, H))
  cf = jnp.array([[0, 1, 2]])
  out, _ = rec.enter({"recurrence": p}, cfg, h, R, cf)
  r = R @ p["w_rec"]["kernel"]
  g = jnp.concatenate([h, r], -1)
  s_rec = jax.nn.sigmoid(g @ p["f_rec"]["kernel"] + p["f_rec"]["bias"])
  s_cur = jax.nn.sigmoid(g @ p["f_cur"]["kernel"] + p["f_cur"]["bias"])
  phi = h + np.tanh(0.7) * s_rec * r + np.tanh(-0.3) * s_cur * h
  np.testing.assert_allclose(out[0, 2], phi[0, 2], atol=1e-5)
  np.testing.assert_array_equal(out[0, :2], h[0, :2])      # cf 0/1: unchanged

  o = 10.0 * jax.random.normal(k1, (1, 3, H))
  z = rec.carry({"recurrence": p}, cfg, o, R, cf)
  zz = o[0, 2] + R[0, 2]
  scale = np.clip(1 / np.sqrt(np.mean(zz ** 2) + 1e-6), 0.2, 5.0)
  np.testing.assert_allclose(z[0, 2], zz * scale, rtol=1e-5)
  np.testing.assert_array_equal(z[0, 1], o[0, 1])           # cf 1: raw output
  np.testing.assert_array_equal(z[0, 0], np.zeros(H))        # cf 0: zeros


def test_shift_resets_at_segment_starts():
  Z = jnp.arange(1.0, 7.0).reshape(1, 6, 1)
  pos = jnp.array([[0, 1, 2, 0, 1, 2]])
  np.testing.assert_array_equal(previous_states(tiny_cfg(), Z, pos)[0, :, 0],
                                [0, 1, 2, 0, 4, 5])


@pytest.mark.slow       # four gradient programs (~25 s); test_golden.py checks the option's forward
def test_connection_detach_cuts_the_gradient_through_time_alone():
  """`connection_detach` (the release's option) reads the state as a constant: the forward
  is unchanged; the gradient is the same in exact mode and under Jacobi at its fixed point
  with D_b > 1 (no gradient crosses a state), and differs
  from both the full one (exact mode's) and the truncated one of Jacobi with D_b = 1,
  which still crosses one state."""
  base = T2MLRConfig(l_start=1, l_end=2, residual_detach=False)
  cfg = tiny_cfg(recurrence=base)
  cut = tiny_cfg(recurrence=base.replace(connection_detach=True))
  params = active_params(cfg)
  tokens = jnp.asarray(random_tokens(cfg, 2, 8))
  assert max_abs(forward(params, cfg, tokens, mode="exact"),
                 forward(params, cut, tokens, mode="exact")) == 0.0

  def grad(c, mode, **kw):
    return jax.jit(jax.grad(lambda p: t2mlr_jax.loss(p, c, tokens, mode=mode, **kw)))(params)

  def gap(a, b):
    return max(float(jnp.max(jnp.abs(x - y)) / (jnp.max(jnp.abs(x)) + 1e-6))
               for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
  detached = grad(cut, "exact")
  assert gap(detached, grad(cut, "jacobi", d_forward=8, d_backward=4)) <= 1e-5
  assert gap(detached, grad(cfg, "exact")) > 0.1
  assert gap(detached, grad(cfg, "jacobi", d_forward=8, d_backward=1)) > 0.1


def test_skip_to_l_end_and_residual_weight_by_hand():
  """The release's recurrent_skip_to_l_end (weight, detach, post-norm with eps and clamp)
  and its residual weight, against their formulas written out: the skip adds
  w·R_t · sg(clip(1/√(mean((w·R_t)²) + eps), 1/c, c)) to l_end's output at recurrent
  positions only; the state of a recurrent position is clipped_rms(o + w·R_t)."""
  rng = np.random.default_rng(0)
  D = 32
  o, prev = (jnp.asarray(3.0 * rng.normal(size=(2, 5, D)), jnp.float32) for _ in range(2))
  cf = jnp.asarray([[2, 2, 1, 2, 0], [1, 2, 2, 2, 2]], jnp.int32)
  rcfg = T2MLRConfig(l_start=1, l_end=2, residual=False, skip_to_l_end=True, skip_weight=0.7,
                     skip_post_norm=True, skip_post_norm_eps=1e-3, skip_post_norm_clamp=2.0)
  cfg = tiny_cfg(recurrence=rcfg)
  params = init_params(cfg, jax.random.PRNGKey(0))
  y = 0.7 * prev
  scale = jnp.clip(1 / jnp.sqrt(jnp.mean(y * y, -1, keepdims=True) + 1e-3), 0.5, 2.0)
  want = o + jnp.where((cf == 2)[..., None], y * scale, 0.0)
  np.testing.assert_allclose(rec.span_exit(params, cfg, o, prev, cf), want, rtol=1e-6)
  # the state is l_end's output with the skip (no residual), raw at cf 1, zero at padding
  out = rec.span_exit(params, cfg, o, prev, cf)
  state = rec.carry(params, cfg, out, prev, cf)
  np.testing.assert_allclose(state, jnp.where((cf == 0)[..., None], 0.0, out), rtol=1e-6)
  # gradient into R_t through the skip: w·scale at recurrent positions, none with skip_detach
  g = jax.grad(lambda p, c: jnp.sum(rec.span_exit(params, c, o, p, cf)))
  np.testing.assert_allclose(g(prev, cfg), jnp.where((cf == 2)[..., None],
                                                     0.7 * scale * jnp.ones_like(prev), 0.0),
                             rtol=1e-6)
  detached = tiny_cfg(recurrence=rcfg.replace(skip_detach=True))
  assert float(jnp.max(jnp.abs(g(prev, detached)))) == 0.0
  # off: o as it is
  plain = tiny_cfg(recurrence=T2MLRConfig(l_start=1, l_end=2))
  assert rec.span_exit(params, plain, o, prev, cf) is o
  # residual weight: z = clipped_rms(o + w·R_t) at recurrent positions
  weighted = tiny_cfg(recurrence=T2MLRConfig(l_start=1, l_end=2, residual_weight=0.3))
  z = o + 0.3 * prev
  z = z * jnp.clip(1 / jnp.sqrt(jnp.mean(z * z, -1, keepdims=True) + 1e-6), 0.2, 5.0)
  want = jnp.where((cf == 2)[..., None], z, jnp.where((cf == 1)[..., None], o, 0.0))
  np.testing.assert_allclose(rec.carry(params, weighted, o, prev, cf), want, rtol=1e-5,
                             atol=1e-6)
  with pytest.raises(ValueError, match="skip_to_l_end=True needs recurrence.residual=False"):
    T2MLRConfig(skip_to_l_end=True)
  with pytest.raises(ValueError, match="skip_post_norm_clamp"):
    T2MLRConfig(residual=False, skip_to_l_end=True, skip_post_norm_clamp=0.5)


@pytest.mark.parametrize("options", [
    dict(residual=False, skip_to_l_end=True, skip_weight=0.5, skip_post_norm=True),
    pytest.param(dict(residual_weight=0.5), marks=pytest.mark.slow)])   # the second: slow step
def test_release_state_options_hold_in_every_mode_and_in_decode(options):
  """With the skip to l_end or a residual weight, Jacobi at D_f = T equals exact mode,
  KV-cached decoding's logits equal exact mode's teacher-forced ones, and the option
  changes what the model computes."""
  cfg = tiny_cfg(recurrence=T2MLRConfig(l_start=1, l_end=2, **options))
  params = active_params(cfg)
  tokens = random_tokens(cfg, 2, 10)
  exact = forward(params, cfg, tokens, mode="exact")
  assert max_abs(exact, forward(params, cfg, tokens, mode="jacobi", d_forward=10,
                                d_backward=2)) <= 1e-5
  assert max_abs(exact, forward(params, tiny_cfg(), tokens, mode="exact")) > 1e-3
  new, logits = generate(params, cfg, tokens[:, :4], max_new_tokens=6, return_logits=True)
  seq = np.concatenate([tokens[:, :4], np.asarray(new)], axis=1)
  teacher = forward(params, cfg, seq, mode="exact")[:, 3:-1]
  assert max_abs(logits, teacher) <= 1e-4


def _release_curriculum(start, end, total, schedule, warmup, step):
  """The official release's RecurrentWeightCurriculumScheduler.get_value, restated."""
  warmup = total if warmup is None else warmup
  if step >= warmup:
    return end
  if step <= 0:
    return start
  p = step / warmup
  f = {"linear": p, "cosine": (1 - np.cos(p * np.pi)) / 2, "exponential": p ** 2,
       "step": 1.0 if p >= 0.5 else 0.0}[schedule]
  return start + (end - start) * f


FIXED_GATE = ("use_learnable_recurrent_gate=False", "rezero_gamma_recurrent_gate_init=0.5")


@pytest.mark.parametrize("schedule", rec.CURRICULUM_SCHEDULES)
def test_the_curriculum_follows_the_release_scheduler(schedule):
  """Every schedule, warm-up given in steps, as a ratio of the run, or the whole run, at
  every step and past the end."""
  total = 20
  for warm in ({"recurrent_weight_curriculum_warmup_steps": 8},
               {"recurrent_weight_curriculum_warmup_ratio": 0.3}, {}):
    rcfg = T2MLRConfig(mixer_options=FIXED_GATE, use_recurrent_weight_curriculum=True,
                       recurrent_weight_curriculum_start=0.2,
                       recurrent_weight_curriculum_end=0.9,
                       recurrent_weight_curriculum_schedule=schedule, **warm)
    steps = warm.get("recurrent_weight_curriculum_warmup_steps")
    if "recurrent_weight_curriculum_warmup_ratio" in warm:
      steps = int(total * warm["recurrent_weight_curriculum_warmup_ratio"])
    for step in range(total + 3):
      want = _release_curriculum(0.2, 0.9, total, schedule, steps, step)
      got = float(jax.jit(lambda s: rec.curriculum_weight(rcfg, s, total))(step))
      assert got == pytest.approx(want, abs=1e-6), (warm, step)


def test_the_curriculum_is_refused_where_it_would_move_nothing_or_is_misread():
  with pytest.raises(ValueError, match=r"use_recurrent_weight_curriculum=True .* mixer 'gated'"
                                       r".*use_learnable_recurrent_gate=False"):
    T2MLRConfig(use_recurrent_weight_curriculum=True)          # Φ's gate is learned
  with pytest.raises(ValueError, match=r"recurrent_weight_curriculum_schedule='warm' is "
                                       r"invalid: allowed one of \('linear'"):
    T2MLRConfig(recurrent_weight_curriculum_schedule="warm")
  with pytest.raises(ValueError, match=r"warmup_steps=4 and .*warmup_ratio=0.5 are both set"):
    T2MLRConfig(recurrent_weight_curriculum_warmup_steps=4,
                recurrent_weight_curriculum_warmup_ratio=0.5)
  rcfg = T2MLRConfig(mixer_options=FIXED_GATE, use_recurrent_weight_curriculum=True,
                     recurrent_weight_curriculum_warmup_steps=30)
  with pytest.raises(ValueError, match=r"warmup_steps=30 is invalid: allowed at most the "
                                       r"run's 10 train steps"):
    rec.curriculum_weight(rcfg, 0, 10)
  for mixer, opts in (("alpha_coupled", ()), ("var_norm_gated", ())):
    T2MLRConfig(mixer=mixer, mixer_options=opts, use_recurrent_weight_curriculum=True)


@pytest.mark.parametrize("mixer,options", [("gated", FIXED_GATE),
                                           pytest.param("alpha_coupled",
                                                        ("rezero_gamma_init=0.5",),
                                                        marks=pytest.mark.slow)])
def test_the_curriculum_leaf_is_the_fixed_weight_in_every_mode_and_in_decode(mixer, options):
  """Under the curriculum the mixer's fixed recurrent weight is a leaf that starts at the
  curriculum's start; holding w it computes what the fixed option recurrent_weight=w
  computes (exact, Jacobi, decode), and it gets no gradient."""
  cfg = tiny_cfg(recurrence=T2MLRConfig(
      l_start=1, l_end=2, mixer=mixer, mixer_options=options,
      use_recurrent_weight_curriculum=True, recurrent_weight_curriculum_start=0.25))
  params = init_params(cfg, jax.random.PRNGKey(0))
  assert float(params["recurrence"]["recurrent_weight"]) == 0.25
  params = {**params, "recurrence": {**params["recurrence"], "recurrent_weight": jnp.float32(0.7)}}
  fixed = tiny_cfg(recurrence=T2MLRConfig(l_start=1, l_end=2, mixer=mixer,
                                          mixer_options=options + ("recurrent_weight=0.7",)))
  same = {**params, "recurrence": {k: v for k, v in params["recurrence"].items()
                                   if k != "recurrent_weight"}}
  tokens = random_tokens(cfg, 2, 9, seed=3)
  for mode, kw in (("exact", {}), ("jacobi", dict(d_forward=9, d_backward=2))):
    a = forward(params, cfg, tokens, mode=mode, **kw)
    assert max_abs(a, forward(same, fixed, tokens, mode=mode, **kw)) <= 1e-6, mode
  other = {**params, "recurrence": {**params["recurrence"], "recurrent_weight": jnp.float32(0.1)}}
  assert max_abs(forward(other, cfg, tokens, mode="exact"), a) > 1e-3     # it is read
  new, logits = generate(params, cfg, tokens[:, :5], max_new_tokens=4, return_logits=True)
  new_fixed, logits_fixed = generate(same, fixed, tokens[:, :5], max_new_tokens=4,
                                     return_logits=True)
  np.testing.assert_array_equal(new, new_fixed)
  assert max_abs(logits, logits_fixed) <= 1e-6
  grads = jax.grad(lambda p: jnp.sum(forward(p, cfg, tokens, mode="exact") ** 2))(params)
  assert float(grads["recurrence"]["recurrent_weight"]) == 0.0
