"""Mesh construction, the partition-spec table, and sharded == single-device training."""

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from t2mlr_jax import ModelConfig, T2MLRConfig, sharding
from t2mlr_jax.train.config import base_config
from t2mlr_jax.train.optimizer import make_optimizer
from t2mlr_jax.train.step import create_state, make_train_step, state_shardings

from _util import random_tokens


def test_make_mesh():
  assert len(jax.devices()) == 8
  mesh = sharding.make_mesh({"data": -1, "fsdp": 2, "tensor": 2})
  assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}
  with pytest.raises(ValueError, match="needs 12 devices"):
    sharding.make_mesh({"data": 3, "fsdp": 2, "tensor": 2})
  with pytest.raises(ValueError, match="unknown axes"):
    sharding.make_mesh({"model": 2})
  single = sharding.make_mesh({"data": 1}, devices=jax.devices()[:1])
  assert single.size == 1


def test_spec_table_replicates_what_does_not_divide():
  mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  cfg = ModelConfig.preset("smollm2-135m")          # 9 heads, 3 kv heads
  assert sharding.spec_for("layers/attn/q/kernel", (30, 576, 576), mesh, cfg) == \
      P(None, "fsdp", None)                          # 9 heads on tensor=2: replicated
  assert sharding.spec_for("layers/mlp/up/kernel", (30, 576, 1536), mesh, cfg) == \
      P(None, "fsdp", "tensor")
  assert sharding.spec_for("layers/mlp/down/kernel", (30, 1536, 576), mesh, cfg) == \
      P(None, "tensor", "fsdp")
  assert sharding.spec_for("embed/embedding", (49152, 576), mesh, cfg) == P("tensor", "fsdp")
  assert sharding.spec_for("layers/attn_norm/scale", (30, 576), mesh, cfg) == P()
  even = cfg.replace(n_heads=8, n_kv_heads=4, head_dim=72)
  assert sharding.spec_for("layers/attn/k/kernel", (30, 576, 288), mesh, even) == \
      P(None, "fsdp", "tensor")
  # optimizer-state leaves ending in a parameter path get the same spec
  assert sharding.spec_for("opt_state/1/0/mu/layers/mlp/up/kernel", (30, 576, 1536), mesh,
                           cfg) == P(None, "fsdp", "tensor")


def _two_steps(cfg, mesh, batch, inspect=None):
  """(loss, params on the host, state) after two Jacobi train steps of cfg over mesh;
  inspect(step, state, placed batch, state shardings) runs before them."""
  oc = base_config().optimizer
  # Adam divides by sqrt(v) + eps: a larger eps keeps reduction-order noise in tiny
  # gradients from being amplified to lr-sized differences.
  oc.update(lr=1e-2, eps=1e-3)
  tx, schedule = make_optimizer(oc, 10)
  state = create_state(cfg, tx, jax.random.PRNGKey(0), mesh)
  step = make_train_step(cfg, tx, schedule, "jacobi", mesh)
  placed = {k: jax.device_put(v, sharding.batch_sharding(mesh)) for k, v in batch.items()}
  if inspect is not None:
    inspect(step, state, placed, state_shardings(cfg, tx, mesh))
  for _ in range(2):
    state, metrics = step(state, placed)
  return float(metrics["loss"]), jax.device_get(state.params), state


def _lm_batch(cfg):
  tokens = random_tokens(cfg, 8, 16)
  return {"input_ids": tokens, "target_ids": np.roll(tokens, -1, axis=1),
          "control_flow": np.full(tokens.shape, 2, np.int32)}


def _assert_same(results):
  (loss1, p1, _), (loss8, p8, _) = results
  assert abs(loss1 - loss8) <= 1e-5
  for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p8)):
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)


def test_train_step_on_2x2x2_mesh_equals_one_device():
  cfg = ModelConfig(vocab_size=40, d_model=32, n_layers=3, n_heads=4, n_kv_heads=1, d_ff=64,
                    max_seq_len=64, recurrence=T2MLRConfig(l_start=1, l_end=1),
                    schedule_options=dict(d_forward=4, d_backward=2))

  def inspect(step, state, placed, shardings):
    assert state.params["layers"]["mlp"]["up"]["kernel"].sharding == \
        shardings.params["layers"]["mlp"]["up"]["kernel"]
    if state.params["embed"]["embedding"].sharding.mesh.size == 8:
      # activations constrained to the batch layout between layers
      text = step.lower(state, placed).as_text()
      constrained = [line for line in text.splitlines() if "sharding_constraint" in line]
      assert len(constrained) >= cfg.n_layers
      assert all('[{"data", "fsdp"}, {}, {}]' in line for line in constrained)

  batch = _lm_batch(cfg)
  _assert_same([_two_steps(cfg, mesh, batch, inspect) for mesh in (
      sharding.make_mesh({"data": 1}, devices=jax.devices()[:1]),
      sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2}))])


def test_process_batch_slot_single_process_and_mesh_axis_types():
  import jax

  from t2mlr_jax import sharding
  mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  assert all(t == jax.sharding.AxisType.Auto for t in mesh.axis_types)
  assert sharding.process_batch_slot(mesh, 16) == (0, 1)
  assert sharding.process_batch_slot(sharding.make_mesh({"tensor": -1}), 8) == (0, 1)


def test_evaluation_split_like_training_equals_the_unsharded_one():
  """Eval batches placed over the 2x2x2 mesh's batch axes (6 rows: padded to 8 with
  unsupervised rows) give the same predictions, loss and metrics as one device; the
  compiled eval's inputs are split over ('data', 'fsdp')."""
  from t2mlr_jax.data import s5, s5_examples
  from t2mlr_jax.eval.runner import evaluate
  from t2mlr_jax.eval.s5 import S5Metrics
  from t2mlr_jax.train.step import create_state
  cfg = ModelConfig(vocab_size=188, d_model=32, n_layers=3, n_heads=4, d_ff=64,
                    max_seq_len=64, recurrence=T2MLRConfig(l_start=1, l_end=1))
  mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  tx, _ = make_optimizer(base_config().optimizer, 10)
  params = create_state(cfg, tx, jax.random.PRNGKey(0), mesh).params
  batch = s5.pad_batch([s5_examples.generate_example(seed=i, num_actions=3, group="S3",
                                                    value_len=1) for i in range(6)],
                       seq_len=20)
  placed, rows = sharding.shard_eval_batch(batch, mesh, {"target_ids": -100})
  assert rows == 6 and placed["input_ids"].shape == (8, 20)
  assert placed["input_ids"].sharding.spec == P(("data", "fsdp"), None)
  assert (np.asarray(placed["target_ids"])[6:] == -100).all()
  plain = evaluate(jax.device_get(params), cfg, [batch], S5Metrics)
  split = evaluate(params, cfg, [batch], S5Metrics, mesh=mesh)
  assert split["num_examples"] == plain["num_examples"] == 6
  for k, v in plain.items():
    if isinstance(v, float):
      assert split[k] == pytest.approx(v, abs=1e-6), k
    else:
      assert split[k] == v, k


def test_fsdp_that_does_not_divide_the_width_is_factored_and_the_step_is_unchanged():
  """fsdp = 8 on d_model 36: the mesh factors it as fsdp 4 x fsdp_inner 2 (4 divides 36),
  so a 36 x 36 matrix splits over both of its dimensions instead of staying whole; the
  batch splits over all 8 devices; the step equals the single-device one."""
  cfg = ModelConfig(vocab_size=40, d_model=36, n_layers=3, n_heads=3, n_kv_heads=3, d_ff=64,
                    max_seq_len=64, recurrence=T2MLRConfig(l_start=1, l_end=1),
                    schedule_options=dict(d_forward=4, d_backward=2))
  assert sharding.fsdp_factors(8, 36) == (4, 2) and sharding.fsdp_factors(8, 32) == (8, 1)
  mesh = sharding.make_mesh({"data": 1, "fsdp": -1}, model_width=cfg.d_model)
  assert dict(mesh.shape) == {"data": 1, "fsdp": 4, "fsdp_inner": 2, "tensor": 1}
  assert sharding.batch_divisor(mesh) == 8
  assert sharding.spec_for("layers/attn/q/kernel", (3, 36, 36), mesh, cfg) == \
      P(None, "fsdp", "fsdp_inner")
  assert sharding.spec_for("layers/mlp/up/kernel", (3, 36, 64), mesh, cfg) == \
      P(None, None, ("fsdp", "fsdp_inner"))
  results = [_two_steps(cfg, m, _lm_batch(cfg)) for m in (
      sharding.make_mesh({"data": 1}, devices=jax.devices()[:1]), mesh)]
  q = results[1][2].params["layers"]["attn"]["q"]["kernel"]
  assert q.sharding.shard_shape(q.shape) == (3, 9, 18)
  _assert_same(results)
