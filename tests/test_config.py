"""Configuration: presets, validation with clear errors, parameter counts."""

import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from t2mlr_jax import LRTConfig, ModelConfig, T2MLRConfig, forward, init_params
from t2mlr_jax.config import unknown_field
from t2mlr_jax.registry import recurrence_config_classes, schedule_option_defaults

from _util import random_tokens, tiny_cfg


def test_presets_and_replace():
  cfg = ModelConfig.preset("smollm2-135m", recurrence=T2MLRConfig(l_start=13, l_end=18))
  assert (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim) == (30, 576, 9, 3, 64)
  assert cfg.span == (13, 18)
  assert [s[1:] for s in cfg.segments] == [(0, 13), (13, 19), (19, 30)]
  assert 134e6 < cfg.replace(recurrence=None).num_params() < 135e6
  s5 = ModelConfig.preset("s5")
  assert s5.rope_theta is None and not s5.tie_embeddings and s5.vocab_size == 188
  assert hash(cfg) == hash(cfg.replace())      # hashable: a static jit argument
  with pytest.raises(ValueError, match="preset"):
    ModelConfig.preset("gpt-5")
  with pytest.raises(ValueError, match="no field"):
    cfg.replace(n_layer=3)


def test_negative_indices_and_segments():
  cfg = tiny_cfg(l_start=-3, l_end=-1, n_layers=4)
  assert cfg.span == (1, 3)
  assert [s[0] for s in cfg.segments] == ["lower", "middle"]
  assert tiny_cfg(l_start=0, l_end=3).segments == (("middle", 0, 4),)


def test_num_params_matches_tree():
  for cfg in (tiny_cfg(), tiny_cfg(tie_embeddings=True, qkv_bias=True),
              tiny_cfg(recurrence=T2MLRConfig(l_start=0, l_end=1, cache_norm="rmsnorm"))):
    params = init_params(cfg, jax.random.PRNGKey(0))
    assert sum(x.size for x in jax.tree.leaves(params)) == cfg.num_params()


@pytest.mark.parametrize("build,field", [
    (lambda: tiny_cfg(l_start=3, l_end=1), "l_start"),
    (lambda: tiny_cfg(l_start=0, l_end=4), "l_end"),
    (lambda: tiny_cfg(l_start=-5, l_end=1), "l_start"),
    (lambda: tiny_cfg(schedule_options=dict(d_forward=2, d_backward=3)), "d_backward"),
    (lambda: tiny_cfg(schedule_options=dict(d_forward=0)), "d_forward"),
    (lambda: tiny_cfg(schedule_options=dict(d_forwards=8)), "d_forwards"),
    (lambda: T2MLRConfig(cache_norm="layernorm"), "cache_norm"),
    (lambda: T2MLRConfig(gate_init=1.0), "gate_init"),
    (lambda: tiny_cfg(schedule_options=dict(jacobi_tol=0.0)), "jacobi_tol"),
    (lambda: tiny_cfg(n_kv_heads=3), "n_kv_heads"),
    (lambda: tiny_cfg(dtype="float16"), "dtype"),
    (lambda: tiny_cfg(n_layers=0), "n_layers"),
    (lambda: tiny_cfg(rope_theta=None, rope_scaling={"factor": 8.0}), "rope_scaling"),
    (lambda: tiny_cfg(rope_scaling={"rope_type": "yarn"}), "rope_type"),
])
def test_bad_config(build, field):
  with pytest.raises(ValueError, match=field):
    build()


@pytest.fixture(scope="module")
def model():
  cfg = tiny_cfg()
  return cfg, init_params(cfg, jax.random.PRNGKey(0))


@pytest.mark.parametrize("tokens,kwargs,field", [
    (np.full((2, 8), 37, np.int32), dict(mode="exact"), "vocab_size"),
    (np.full((2, 8), -1, np.int32), dict(mode="exact"), "vocab_size"),
    (np.zeros((2, 65), np.int32), dict(mode="exact"), "max_seq_len"),
    (np.zeros((2, 8), np.int32), dict(mode="recurrent"), "mode"),
    (np.zeros((2, 8), np.int32), dict(mode="jacobi", d_forward=2, d_backward=0), "d_backward"),
    (np.zeros((2, 8), np.int32), dict(mode="jacobi", d_forward=0), "d_forward"),
    (np.zeros((2, 8), np.int32), dict(mode="exact", control_flow=np.full((2, 8), 3)), "control_flow"),
    (np.zeros((2, 8), np.int32), dict(mode="exact", control_flow=np.full((2, 7), 2)), "control_flow"),
    (np.zeros((8,), np.int32), dict(mode="exact"), "tokens"),
    (np.zeros((2, 8), np.float32), dict(mode="exact"), "tokens"),
])
def test_bad_forward_input(model, tokens, kwargs, field):
  cfg, params = model
  with pytest.raises(ValueError, match=field):
    forward(params, cfg, tokens, **kwargs)


def test_llama3_rope_scaling_runs():
  cfg = tiny_cfg(rope_scaling={"factor": 8.0, "original_max_position_embeddings": 16})
  params = init_params(cfg, jax.random.PRNGKey(0))
  out = forward(params, cfg, random_tokens(cfg, 1, 8), mode="parallel")
  ref = forward(params, cfg.replace(rope_scaling=None), random_tokens(cfg, 1, 8), mode="parallel")
  assert np.isfinite(out).all() and float(np.abs(out - ref).max()) > 0


def test_nanochat_presets():
  from t2mlr_jax import ModelConfig
  d12, d20 = ModelConfig.preset("nanochat-d12"), ModelConfig.preset("nanochat-d20")
  assert (d12.n_layers, d12.d_model, d12.n_heads, d12.head_dim) == (12, 768, 6, 128)
  assert (d20.n_layers, d20.d_model, d20.n_heads, d20.head_dim) == (20, 1280, 10, 128)
  assert d20.vocab_size == 32768 and d20.max_seq_len == 2048 and not d20.tie_embeddings
  assert d12.layer_windows[:4] == (1024, 1024, 1024, 2048) and d12.layer_windows[-1] == 2048
  assert ModelConfig().layer_windows is None and ModelConfig().padded_vocab == 256


def test_configs_saved_before_one_config_system_still_resume():
  """Checkpoints record the experiment config as JSON; those written before the model
  group was built from ModelConfig's fields and the recurrence group from the type's
  class (commit f3434b1, tests/fixtures/configs_f3434b1.json), whose recurrence group
  also held the schedules' options, resume under today's configs with no conflicting
  field and, read back as `checkpoint.load_config` reads them, build the same typed
  model config."""
  import json
  import os
  import sys

  from ml_collections import config_dict

  from t2mlr_jax.config import migrate_experiment_config
  from t2mlr_jax.train.config import model_config, resume_conflicts
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  with open(os.path.join(root, "tests", "fixtures", "configs_f3434b1.json")) as f:
    saved = json.load(f)
  sys.path.insert(0, os.path.join(root, "configs"))
  try:
    for key, old in saved.items():
      name, variant = key.split(":")
      current = __import__(name).get_config(variant)
      assert resume_conflicts(old, current.to_dict()) == [], key
      read = config_dict.ConfigDict(migrate_experiment_config(old))
      assert model_config(read) == model_config(current), key
  finally:
    sys.path.pop(0)


def test_schedule_options_are_declared_by_their_schedules():
  """`schedule_options` holds what the schedules declare (their options dataclasses):
  defaults read from the schedule, values at their default not stored (equal configs hash
  equal), each value checked by the schedule declaring it, unknown names refused with the
  declared ones listed, and a copy with changes through `replace`."""
  from t2mlr_jax import ScheduleOptions
  from t2mlr_jax.config import recurrence_from_dict
  from t2mlr_jax.model.schedules.jacobi import JacobiOptions
  from t2mlr_jax.registry import SCHEDULES, schedule_option_defaults
  assert SCHEDULES.get("jacobi").options is JacobiOptions
  defaults = schedule_option_defaults()
  assert {"d_forward": 16, "d_backward": 4, "jacobi_tol": None, "passes": 2,
          "refine_passes": 3}.items() <= defaults.items()
  cfg = tiny_cfg(schedule_options=dict(d_forward=8))
  assert cfg.schedule_options.d_forward == 8 and cfg.schedule_options["passes"] == 2
  assert cfg.schedule_options.explicit() == {"d_forward": 8}
  same = tiny_cfg(schedule_options=dict(d_forward=8, passes=2, jacobi_tol=None))
  assert same == cfg and hash(same) == hash(cfg)
  assert ScheduleOptions(refine_weights=[1, 2, 3, 4]).refine_weights == (1.0, 2.0, 3.0, 4.0)
  assert cfg.to_dict()["schedule_options"] == {**defaults, "d_forward": 8,
                                               "refine_weights": []}
  assert cfg.schedule_options.replace(passes=3).passes == 3
  with pytest.raises(ValueError, match=r"schedule_options.d_forwards=8 is invalid: allowed an "
                     r"option of a registered schedule: d_forward, d_backward"):
    ScheduleOptions(d_forwards=8)
  with pytest.raises(ValueError, match=r"schedule_options.refine_weights=\(1.0,\) is invalid"):
    ScheduleOptions(refine_weights=(1.0,))
  with pytest.raises(ValueError, match=r"recurrence.passes is a training schedule's option, "
                     r"not a field of LRTConfig: set schedule_options.passes"):
    recurrence_from_dict({"type": "lrt", "passes": 2})
  with pytest.raises(AttributeError, match="immutable"):
    cfg.schedule_options.d_forward = 3


def test_metadata_written_when_the_options_were_recurrence_fields_loads_them_moved():
  """Checkpoint meta and exports written before the schedules' options moved carried them
  in the recurrence dict (every option, at its value): they load into `schedule_options`,
  the type's fields stay the type's; an experiment config saved then migrates the same
  way and resumes under today's without a conflict."""
  from t2mlr_jax.config import migrate_experiment_config, split_schedule_options
  from t2mlr_jax.train.config import base_config, resume_conflicts
  cfg = tiny_cfg(schedule_options=dict(d_forward=6, d_backward=3, passes=3))
  old = cfg.to_dict()
  old["recurrence"].update(old.pop("schedule_options"))        # the layout before the move
  assert ModelConfig(**old) == cfg
  fields, moved = split_schedule_options(old["recurrence"])
  assert "l_start" in fields and "d_forward" not in fields and moved["passes"] == 3
  saved = base_config().to_dict()
  saved["model"]["recurrence"].update(d_forward=6, d_backward=3)
  del saved["model"]["schedule_options"]
  current = base_config()
  current.model.schedule_options.update(d_forward=6, d_backward=3)
  assert resume_conflicts(saved, current.to_dict()) == []
  assert migrate_experiment_config(saved)["model"]["schedule_options"] == {
      "d_forward": 6, "d_backward": 3}
  current.model.schedule_options.d_forward = 7
  assert resume_conflicts(saved, current.to_dict()) == ["model.schedule_options.d_forward"]


def test_a_schedule_option_given_as_a_recurrence_field_names_its_new_place():
  """Code written before the options moved (`T2MLRConfig(d_forward=8)`, `LRTConfig(passes=
  2)`, `.replace(d_backward=2)`) gets one ValueError naming the option and where it went,
  for every registered type and every option a schedule declares."""
  for build, owner, name, value in ((lambda: T2MLRConfig(d_forward=8), "T2MLRConfig",
                                     "d_forward", 8),
                                    (lambda: LRTConfig(passes=2), "LRTConfig", "passes", 2)):
    with pytest.raises(ValueError) as e:
      build()
    assert str(e.value) == (f"{owner} has no field {name}: schedule options moved to "
                            f"ModelConfig(schedule_options={{{name!r}: {value}}}) "
                            f"(or --config.model.schedule_options.{name})")
  for cls in recurrence_config_classes().values():
    for name in schedule_option_defaults():
      with pytest.raises(ValueError, match=rf"^{cls.__name__} has no field {name}: schedule "
                                           rf"options moved to ModelConfig\("):
        cls(**{name: 1})
      with pytest.raises(ValueError, match=rf"schedule_options.{name}\)$"):
        cls().replace(**{name: 1})
  assert unknown_field("model.recurrence.d_forward", "8") == (
      "model.recurrence has no field d_forward: schedule options moved to ModelConfig("
      "schedule_options={'d_forward': 8}) (or --config.model.schedule_options.d_forward)")
  assert unknown_field("model.recurrence.colour", "8") == \
      "unknown config field --config.model.recurrence.colour"


def test_a_schedule_option_on_the_command_line_as_a_recurrence_field_is_one_line():
  """`--config.model.recurrence.d_forward=8` exits 2 with one line naming the new place."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  proc = subprocess.run(
      [sys.executable, "-m", "t2mlr_jax.main", "--config=configs/s5_retrieval.py:tiny",
       "--config.model.recurrence.d_forward=8"], capture_output=True, text=True, cwd=root,
      env=dict(os.environ, JAX_PLATFORMS="cpu"), timeout=300)
  assert proc.returncode == 2, proc.stderr
  lines = proc.stderr.strip().splitlines()
  assert lines == ["error: model.recurrence has no field d_forward: schedule options moved to "
                   "ModelConfig(schedule_options={'d_forward': 8}) (or "
                   "--config.model.schedule_options.d_forward) (--verbose for the traceback)"], \
      proc.stderr
