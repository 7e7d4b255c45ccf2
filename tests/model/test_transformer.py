"""The layer stack: cutting it into segments (forward slices, backward one concatenate)."""

import jax
import jax.numpy as jnp
import numpy as np

from t2mlr_jax.model.transformer import split_segments


def test_split_segments_values_and_gradient_equal_static_slices():
  rng = np.random.RandomState(0)
  tree = {"w": jnp.asarray(rng.randn(5, 3, 2), jnp.float32),
          "b": jnp.asarray(rng.randn(5, 2), jnp.float32)}
  parts = ((0, 2, False), (2, 4, True), (4, 5, False))
  coef = {"w": jnp.asarray(rng.randn(5, 3, 2), jnp.float32),
          "b": jnp.asarray(rng.randn(5, 2), jnp.float32)}

  def per_layer_loss(layer_tree, i):
    return sum(jnp.sum(jnp.sin(layer_tree[k]) * coef[k][i]) for k in layer_tree)

  def loss_split(t):
    lower, middle, upper = split_segments(t, parts)
    assert isinstance(middle, tuple) and len(middle) == 2
    assert lower["w"].shape == (2, 3, 2) and upper["b"].shape == (1, 2)
    total = sum(per_layer_loss(jax.tree.map(lambda a: a[j], lower), j) for j in range(2))
    total += sum(per_layer_loss(p, 2 + j) for j, p in enumerate(middle))
    return total + 0.0 * upper["w"].sum()        # an unused segment gets zero gradient

  def loss_ref(t):
    return sum(per_layer_loss(jax.tree.map(lambda a: a[i], t), i) for i in range(4))

  v, g = jax.value_and_grad(loss_split)(tree)
  v_ref, g_ref = jax.value_and_grad(loss_ref)(tree)
  np.testing.assert_allclose(float(v), float(v_ref), rtol=1e-6)
  for k in tree:
    np.testing.assert_allclose(np.asarray(g[k]), np.asarray(g_ref[k]), rtol=1e-6, atol=1e-7)
  np.testing.assert_array_equal(np.asarray(g["w"][4]), 0.0)
