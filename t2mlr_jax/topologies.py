"""TPU topologies by name, for compiling without the chips (`t2mlr_jax.compile`).

MaxText's names (`v5e-16`, `v4-8`, `v5p-128`, `v6e-256`: chips on v5e / v6e, TensorCores
on v2-v4 and v5p, as Cloud TPU counts them) map to JAX's topology strings and chip
configs; JAX's own strings (`v5e:4x4`, `v4:2x2x4`) are accepted too. v4 and v5p compile as
megacore (one device a chip, its two cores fused), v2 / v3 as one device a core, as the
runtime presents them. Each generation's HBM and dense bf16 peak are listed per device
(`memory_stats()` is not available on compile-only devices).

`devices(name)` needs libtpu (`pip install "jax[tpu]==<the installed jax>"`); on a host
without chips libtpu is given a one-host environment, so it prints no missing-hardware
errors.
"""

from __future__ import annotations

import dataclasses
import glob
import math
import os
import re
from typing import Optional

from jax.experimental import topologies as jax_topologies

GiB = 2 ** 30


class TopologyUnavailable(OSError):
  """libtpu is missing or would not describe the topology (a one-line CLI error)."""


@dataclasses.dataclass(frozen=True)
class Generation:
  """One TPU generation: how JAX names it and what one device of it holds."""
  jax_name: str               # the prefix of JAX's topology strings ("v5e")
  device_kind: str            # jax.Device.device_kind of its devices
  hbm_bytes: int              # HBM per device the compiler lets a program use
  peak_bf16_flops: float      # dense bf16 peak FLOP/s per device
  cores_per_chip: int         # TensorCores per chip
  megacore: bool              # devices are whole chips with fused cores (v4, v5p)
  name_counts_cores: bool     # "v4-8" counts cores (8 cores = 4 chips), "v5e-8" chips
  dims: int                   # 2D or 3D torus

# HBM: the limit libtpu's compiler enforces per device, as its out-of-memory error states
# it (the public per-chip sizes are 16 / 32 / 32 / 16 / 95 / 32 GiB; v2 / v3 devices are
# half-chip cores); bf16 peak: public per-chip figures, per device.
def _gib100(hundredths: int) -> int:
  return hundredths * GiB // 100


GENERATIONS = {
    "v2": Generation("v2", "TPU v2", _gib100(748), 22.5e12, 2, False, True, 2),
    "v3": Generation("v3", "TPU v3", _gib100(1548), 61.5e12, 2, False, True, 2),
    "v4": Generation("v4", "TPU v4", _gib100(3075), 275e12, 2, True, True, 3),
    "v5e": Generation("v5e", "TPU v5 lite", _gib100(1575), 197e12, 1, False, False, 2),
    "v5p": Generation("v5p", "TPU v5", _gib100(9574), 459e12, 2, True, True, 3),
    "v6e": Generation("v6e", "TPU v6 lite", _gib100(3125), 918e12, 1, False, False, 2),
}

# chips -> chip grid, the shapes Cloud TPU offers (2D: v2, v3, v5e, v6e; 3D: v4, v5p)
_GRIDS_2D = {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16",
             256: "16x16", 512: "16x32", 1024: "32x32"}
_GRIDS_3D = {4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4", 128: "4x4x8",
             256: "4x8x8", 512: "8x8x8", 1024: "8x8x16", 2048: "8x16x16",
             4096: "16x16x16"}
_MAX_CHIPS = {"v2": 256, "v3": 1024, "v4": 4096, "v5e": 256, "v5p": 4096, "v6e": 256}


@dataclasses.dataclass(frozen=True)
class Topology:
  """A named slice: JAX's topology string, its chip config, devices and chips."""
  name: str                   # as given ("v5e-16" or "v5e:4x4")
  generation: Generation
  jax_topology: str           # "v5e:4x4"
  chip_config: Optional[str]  # "megacore" for v4 / v5p, else None (JAX's default)
  chips: int

  @property
  def num_devices(self) -> int:
    """Devices JAX sees: chips (v4, v5p megacore; v5e, v6e) or cores (v2, v3)."""
    return self.chips if self.generation.megacore else (
        self.chips * self.generation.cores_per_chip)

  @property
  def hbm_bytes(self) -> int:
    """HBM of one device."""
    return self.generation.hbm_bytes

  @property
  def peak_flops(self) -> float:
    """Dense bf16 peak FLOP/s of one device."""
    return self.generation.peak_bf16_flops


def known_names() -> list[str]:
  """Every MaxText-style name the table resolves (e.g. 'v5e-16')."""
  out = []
  for gen, g in GENERATIONS.items():
    grids = _GRIDS_3D if g.dims == 3 else _GRIDS_2D
    for chips in grids:
      if chips <= _MAX_CHIPS[gen]:
        out.append(f"{gen}-{chips * g.cores_per_chip if g.name_counts_cores else chips}")
  return out


def _unknown(name: str) -> ValueError:
  return ValueError(f"--topology={name!r} is unknown: allowed a name such as "
                    f"{', '.join(known_names())} (chips on v5e/v6e, cores on v2-v4 and v5p), "
                    f"or JAX's 'GEN:AxB[xC]' with GEN one of {sorted(GENERATIONS)}")


def resolve(name: str) -> Topology:
  """The Topology of a MaxText-style name or a JAX topology string."""
  m = re.fullmatch(r"(v\d[a-z]?)-(\d+)", name.strip())
  if m:
    gen, count = m.group(1), int(m.group(2))
    g = GENERATIONS.get(gen)
    if g is None:
      raise _unknown(name)
    chips, rem = divmod(count, g.cores_per_chip) if g.name_counts_cores else (count, 0)
    grid = (_GRIDS_3D if g.dims == 3 else _GRIDS_2D).get(chips)
    if rem or grid is None or chips > _MAX_CHIPS[gen]:
      raise _unknown(name)
    return Topology(name, g, f"{gen}:{grid}", "megacore" if g.megacore else None, chips)
  m = re.fullmatch(r"(v\d[a-z]?):(\d+(?:x\d+)+)", name.strip())
  if m and m.group(1) in GENERATIONS:
    g = GENERATIONS[m.group(1)]
    sizes = [int(s) for s in m.group(2).split("x")]
    if len(sizes) != g.dims:
      raise ValueError(f"--topology={name!r}: {m.group(1)} is a {g.dims}D torus, allowed "
                       f"{'AxBxC' if g.dims == 3 else 'AxB'}")
    return Topology(name, g, name.strip(), "megacore" if g.megacore else None,
                    math.prod(sizes))
  raise _unknown(name)


TPU_DEVICE_FILES = ("/dev/accel*", "/dev/vfio/[0-9]*")   # a TPU VM's chips


def host_has_tpu_chips() -> bool:
  """Whether this host is a TPU VM (its chips appear as device files)."""
  return any(glob.glob(pattern) for pattern in TPU_DEVICE_FILES)


def _answer_libtpus_host_questions() -> None:
  """libtpu, loaded on a host without chips, reads the TPU VM's accelerator type and
  worker hostnames from the environment and prints initialisation errors when they are
  unset. Give it a one-host answer there (setdefault: a user's values stand); what is
  compiled for is the topology asked for, not these."""
  if host_has_tpu_chips():
    return
  os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
  os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5litepod-4")


def devices(topology: Topology, num_slices: int = 1) -> list:
  """The compile-only devices of `num_slices` such slices (needs libtpu)."""
  _answer_libtpus_host_questions()
  kwargs = {} if topology.chip_config is None else {"chip_config_name": topology.chip_config}
  if num_slices > 1:
    kwargs["num_slices"] = num_slices
  try:
    desc = jax_topologies.get_topology_desc(topology_name=topology.jax_topology,
                                            platform="tpu", **kwargs)
  except Exception as e:
    raise TopologyUnavailable(
        f"could not build the {topology.jax_topology} topology ({type(e).__name__}: "
        f"{str(e).splitlines()[0] if str(e) else ''}); compiling for TPUs needs libtpu: "
        "pip install \"jax[tpu]==$(python -c 'import jax; print(jax.__version__)')\"") from e
  out = list(desc.devices)
  if len(out) != topology.num_devices * num_slices:
    raise TopologyUnavailable(f"{topology.jax_topology} gave {len(out)} devices, expected "
                       f"{topology.num_devices * num_slices}")
  return out


def libtpu_available() -> bool:
  """Whether libtpu can be imported (TPU compiles possible on this host)."""
  try:
    import libtpu  # noqa: F401, PLC0415  (optional: jax[tpu]; the probe is the import)
  except ImportError:
    return False
  return True


def generation_of(device_kind: str) -> Optional[int]:
  """The TPU generation number of a device kind ("TPU v5 lite" -> 5), None if not a TPU."""
  m = re.match(r"TPU v(\d+)", device_kind or "")
  return int(m.group(1)) if m else None
