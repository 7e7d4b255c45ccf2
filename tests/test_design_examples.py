"""docs/design.md's two examples run as written: a new recurrence type (a config class, a
module answering the interface, one row of each registry) and a new schedule (a file and
one row of SCHEDULES); every mode and schedule then runs them, and each is exact where it
should be."""

import dataclasses
import os
import re
import types
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2mlr_jax import config, forward, generate, init_params
from t2mlr_jax.model import recurrence, schedules
from t2mlr_jax.model.control_flow import CF_PAD, CF_RECURRENT
from t2mlr_jax.model.schedules import Schedule
from t2mlr_jax.model.sequence import ModeOut, context, logits, run_segment, segments
from t2mlr_jax.model.span import previous_states, run_span, zero_states
from t2mlr_jax.model.transformer import embed

from _util import max_abs, random_tokens, tiny_cfg

DESIGN = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs",
                      "design.md")
T = 6


def _example(heading: str) -> str:
  text = open(DESIGN).read()
  section = text[text.index(heading):]
  return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def _split(code: str) -> dict:
  """{file comment: its code} of an example that shows several files."""
  parts = re.split(r"^# (\S+)\n", code, flags=re.M)
  return dict(zip(parts[1::2], parts[2::2]))


@pytest.fixture
def echo(monkeypatch):
  files = _split(_example("### Adding a recurrence type"))
  ns = {"dataclasses": dataclasses, "ClassVar": ClassVar,
        "ScheduleOptions": config.ScheduleOptions}
  exec(files["config.py"], ns)
  module = types.ModuleType("echo")
  module.__dict__.update(jnp=jnp, CF_PAD=CF_PAD, CF_RECURRENT=CF_RECURRENT)
  exec(files["model/recurrence/echo.py"], module.__dict__)
  cls = ns["EchoConfig"]
  monkeypatch.setitem(config.RECURRENCE_CONFIGS, cls.type, cls)
  monkeypatch.setitem(recurrence.TYPES, cls, module)
  return cls


@pytest.mark.slow       # 14 s; test_package_structure guards the shape by default
def test_the_new_recurrence_type_runs_every_mode_and_schedule(echo):
  cfg = tiny_cfg(recurrence=echo(l_start=1, l_end=2))
  params = init_params(cfg, jax.random.PRNGKey(0))
  params = {**params, "recurrence": {"alpha": jnp.float32(0.7)}}
  tokens = random_tokens(cfg, 2, T, seed=1)
  exact = forward(params, cfg, tokens, mode="exact")
  assert max_abs(exact, forward(params, cfg, tokens, mode="parallel")) > 1e-3
  for mode, kw in (("jacobi", dict(d_forward=T)), ("interleaved", dict(passes=T)),
                   ("chunked", dict(passes=T)), ("multi_refine", dict(refine_passes=T - 1))):
    assert max_abs(forward(params, cfg, tokens, mode=mode, **kw), exact) <= 1e-5, mode
  new, step_logits = generate(params, cfg, tokens[:, :3], max_new_tokens=3,
                              return_logits=True)
  full = forward(params, cfg, np.concatenate([tokens[:, :3], np.asarray(new)], 1),
                 mode="exact")
  assert max_abs(step_logits, full[:, 2:5]) <= 1e-4


@pytest.mark.slow       # the type example above runs by default
def test_the_new_schedule_runs_every_recurrence_type(monkeypatch):
  ns = {"segments": segments, "embed": embed, "context": context, "run_segment": run_segment,
        "zero_states": zero_states, "previous_states": previous_states,
        "run_span": run_span, "ModeOut": ModeOut, "logits": logits}
  files = _split(_example("### Adding a schedule"))
  exec(files["model/schedules/full_jacobi.py"], ns)
  full_jacobi = types.SimpleNamespace(run=ns["run"], OPTIONS=ns["OPTIONS"])
  monkeypatch.setattr(schedules, "SCHEDULES", dict(schedules.SCHEDULES))
  exec(files["model/schedules/__init__.py"],
       {"SCHEDULES": schedules.SCHEDULES, "Schedule": Schedule, "full_jacobi": full_jacobi})
  from t2mlr_jax.model import modes
  monkeypatch.setattr(modes, "SCHEDULES", schedules.SCHEDULES)
  from test_schedules import MODELS
  for kind, make in MODELS.items():
    cfg, params = make()
    tokens = random_tokens(cfg, 2, T, seed=2)
    out = forward(params, cfg, tokens, mode="full_jacobi", passes=T)
    assert max_abs(out, forward(params, cfg, tokens, mode="exact")) <= 1e-5, kind
