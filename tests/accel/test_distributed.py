"""Starting the distributed runtime: flags and environment -> jax.distributed.initialize()."""

import pytest

from t2mlr_jax.accel.distributed import any_process, init_arguments


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


def test_processes_that_see_the_signal_at_different_steps_stop_at_the_same_step():
  """Two fake processes (threads) with a fake all-gather: process 1 is signalled at step
  3, process 0 never (or later, at step 5); both stop after step 3, the step they save."""
  import threading

  slots, barrier = [None, None], threading.Barrier(2)

  def gather_for(pid):
    def gather(flag):
      slots[pid] = int(flag)
      barrier.wait()
      both = list(slots)
      barrier.wait()                    # nobody overwrites a slot before both have read
      return both
    return gather

  stopped = [None, None]

  def process(pid, signal_step):
    gather = gather_for(pid)
    for step in range(1, 20):
      received = signal_step is not None and step >= signal_step
      if any_process(received, gather=gather):
        stopped[pid] = step
        return

  for signals in ((None, 3), (5, 3)):
    threads = [threading.Thread(target=process, args=(pid, signals[pid])) for pid in (0, 1)]
    for t in threads:
      t.start()
    for t in threads:
      t.join(timeout=10)
    assert stopped == [3, 3], (signals, stopped)
    stopped = [None, None]
  # without the agreement each process would act on its own flag: 5 vs 3 (the deadlock)
  assert any_process(False, gather=lambda f: [f, 0]) is False
  assert any_process(False, gather=lambda f: [f, 1]) is True
