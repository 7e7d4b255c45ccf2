"""Starting the distributed runtime: flags and environment -> jax.distributed.initialize()."""

import pytest

from t2mlr_jax.distributed import any_process, init_arguments


def test_single_process_by_default():
  assert init_arguments(environ={}) is None
  assert init_arguments("10.0.0.1:1234", 1, 0, environ={}) is None
  assert init_arguments(environ={"SLURM_NTASKS": "1"}) is None
  assert init_arguments(environ={"TPU_WORKER_HOSTNAMES": "localhost"}) is None


def test_flags_and_environment():
  args = dict(coordinator_address="10.0.0.1:1234", num_processes=2, process_id=1)
  assert init_arguments("10.0.0.1:1234", 2, 1, environ={}) == args
  env = {"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234", "JAX_NUM_PROCESSES": "2",
         "JAX_PROCESS_ID": "1"}
  assert init_arguments(environ=env) == args
  assert init_arguments(process_id=0, environ=env) == {**args, "process_id": 0}   # flag wins


def test_cluster_detection_is_left_to_jax():
  assert init_arguments(environ={"SLURM_NTASKS": "4"}) == {}
  assert init_arguments(environ={"TPU_WORKER_HOSTNAMES": "a,b"}) == {}
  assert init_arguments("h:1", environ={"SLURM_NTASKS": "4"}) == {"coordinator_address": "h:1"}


@pytest.mark.parametrize("kwargs, env, match", [
    (dict(coordinator_address="h:1"), {}, "num_processes .* and --process_id"),
    (dict(coordinator_address="h:1", num_processes=2), {}, "process_id"),
    (dict(num_processes=2, process_id=0), {}, "coordinator address"),
    (dict(coordinator_address="h", num_processes=2, process_id=0), {}, "HOST:PORT"),
    (dict(coordinator_address="h:1", num_processes=2, process_id=2), {}, r"allowed 0\.\.1"),
    (dict(coordinator_address="h:1", num_processes=0, process_id=0), {}, ">= 1"),
    ({}, {"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "two",
          "JAX_PROCESS_ID": "0"}, "JAX_NUM_PROCESSES='two'"),
])
def test_incomplete_or_bad_settings_say_what_is_missing(kwargs, env, match):
  with pytest.raises(ValueError, match=match):
    init_arguments(environ=env, **kwargs)


def test_any_process_on_one_process_is_the_flag():
  assert any_process(True) and not any_process(False)
