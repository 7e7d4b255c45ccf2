"""docs/design.md's examples, shipped as files (docs/examples/echo.py, full_jacobi.py): once
registered, every mode and schedule runs the new type and the new schedule runs every
type, each exact where it should be (tests/test_user_module.py trains them from the
command line)."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2mlr_jax import forward, generate, init_params

from _util import imported_examples, max_abs, random_tokens, tiny_cfg

T = 6


@pytest.fixture(scope="module")
def examples():
  with imported_examples("echo.py", "full_jacobi.py") as echo:
    yield echo


@pytest.mark.slow       # 14 s; tests/test_user_module.py trains the example by default
def test_the_new_recurrence_type_runs_every_mode_and_schedule(examples):
  cfg = tiny_cfg(recurrence=examples.EchoConfig(l_start=1, l_end=2))
  params = init_params(cfg, jax.random.PRNGKey(0))
  params = {**params, "recurrence": {**params["recurrence"], "alpha": jnp.float32(0.7)}}
  tokens = random_tokens(cfg, 2, T, seed=1)
  exact = forward(params, cfg, tokens, mode="exact")
  assert max_abs(exact, forward(params, cfg, tokens, mode="parallel")) > 1e-3
  for mode, kw in (("jacobi", dict(d_forward=T)), ("interleaved", dict(passes=T)),
                   ("chunked", dict(passes=T)), ("multi_refine", dict(refine_passes=T - 1)),
                   ("full_jacobi", dict(full_sweeps=T))):
    assert max_abs(forward(params, cfg, tokens, mode=mode, **kw), exact) <= 1e-5, mode
  new, step_logits = generate(params, cfg, tokens[:, :3], max_new_tokens=3,
                              return_logits=True)
  full = forward(params, cfg, np.concatenate([tokens[:, :3], np.asarray(new)], 1),
                 mode="exact")
  assert max_abs(step_logits, full[:, 2:5]) <= 1e-4


@pytest.mark.slow       # the library's types under the new schedule
def test_the_new_schedule_runs_every_recurrence_type(examples):
  from model.test_schedules import MODELS
  for kind, make in MODELS.items():
    cfg, params = make()
    tokens = random_tokens(cfg, 2, T, seed=2)
    out = forward(params, cfg, tokens, mode="full_jacobi", full_sweeps=T)
    assert max_abs(out, forward(params, cfg, tokens, mode="exact")) <= 1e-5, kind
