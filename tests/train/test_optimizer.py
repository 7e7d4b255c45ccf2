"""Optimizer: schedule shape, weight-decay mask, the recurrence LR multiplier."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2mlr_jax import init_params
from t2mlr_jax.registry import RECURRENCES
from t2mlr_jax.train.config import base_config
from t2mlr_jax.train.optimizer import (
  OptimizerConfig,
  as_optimizer_config,
  decay_mask,
  make_optimizer,
  make_schedule,
)

from _util import REPO_ROOT, tiny_cfg


def _opt(**kw):
  return OptimizerConfig(**kw)


def test_make_optimizer_takes_the_typed_config_or_the_group():
  """The typed OptimizerConfig; an `optimizer` group (a saved one may lack newer fields)
  is typed first, with the same transform."""
  group = base_config().optimizer
  assert as_optimizer_config(group) == OptimizerConfig()
  old = {k: v for k, v in group.to_dict().items() if k != "recurrence_lr_mult"}
  assert as_optimizer_config({**old, "retired": 1}) == OptimizerConfig()
  params = {"w": jnp.ones((2, 3))}
  grads = {"w": jnp.full((2, 3), 0.5)}
  updates = [make_optimizer(oc, 10)[0].update(grads, make_optimizer(oc, 10)[0].init(params),
                                               params)[0]["w"] for oc in (group, _opt())]
  np.testing.assert_array_equal(updates[0], updates[1])


def test_schedule_warmup_then_cosine_to_min():
  sched = make_schedule(_opt(lr=1e-3, warmup_frac=0.1, min_lr_frac=0.01), 100)
  assert float(sched(0)) == 0.0
  assert float(sched(10)) == pytest.approx(1e-3)
  assert float(sched(5)) == pytest.approx(5e-4)
  assert float(sched(100)) == pytest.approx(1e-5)
  assert float(sched(55)) == pytest.approx(1e-5 + (1e-3 - 1e-5) * 0.5, rel=1e-3)


def test_decay_mask():
  params = init_params(tiny_cfg(), jax.random.PRNGKey(0))
  mask = decay_mask(params)
  assert mask["layers"]["mlp"]["up"]["kernel"] and mask["embed"]["embedding"]
  assert mask["recurrence"]["w_rec"]["kernel"]
  assert not mask["recurrence"]["gamma_rec"] and not mask["recurrence"]["gamma_cur"]
  assert not mask["recurrence"]["f_rec"]["bias"] and not mask["layers"]["attn_norm"]["scale"]
  assert not mask["final_norm"]["scale"]


def test_recurrence_lr_multiplier():
  params = init_params(tiny_cfg(), jax.random.PRNGKey(0))
  grads = jax.tree.map(lambda p: jnp.full_like(p, 0.1), params)
  updates = {}
  for mult in (1.0, 100.0):
    tx, _ = make_optimizer(_opt(lr=1e-3, warmup_frac=0.0, weight_decay=0.0, grad_clip=0.0,
                                recurrence_lr_mult=mult), 10)
    updates[mult], _ = tx.update(grads, tx.init(params), params)
  ratio = updates[100.0]["recurrence"]["w_rec"]["kernel"] / updates[1.0]["recurrence"]["w_rec"]["kernel"]
  np.testing.assert_allclose(ratio, 100.0, rtol=1e-5)
  np.testing.assert_array_equal(updates[100.0]["layers"]["mlp"]["up"]["kernel"],
                                updates[1.0]["layers"]["mlp"]["up"]["kernel"])


def _every_type_models():
  """A small model of every registered recurrence type on nanochat's backbone (norms
  without scales, α / β scalars), and the Llama backbone (scaled norms, biases), each
  with every parameter nonzero."""
  out = []
  for entry in RECURRENCES.values():
    rec = None if entry.config is None else entry.config()
    if hasattr(rec, "gate_channels"):
      rec = rec.replace(gate_channels=8)
    for backbone in (dict(resid_lambdas=True, x0_lambdas=True, norm_scale=False,
                          value_embeds=None), dict(qkv_bias=True)):
      cfg = tiny_cfg(recurrence=rec, **backbone)
      params = jax.tree.map(lambda p: p + 0.5, init_params(cfg, jax.random.PRNGKey(0)))
      out.append((entry, cfg, params))
  return out


def _paths_left_alone(tx, params) -> set:
  """Leaf paths a zero-gradient step of `tx` does not move (weight decay moves the rest)."""
  zero = jax.tree.map(jnp.zeros_like, params)
  upd, _ = tx.update(zero, tx.init(params), params)
  flat = jax.tree_util.tree_flatten_with_path(upd)[0]
  return {jax.tree_util.keystr(k) for k, u in flat if float(jnp.abs(u).max()) == 0.0}


def test_declared_no_decay_leaves_are_exactly_those_adamw_leaves_alone():
  """Under AdamW with weight decay, a zero-gradient update moves every leaf but the ones
  the backbone (`transformer.NO_DECAY`) and the model's recurrence type
  (`RecurrenceType.no_decay`) declare: no gate scalar of any registered type, no norm,
  bias or nanochat α / β decays (LRT's γ did before its type declared it)."""
  from t2mlr_jax.model import transformer
  checked = set()
  for entry, cfg, params in _every_type_models():
    declared = set(transformer.NO_DECAY) | set(entry.no_decay)
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    expected = {jax.tree_util.keystr(k) for k, _ in flat
                if str(getattr(k[-1], "key", k[-1])) in declared}
    tx, _ = make_optimizer(_opt(lr=1e-2, warmup_frac=0.0, weight_decay=0.5, grad_clip=0.0),
                           10, cfg)
    assert _paths_left_alone(tx, params) == expected, entry.name
    checked |= {str(getattr(k[-1], "key", k[-1])) for k, _ in flat
                if jax.tree_util.keystr(k) in expected}
  assert {"gamma_rec", "gamma_cur", "gamma", "resid_lambda", "x0_lambda", "scale",
          "bias"} <= checked


def test_every_family_declares_its_no_decay_leaves():
  """The same for each registered model family at its config's defaults (the plain
  transformer: norm scales; the LSTM: its biases)."""
  from t2mlr_jax.registry import FAMILIES
  for family in FAMILIES.values():
    cfg = family.config()
    params = jax.tree.map(lambda p: p + 0.5, family.init_params(cfg, jax.random.PRNGKey(0)))
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    expected = {jax.tree_util.keystr(k) for k, _ in flat
                if str(getattr(k[-1], "key", k[-1])) in family.no_decay}
    tx, _ = make_optimizer(_opt(lr=1e-2, warmup_frac=0.0, weight_decay=0.5, grad_clip=0.0),
                           10, cfg)
    assert expected and _paths_left_alone(tx, params) == expected, family.name


def test_gamma_gets_no_weight_decay():
  params = init_params(tiny_cfg(), jax.random.PRNGKey(0))
  params["recurrence"]["gamma_rec"] = jnp.float32(0.5)
  zero = jax.tree.map(jnp.zeros_like, params)
  tx, _ = make_optimizer(_opt(lr=1e-2, warmup_frac=0.0, weight_decay=0.5), 10)
  upd, _ = tx.update(zero, tx.init(params), params)
  assert float(upd["recurrence"]["gamma_rec"]) == 0.0
  assert float(jnp.abs(upd["recurrence"]["w_rec"]["kernel"]).max()) > 0


def _lrt_nanochat_params():
  from model.test_recurrence_lrt import lrt_cfg
  cfg = lrt_cfg(projection="shared")
  return cfg, init_params(cfg, jax.random.PRNGKey(0))


def test_muon_groups_follow_nanochat():
  from t2mlr_jax.train.optimizer import param_groups
  cfg, params = _lrt_nanochat_params()
  g = param_groups(params)
  layers = g["layers"]
  for name in ("q", "k", "v", "o"):
    assert layers["attn"][name]["kernel"] == "matrices"
  assert layers["mlp"]["up"]["kernel"] == layers["mlp"]["down"]["kernel"] == "matrices"
  assert layers["memory"]["gate"] == "matrices"                   # [L, C, 3M] per layer 2-D
  assert g["recurrence"]["w_k"] == g["recurrence"]["w_v"] == "matrices"   # shared [D, kv]
  assert g["embed"]["embedding"] == "embeddings" and layers["memory"]["ve"] == "embeddings"
  assert g["lm_head"]["kernel"] == "unembedding"
  for scalar in (layers["resid_lambda"], layers["x0_lambda"], layers["memory"]["gamma"]):
    assert scalar == "scalars"
  # the Llama backbone with T2MLR: norm scales and gate biases are scalars, W_rec a matrix
  t = param_groups(init_params(tiny_cfg(), jax.random.PRNGKey(0)))
  assert t["layers"]["attn_norm"]["scale"] == t["final_norm"]["scale"] == "scalars"
  assert t["recurrence"]["w_rec"]["kernel"] == "matrices"
  assert t["recurrence"]["f_rec"]["bias"] == t["recurrence"]["gamma_rec"] == "scalars"
  assert set(jax.tree.leaves(g)) | set(jax.tree.leaves(t)) == {
      "matrices", "embeddings", "unembedding", "scalars"}


def test_muon_orthogonalizes_each_stacked_layer_on_its_own():
  """The stacked [L, in, out] kernels get Muon per layer (the layer axis a batch axis):
  layer i's first update equals optax's Muon on that 2-D matrix alone, with the group LRs."""
  from optax import contrib
  cfg, params = _lrt_nanochat_params()
  oc = _opt(name="muon", warmup_frac=0.0, min_lr_frac=1.0, grad_clip=0.0,
            dmodel_lr_scale=False)
  tx, schedule = make_optimizer(oc, 10, cfg)
  grads = jax.tree.map(lambda p: jax.random.normal(jax.random.PRNGKey(p.size), p.shape),
                       params)
  upd, _ = tx.update(grads, tx.init(params), params)
  assert float(schedule(0)) == pytest.approx(oc.matrix_lr)
  g_up = grads["layers"]["mlp"]["up"]["kernel"]
  ref_tx = contrib.muon(oc.matrix_lr, beta=oc.muon_momentum, weight_decay=oc.weight_decay)
  for i in range(cfg.n_layers):
    ref, _ = ref_tx.update(g_up[i], ref_tx.init(g_up[i]), params["layers"]["mlp"]["up"]["kernel"][i])
    np.testing.assert_allclose(upd["layers"]["mlp"]["up"]["kernel"][i], ref, rtol=2e-4, atol=1e-6)
  # AdamW groups: the first Adam step is -lr·sign(g) (up to eps)
  for leaf, lr in ((upd["embed"]["embedding"], oc.embedding_lr),
                   (upd["lm_head"]["kernel"], oc.unembedding_lr),
                   (upd["layers"]["memory"]["gamma"], oc.scalar_lr),
                   (upd["layers"]["resid_lambda"], oc.scalar_lr * 0.01)):
    np.testing.assert_allclose(np.abs(np.asarray(leaf)), lr, rtol=1e-3)


def test_recurrence_lr_mult_under_muon_scales_every_recurrence_leaf():
  cfg, params = _lrt_nanochat_params()
  grads = jax.tree.map(lambda p: jnp.full_like(p, 0.1), params)
  upd = {}
  for mult in (1.0, 10.0):
    tx, _ = make_optimizer(_opt(name="muon", warmup_frac=0.0, grad_clip=0.0,
                                recurrence_lr_mult=mult), 10, cfg)
    upd[mult], _ = tx.update(grads, tx.init(params), params)
  for path in (("recurrence", "w_k"), ("layers", "memory", "gamma"), ("layers", "memory", "ve")):
    a, b = upd[10.0], upd[1.0]
    for k in path:
      a, b = a[k], b[k]
    np.testing.assert_allclose(a, 10.0 * b, rtol=1e-5)
  np.testing.assert_array_equal(upd[10.0]["layers"]["mlp"]["up"]["kernel"],
                                upd[1.0]["layers"]["mlp"]["up"]["kernel"])


def test_bad_optimizer_name_or_group_option_is_a_clear_error():
  from t2mlr_jax.train.config import validate
  with pytest.raises(ValueError, match=r"optimizer.name='lion' is invalid: allowed one of \('adamw', 'muon'\)"):
    make_optimizer(_opt(name="lion"), 10)
  import os
  import sys
  sys.path.insert(0, os.path.join(REPO_ROOT, "configs"))
  import lrt_nanochat
  for field, value, allowed in (("matrix_lr", 0.0, "> 0"), ("adam_b1", 1.5, "in \\[0, 1\\)"),
                                ("muon_momentum", -0.1, "in \\[0, 1\\)")):
    c = lrt_nanochat.get_config("tiny")
    c.optimizer[field] = value
    with pytest.raises(ValueError, match=f"optimizer.{field}={value!r} is invalid: allowed {allowed}"):
      validate(c)


def test_freeze_base_model_updates_and_keeps_state_for_the_recurrence_alone():
  """optimizer.freeze_base_model (the release's option): every base leaf gets a zero update
  and no optimizer state (AdamW's and Muon's moments cover the recurrence's leaves only);
  the recurrence's updates equal an unfrozen optimizer's over the recurrence alone (the
  clip's norm is theirs)."""
  cfg = tiny_cfg()
  params = init_params(cfg, jax.random.PRNGKey(0))
  grads = jax.tree.map(lambda p: jnp.full_like(p, 0.3), params)
  rec_size = sum(x.size for x in jax.tree.leaves(params["recurrence"]))
  for name in ("adamw", "muon"):
    tx, _ = make_optimizer(_opt(name=name, warmup_frac=0.0, freeze_base_model=True), 10, cfg)
    state = tx.init(params)
    upd, _ = tx.update(grads, state, params)
    for path, u in jax.tree_util.tree_flatten_with_path(upd)[0]:
      moved = float(jnp.abs(u).max()) > 0
      assert moved == (jax.tree_util.keystr(path).startswith("['recurrence']")), (name, path)
    alone, _ = make_optimizer(_opt(name=name, warmup_frac=0.0), 10, cfg)
    alone_state = alone.init(params["recurrence"])
    # the frozen optimizer's moments are those of the recurrence alone (step counts aside)
    moments = lambda s: sum(np.size(x) for x in jax.tree.leaves(s) if np.size(x) > 1)
    assert moments(state) == moments(alone_state) >= rec_size, name
    rec_upd, _ = alone.update(grads["recurrence"], alone_state, params["recurrence"])
    for a, b in zip(jax.tree.leaves(upd["recurrence"]), jax.tree.leaves(rec_upd)):
      np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-9)


def test_freeze_base_model_without_a_recurrence_is_refused():
  with pytest.raises(ValueError, match=r"optimizer.freeze_base_model=True .*model.recurrence"):
    make_optimizer(_opt(freeze_base_model=True), 10, tiny_cfg(recurrence=None))
