"""docs/design.md's "a state that is not one vector" and "write your own mixer", shipped
as docs/examples/two_step.py (a type carrying two vectors) and low_rank_mixer.py (a
T2MLR mixer): the state's shape comes from the type's own `zero_state`, so every schedule,
decoding, the serving engine and a sharded train step run the two-vector type, exact at
full depth; both train from the command line, resume bit for bit and decode."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2mlr_jax import (
  T2MLRConfig,
  checkpoint,
  forward,
  generate,
  init_params,
  loss,
  sharding,
)
from t2mlr_jax.serving.engine import Engine
from t2mlr_jax.train.optimizer import OptimizerConfig, decay_mask, make_optimizer
from t2mlr_jax.train.step import create_state, make_train_step

from _util import EXAMPLES, imported_examples, max_abs, random_tokens, tiny_cfg
from test_user_module import _cli, _done

T = 6
SCHEDULES = (("jacobi", dict(d_forward=T)), ("interleaved", dict(passes=T)),
             ("chunked", dict(passes=T)), ("multi_refine", dict(refine_passes=T - 1)))


@pytest.fixture(scope="module")
def examples():
  """The two example files imported (what they register is gone after this module)."""
  with imported_examples("two_step.py", "low_rank_mixer.py") as two_step:
    yield two_step


def _two_step(examples, alpha=(0.7, -0.5)):
  cfg = tiny_cfg(recurrence=examples.TwoStepConfig(l_start=1, l_end=2))
  params = init_params(cfg, jax.random.PRNGKey(0))
  return cfg, {**params, "recurrence": {**params["recurrence"], "alpha": jnp.array(alpha)}}


def test_a_two_vector_state_is_exact_under_every_schedule_and_decodes(examples):
  cfg, params = _two_step(examples)
  tokens = random_tokens(cfg, 2, T, seed=1)
  exact = forward(params, cfg, tokens, mode="exact")
  assert max_abs(exact, forward(params, cfg, tokens, mode="parallel")) > 1e-3   # both on
  for mode, kw in SCHEDULES:
    assert max_abs(forward(params, cfg, tokens, mode=mode, **kw), exact) <= 1e-5, mode
  # the vector of t−2 matters: dropping it (α₂ = 0) changes the exact logits
  _, alone = _two_step(examples, alpha=(0.7, 0.0))
  assert max_abs(forward(alone, cfg, tokens, mode="exact"), exact) > 1e-4
  for prefill in ("exact", "jacobi"):
    new, step_logits = generate(params, cfg, tokens[:, :3], max_new_tokens=3,
                                return_logits=True, prefill=prefill)
    full = forward(params, cfg, np.concatenate([tokens[:, :3], np.asarray(new)], 1),
                   mode="exact")
    assert max_abs(step_logits, full[:, 2:5]) <= 1e-4, prefill


@pytest.mark.slow       # a backward pass per schedule; the sharded train step below trains α
def test_both_vectors_of_a_two_vector_state_train_under_every_schedule(examples):
  cfg, params = _two_step(examples)
  tokens = random_tokens(cfg, 2, T, seed=1)
  for mode, _ in SCHEDULES:
    grad = jax.grad(lambda p, m=mode: loss(p, cfg, tokens, mode=m))(params)["recurrence"]
    assert np.all(np.abs(np.asarray(grad["alpha"])) > 0), mode


def test_the_engine_serves_a_two_vector_state(examples):
  """Two requests in one engine, each with its own two-vector state: each equals
  in-process generate alone."""
  cfg, params = _two_step(examples)
  engine = Engine(cfg, params, max_batch=2, max_len=32)
  prompts = [random_tokens(cfg, 1, n, seed=n)[0] for n in (5, 7)]
  rows, tokens = [], []
  for i, prompt in enumerate(prompts):
    pre, _ = engine.prefill(prompt, max_tokens=6)
    row, first = engine.insert(f"r{i}", pre, 6)
    rows.append(row)
    tokens.append([first.token])
  while len(tokens[0]) < 6:
    out, _ = engine.step(return_logits=True)
    for row_out in out:
      tokens[rows.index(row_out[0])].append(row_out[2].token)
  for prompt, got in zip(prompts, tokens):
    want = np.asarray(generate(params, cfg, prompt[None], max_new_tokens=6))[0]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("mode", ["jacobi", pytest.param("interleaved", marks=pytest.mark.slow)])
def test_a_sharded_train_step_carries_the_two_vector_state(examples, mode):
  """The train step over a data x fsdp mesh of 8 devices (the state's leaves constrained
  to the batch axes) computes the single-device loss."""
  cfg, _ = _two_step(examples)
  cfg = cfg.replace(schedule_options={"d_forward": 3, "d_backward": 2, "passes": 3})
  tx, schedule = make_optimizer(OptimizerConfig(lr=1e-2, warmup_frac=0.0), 2, cfg)
  mesh = sharding.make_mesh({"data": 2, "fsdp": 4}, model_width=cfg.d_model)
  state = create_state(cfg, tx, jax.random.PRNGKey(0), mesh)
  tokens = random_tokens(cfg, 8, T, seed=3)
  batch = {"input_ids": tokens, "target_ids": np.roll(tokens, -1, axis=1).astype(np.int32),
           "control_flow": np.full(tokens.shape, 2, np.int32)}
  single = loss(jax.device_get(state.params), cfg, tokens, mode=mode,
                control_flow=batch["control_flow"], targets=batch["target_ids"])
  step = make_train_step(cfg, tx, schedule, mode, mesh, num_steps=2)
  new, metrics = step(state, jax.device_put(batch, sharding.batch_sharding(mesh)))
  assert float(metrics["loss"]) == pytest.approx(float(single), rel=1e-5)
  assert np.any(np.asarray(new.params["recurrence"]["alpha"]) != 0)


def _main(*args):
  return _cli("t2mlr_jax.main", "--progress=false", *args)


def _losses(workdir) -> list:
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [r["loss"] for r in map(json.loads, f) if r.get("kind") == "train"]


@pytest.mark.slow       # 22 s; the decode/serve/schedule tests above run by default
def test_both_examples_train_from_the_command_line_and_resume(examples, tmp_path):
  two = (f"--user_module={EXAMPLES}/two_step.py", f"--config={EXAMPLES}/s5_two_step.py:tiny")
  low = (f"--user_module={EXAMPLES}/low_rank_mixer.py", "--config=configs/s5_retrieval.py:tiny",
         "--config.model.recurrence.mixer=low_rank")
  wd = {name: str(tmp_path / name) for name in ("two", "two_resumed", "low")}
  procs = [_main(*two, f"--workdir={wd['two']}"),
           _main(*two, f"--workdir={wd['two_resumed']}", "--config.train.stop_after_steps=3"),
           _main(*low, f"--workdir={wd['low']}")]
  for proc in procs:
    _done(proc)
  _done(_main(*two, f"--workdir={wd['two_resumed']}"))
  assert len(_losses(wd["two"])) == 6
  assert _losses(wd["two"]) == _losses(wd["two_resumed"])        # bit for bit
  cfg, params = checkpoint.load(wd["two"])
  assert cfg.recurrence.type == "two_step"
  assert np.all(np.asarray(params["recurrence"]["alpha"]) != 0)   # both gates trained
  prompt = random_tokens(cfg, 1, 4, seed=5)
  assert np.asarray(generate(params, cfg, prompt, max_new_tokens=3)).shape == (1, 3)
  cfg, params = checkpoint.load(wd["low"])
  assert cfg.recurrence.mixer == "low_rank" and isinstance(cfg.recurrence, T2MLRConfig)
  rec = params["recurrence"]
  assert float(rec["gamma"]) != 0.0 and rec["down"]["kernel"].shape == (cfg.d_model, 4)
  mask = decay_mask(params, cfg)["recurrence"]
  assert not mask["gamma"] and mask["down"]["kernel"]               # its own no-decay leaf
  assert all(np.isfinite(_losses(wd["low"])))
