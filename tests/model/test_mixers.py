"""The fusion mixers (t2mlr_jax/model/mixers.py) against the official release's own mixing
modules (tests/golden/mixers_official_small.*, tests/golden/make_mixer_goldens.py): values
and gradients; their options' checks; a user's mixer training a tiny model."""

import dataclasses
import json
import os
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import t2mlr_jax
from t2mlr_jax import ModelConfig, T2MLRConfig, init_params
from t2mlr_jax.convert.official import mixer_params_from_official
from t2mlr_jax.losses import cross_entropy, next_token_labels
from t2mlr_jax.model import mixers
from t2mlr_jax.model.api import apply_model
from t2mlr_jax.registry import RECURRENCES
from t2mlr_jax.train.optimizer import no_decay_leaves

from _util import TESTS_DIR

GOLDEN = os.path.join(TESTS_DIR, "golden", "mixers_official_small")
META = json.load(open(GOLDEN + ".json"))
META["mixers"] = {case["mixer"] for case in META["cases"].values()}
TOL = 1e-5


@pytest.fixture(scope="module")
def golden():
  return dict(np.load(GOLDEN + ".npz"))


def _rel(got, want) -> float:
  """The largest difference relative to the value's largest magnitude, or to 0.1 for a
  smaller one: a gradient that sums many O(1) terms to near zero (γ_rec's, ~0.01) keeps
  fp32's absolute precision, not its relative one (each XLA:CPU code generator rounds it
  to within ~3e-7 of the release)."""
  return float(np.max(np.abs(np.asarray(got) - want)) / max(np.max(np.abs(want)), 0.1))


@pytest.mark.parametrize("case", sorted(META["cases"]))
def test_mixer_equals_the_release(golden, case):
  """Output and gradients (h, the state, every parameter) equal the release's, fp32."""
  spec = META["cases"][case]
  rcfg = T2MLRConfig(mixer=spec["mixer"], mixer_options=tuple(spec["mixer_options"].items()))
  D = META["shape"][-1]
  g = {k[len(case) + 1:]: v for k, v in golden.items() if k.startswith(case + "/")}
  sd = {k[len("param/"):]: v for k, v in g.items() if k.startswith("param/")}
  params = mixer_params_from_official(sd, rcfg, D)
  module = mixers.module_of(rcfg, D)

  def loss(params, h, prev):
    out, _ = module.apply({"params": params} if params else {}, h, prev)
    return jnp.sum(out * g["cot"]), out

  with jax.default_matmul_precision("highest"):
    grads, out = jax.grad(loss, argnums=(0, 1, 2), has_aux=True)(params, g["h"], g["prev"])
  errors = {"out": _rel(out, g["out"]), "grad_h": _rel(grads[1], g["grad_h"]),
            "grad_prev": _rel(grads[2], g["grad_prev"])}
  grads_official = {k[len("grad/"):]: v for k, v in g.items() if k.startswith("grad/")}
  ours = mixer_params_from_official(grads_official, rcfg, D)
  for path, want in jax.tree_util.tree_flatten_with_path(ours)[0]:
    got = grads[0]
    for p in path:
      got = got[p.key]
    errors[jax.tree_util.keystr(path)] = _rel(got, want)
  assert max(errors.values()) <= TOL, errors


def test_default_is_the_papers_fusion():
  """The default config names `gated` with no options; its parameters are Φ's 5D² + 2D + 2."""
  rcfg = T2MLRConfig()
  assert (rcfg.mixer, rcfg.mixer_options) == ("gated", ())
  assert mixers.num_params(rcfg, 8) == 5 * 64 + 2 * 8 + 2
  assert rcfg.mixer_flops(ModelConfig(d_model=8, n_heads=2, recurrence=rcfg), 3) == 2 * 5 * 64 * 3
  assert T2MLRConfig(mixer_options=(("normalize_gates", False),)) == rcfg  # defaults dropped
  assert T2MLRConfig(mixer_options=("normalize_gates=true",)).mixer_options == \
      (("normalize_gates", True),)


@pytest.mark.parametrize("options, field", [
    (("gate_proj_type=conv",), "recurrence.mixer_options.gate_proj_type"),
    ((("gate_mlp_activation", "sigmoid"),), "recurrence.mixer_options.gate_mlp_activation"),
    (("normalize_gates=maybe",), "recurrence.mixer_options.normalize_gates"),
    (("no_such_option=1",), "recurrence.mixer_options.no_such_option"),
])
def test_a_bad_option_is_one_error_naming_it(options, field):
  with pytest.raises(ValueError, match=field.replace(".", r"\.") + "=.*allowed"):
    T2MLRConfig(mixer_options=options)


def test_a_bad_mixer_is_one_error_naming_the_registered_ones():
  with pytest.raises(ValueError, match=r"recurrence\.mixer='nope' is invalid.*gated"):
    T2MLRConfig(mixer="nope")
  with pytest.raises(ValueError, match=r"mixer_options\.recurrent_alpha"):
    T2MLRConfig(mixer="none", mixer_options=(("recurrent_alpha", 0.3),))


@pytest.mark.parametrize("mixer", sorted(META["mixers"]))
def test_identity_at_init_is_what_a_fresh_init_computes(mixer):
  """A mixer declared the identity at init computes h from a fresh init (the T2MLR type
  lets a retrofit add it); any other is refused by the retrofit, naming the field."""
  rcfg = T2MLRConfig(mixer=mixer)
  h, prev = jax.random.normal(jax.random.PRNGKey(0), (2, 2, 3, 8))
  module = mixers.module_of(rcfg, 8)
  out, _ = module.apply(module.init(jax.random.PRNGKey(1), h, prev), h, prev)
  declared = mixers.MIXERS.get(mixer).identity_at_init
  identity = declared is not None and declared(mixers.options_of(rcfg))
  assert np.allclose(out, h, rtol=0, atol=1e-7) == identity
  if identity:
    assert RECURRENCES.get("t2mlr").retrofit(rcfg) == rcfg
  else:
    with pytest.raises(ValueError, match=r"recurrence\.mixer=.*allowed a mixer whose fresh"):
      RECURRENCES.get("t2mlr").retrofit(rcfg)


@dataclasses.dataclass(frozen=True)
class ScaledOptions:
  scale: float = 0.5

  def __post_init__(self):
    if not self.scale > 0:
      raise ValueError(f"scale={self.scale!r} is invalid: allowed > 0")


class ScaledMixer(nn.Module):
  """out = h + scale · tanh(w) ⊙ R (a user's mixer)."""
  opts: Any
  rcfg: Any
  d_model: int

  @nn.compact
  def __call__(self, h_BTD, prev_BTD):
    w = self.param("user_w", nn.initializers.constant(0.5), (self.d_model,), jnp.float32)
    gate = self.opts.scale * jnp.tanh(w)
    return h_BTD + gate * prev_BTD, mixers.GateStats(
        jnp.broadcast_to(gate, h_BTD.shape), jnp.ones_like(h_BTD))


@pytest.fixture
def user_mixer():
  entry = mixers.register(mixers.Mixer("user_scaled", ScaledMixer, ScaledOptions,
                                       no_decay=("user_w",), source=__name__))
  yield entry
  mixers.MIXERS.unregister("user_scaled")


def test_a_user_mixer_trains_a_tiny_model(user_mixer):
  """A registered user mixer: its options are checked, its no-decay leaf is declared, and
  two gradient steps of a tiny exact-mode model lower the loss."""
  with pytest.raises(ValueError, match=r"mixer_options\.scale=-1.*allowed > 0"):
    T2MLRConfig(mixer="user_scaled", mixer_options=(("scale", -1.0),))
  rcfg = T2MLRConfig(l_start=0, l_end=0, mixer="user_scaled", mixer_options=("scale=0.7",))
  cfg = ModelConfig(vocab_size=11, d_model=8, n_layers=2, n_heads=2, n_kv_heads=1, d_ff=16,
                    max_seq_len=8, recurrence=rcfg)
  assert "user_w" in no_decay_leaves(cfg)
  params = init_params(cfg, jax.random.PRNGKey(0))
  assert set(params["recurrence"]) == {"user_w"}
  tokens = jax.random.randint(jax.random.PRNGKey(1), (2, 6), 0, 11)

  @jax.jit
  def step(params):
    def loss_fn(p):
      logits, _ = apply_model(p, cfg, {"input_ids": tokens}, mode="exact")
      return cross_entropy(logits, next_token_labels(tokens))[0]
    loss, grads = jax.value_and_grad(loss_fn)(params)
    return loss, jax.tree_util.tree_map(lambda p, g: p - 0.5 * g, params, grads), grads

  loss0, params, grads = step(params)
  loss1, _, _ = step(params)
  assert float(jnp.abs(grads["recurrence"]["user_w"]).sum()) > 0
  assert float(loss1) < float(loss0)


@pytest.mark.slow     # one model per mixer, two compiles each
@pytest.mark.parametrize("case", ["concat", "constant_weight", "exponential_rotational_gated",
                                  "gated_mlp", "alpha_coupled", "var_norm_gated", "none"])
def test_every_mixer_runs_the_model_exact_and_jacobi_agree(golden, case):
  """Each mixer inside a tiny model, with the release golden's perturbed weights widened to
  the model: Jacobi with D_f covering every position equals the exact recurrence, and the
  state changes the logits (but for `none`)."""
  spec = META["cases"][case]
  rcfg = T2MLRConfig(l_start=0, l_end=0, mixer=spec["mixer"],
                     mixer_options=tuple(spec["mixer_options"].items()))
  cfg = ModelConfig(vocab_size=11, d_model=8, n_layers=2, n_heads=2, n_kv_heads=1, d_ff=16,
                    max_seq_len=8, recurrence=rcfg)
  params = init_params(cfg, jax.random.PRNGKey(0))
  sd = {k[len(case) + 7:]: v for k, v in golden.items() if k.startswith(case + "/param/")}
  params = {**params, "recurrence": mixer_params_from_official(sd, rcfg, 8)}
  tokens = jax.random.randint(jax.random.PRNGKey(1), (2, 6), 0, 11)
  exact = t2mlr_jax.forward(params, cfg, tokens, mode="exact")
  jacobi = t2mlr_jax.forward(params, cfg, tokens, mode="jacobi", d_forward=6, d_backward=2)
  plain = t2mlr_jax.forward(params, cfg, tokens, mode="parallel")
  np.testing.assert_allclose(jacobi, exact, atol=2e-5, rtol=0)
  assert (float(jnp.max(jnp.abs(exact - plain))) > 1e-3) == (case != "none")
