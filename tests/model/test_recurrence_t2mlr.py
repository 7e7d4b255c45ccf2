"""The T2MLR fusion and cache update at initialisation and against docs/models.md#t2mlr by
hand."""

import jax
import jax.numpy as jnp
import numpy as np

from t2mlr_jax import T2MLRConfig, init_params
from t2mlr_jax.model.recurrence import t2mlr as rec
from t2mlr_jax.model.span import previous_states

from _util import tiny_cfg


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
