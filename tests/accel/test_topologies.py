"""Accelerator topologies by name (t2mlr_jax/accel/topologies.py): TPU slices as MaxText
and JAX name them, GPU nodes with each card's figures, the memory a program may use, and
the errors when a name is unknown or the compile-only devices cannot be built. Nothing here
needs libtpu or the CUDA plugin."""

import pytest

from t2mlr_jax.accel import topologies


def test_topology_names_resolve_as_maxtext_counts_them():
  t = topologies.resolve("v5e-16")
  assert (t.jax_topology, t.chips, t.num_devices, t.chip_config) == ("v5e:4x4", 16, 16, None)
  t = topologies.resolve("v4-8")          # cores: 4 chips, megacore: one device a chip
  assert (t.jax_topology, t.chips, t.num_devices, t.chip_config) == ("v4:2x2x1", 4, 4,
                                                                     "megacore")
  t = topologies.resolve("v5p-128")
  assert (t.jax_topology, t.num_devices) == ("v5p:4x4x4", 64)
  t = topologies.resolve("v2-8")          # one device a core
  assert (t.jax_topology, t.chips, t.num_devices) == ("v2:2x2", 4, 8)
  assert topologies.resolve("v6e:4x4").num_devices == 16
  assert topologies.resolve("v5e-256").hbm_bytes == int(15.75 * 2 ** 30)   # the compiler's limit
  with pytest.raises(ValueError, match=r"--topology='v5e-12' is unknown: allowed a name "
                     r"such as .*v5e-16"):
    topologies.resolve("v5e-12")
  with pytest.raises(ValueError, match="is a 3D torus"):
    topologies.resolve("v4:2x2")


def test_gpu_names_resolve_with_each_cards_figures():
  t = topologies.resolve("h100-8")
  assert (t.platform, t.jax_topology, t.num_devices) == ("gpu", "1x1x8", 8)
  assert t.card.device_kind == "NVIDIA H100 80GB HBM3" and t.card.compute_capability == (9, 0)
  # 0.75 of the card (81559 MiB, as the driver reports it) less the 1 GiB margin
  assert t.hbm_bytes == int(81559 * 2 ** 20 * 0.75) - 2 ** 30
  assert t.peak_flops == 989e12
  t = topologies.resolve("h100-2x8")
  assert (t.nodes, t.jax_topology, t.num_devices) == (2, "1x2x8", 16)
  assert topologies.resolve("a100-8").card.compute_capability == (8, 0)
  assert topologies.resolve("h200-1").card.memory_bytes == 143771 * 2 ** 20
  assert topologies.resolve("l4-1").card.compute_capability == (8, 9)
  t4 = topologies.resolve("t4-1")
  assert (t4.card.peak_dtype, t4.card.compute_capability) == ("float16", (7, 5))
  assert "float16 peak (no bf16 tensor cores)" in t4.peak_text
  for bad in ("h100-3", "h100-2x4", "b300-8"):
    with pytest.raises(ValueError, match=rf"--topology='{bad}' is unknown: allowed a name "
                       r"such as .*h100-8"):
      topologies.resolve(bad)


def test_memory_fraction_follows_the_variable(monkeypatch):
  monkeypatch.setenv(topologies.MEM_FRACTION_ENV, "0.9")
  assert topologies.resolve("h200-1").hbm_bytes == int(143771 * 2 ** 20 * 0.9) - 2 ** 30
  monkeypatch.setenv(topologies.MEM_FRACTION_ENV, "1.5")
  with pytest.raises(ValueError, match=r"XLA_PYTHON_CLIENT_MEM_FRACTION='1.5' is invalid"):
    topologies.resolve("h200-1")


def test_every_known_name_resolves_and_device_kinds_name_their_hardware():
  """The names the unknown-name error lists all resolve (to a TPU slice or a GPU node);
  device kinds map back to their TPU generation or listed card."""
  names = topologies.known_names()
  assert "v5e-16" in names and "v4-8" in names and "h100-8" in names
  for name in names:
    t = topologies.resolve(name)
    assert t.num_devices >= 1 and t.hbm_bytes > 0 and t.peak_flops > 0, name
    assert t.platform == ("gpu" if isinstance(t, topologies.GpuTopology) else "tpu"), name
  assert topologies.generation_of("TPU v5 lite") == 5
  assert topologies.generation_of("TPU v4") == 4
  assert topologies.generation_of("NVIDIA H100 80GB HBM3") is None
  assert topologies.generation_of(None) is None
  assert topologies.card_of("NVIDIA H100 80GB HBM3").name == "h100"
  assert topologies.card_of("cpu") is None


def test_gpu_devices_refuse_slices_and_name_the_missing_plugin(monkeypatch):
  """GPU nodes take no --num_slices (several nodes are named); without JAX's CUDA plugin
  the devices are a TopologyUnavailable naming the install, pinned to the installed jax."""
  import jax
  t = topologies.resolve("h100-8")
  with pytest.raises(ValueError, match=r"--num_slices=2 is invalid for GPU nodes: allowed 1 "
                     r"\(several nodes are named: h100-2x8\)"):
    topologies.devices(t, num_slices=2)
  monkeypatch.setattr(topologies, "cuda_plugin_available", lambda: False)
  with pytest.raises(topologies.TopologyUnavailable,
                     match=rf'pip install "jax\[cuda12\]=={jax.__version__}"'):
    topologies.devices(t)
  assert "GiB (XLA_PYTHON_CLIENT_MEM_FRACTION) less 1 GiB" in t.memory_text
  assert topologies.resolve("v5e-4").memory_text == "15.75 GiB HBM each"
