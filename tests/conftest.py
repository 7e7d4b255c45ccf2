"""Test setup: compile-speed XLA flags, 8 fake CPU devices for sharding tests, fp32 matmuls,
an optional compile cache."""

import os

import _xla_flags

# Tiny test programs: XLA's CPU compile time dominates (tests/_xla_flags.py).
os.environ["XLA_FLAGS"] = _xla_flags.added(os.environ.get("XLA_FLAGS", ""))
import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)
jax.config.update("jax_default_matmul_precision", "highest")
_cache = os.environ.get("T2MLR_TEST_COMPILE_CACHE")
if _cache:
  jax.config.update("jax_compilation_cache_dir", _cache)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)


import gc  # noqa: E402
import statistics  # noqa: E402

import pytest  # noqa: E402

import _file_seconds  # noqa: E402


def pytest_collection_modifyitems(config, items):
  """Longest test files first (tests/fixtures/file_seconds.json; a new file counts as a
  median one): xdist hands out whole files in this order (pytest.ini), so the last ones
  are short and both workers finish together."""
  seconds = _file_seconds.load()
  median = statistics.median(seconds.values())
  items.sort(key=lambda item: -seconds.get(item.nodeid.split("::")[0], median))


@pytest.fixture(autouse=True, scope="module")
def _free_compiled_programs():
  """Drop every compiled program after each test module. XLA:CPU maps each executable's
  code and buffers separately; across the whole suite one process would pass the
  kernel's vm.max_map_count (65530) and crash in the compiler."""
  yield
  jax.clear_caches()
  gc.collect()
