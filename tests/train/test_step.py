"""The train step's per-step leaves: T2MLR's recurrent_weight curriculum set before every
step (what the step trains with, logged, kept in the state), moved by nothing else (no
gradient, no optimizer update or decay, no optimizer state)."""

import jax
import numpy as np
import pytest

from t2mlr_jax import ModelConfig, T2MLRConfig, sharding
from t2mlr_jax.model.recurrence import t2mlr as rec
from t2mlr_jax.train.optimizer import OptimizerConfig, make_optimizer
from t2mlr_jax.train.step import create_state, make_train_step

from _util import random_tokens

FIXED_GATE = ("use_learnable_recurrent_gate=False", "rezero_gamma_recurrent_gate_init=0.5")
CFG = ModelConfig(vocab_size=40, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, d_ff=64,
                  max_seq_len=32, schedule_options=dict(d_forward=4, d_backward=2),
                  recurrence=T2MLRConfig(
                      l_start=1, l_end=1, mixer_options=FIXED_GATE,
                      use_recurrent_weight_curriculum=True,
                      recurrent_weight_curriculum_start=0.1,
                      recurrent_weight_curriculum_end=0.9,
                      recurrent_weight_curriculum_schedule="cosine",
                      recurrent_weight_curriculum_warmup_ratio=0.5))


@pytest.mark.parametrize("name", ["adamw", "muon"])
def test_the_curriculum_sets_its_leaf_before_every_step_and_nothing_else_moves_it(name):
  steps = 6
  tx, schedule = make_optimizer(OptimizerConfig(name=name, lr=1e-2, weight_decay=0.5,
                                                warmup_frac=0.0), steps, CFG)
  mesh = sharding.make_mesh({"data": 2}, devices=jax.devices()[:2])
  state = create_state(CFG, tx, jax.random.PRNGKey(0), mesh)
  assert float(state.params["recurrence"]["recurrent_weight"]) == pytest.approx(0.1)
  step = make_train_step(CFG, tx, schedule, "jacobi", mesh, num_steps=steps)
  tokens = random_tokens(CFG, 4, 12, seed=1)
  batch = {"input_ids": tokens, "target_ids": np.roll(tokens, -1, axis=1).astype(np.int32),
           "control_flow": np.full(tokens.shape, 2, np.int32)}
  batch = jax.device_put(batch, sharding.batch_sharding(mesh))
  logged, kept = [], []
  for _ in range(steps):
    state, metrics = step(state, batch)
    logged.append(float(metrics["recurrent_weight"]))
    kept.append(float(state.params["recurrence"]["recurrent_weight"]))
  want = [float(rec.curriculum_weight(CFG.recurrence, s, steps)) for s in range(steps)]
  assert want[0] == pytest.approx(0.1) and want[3:] == pytest.approx([0.9] * 3)
  assert logged == pytest.approx(want, abs=1e-7)       # step s trains with value(s)
  assert kept == pytest.approx(want, abs=1e-7)         # and the state keeps it, undecayed
  assert float(metrics["gamma_rec"]) != 0.5            # the rest trains
  paths = [jax.tree_util.keystr(p) for p, _ in
           jax.tree_util.tree_flatten_with_path(state.opt_state)[0]]
  assert paths and not any("recurrent_weight" in p for p in paths), name   # no state for it


def test_a_curriculum_without_the_run_length_says_so():
  rcfg = CFG.recurrence
  with pytest.raises(ValueError, match="curriculum needs the run's train steps"):
    rec.curriculum_weight(rcfg, 0, None)
