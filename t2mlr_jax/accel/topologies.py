"""Accelerator topologies by name, for compiling without the hardware (`t2mlr_jax.compile`):
TPU slices and NVIDIA GPU nodes.

TPUs: MaxText's names (`v5e-16`, `v4-8`, `v5p-128`, `v6e-256`: chips on v5e / v6e,
TensorCores on v2-v4 and v5p, as Cloud TPU counts them) map to JAX's topology strings and
chip configs; JAX's own strings (`v5e:4x4`, `v4:2x2x4`) are accepted too. v4 and v5p
compile as megacore (one device a chip, its two cores fused), v2 / v3 as one device a
core, as the runtime presents them. Each generation's HBM and dense bf16 peak are listed
per device (`memory_stats()` is not available on compile-only devices). `devices(name)`
needs libtpu (`pip install "jax[tpu]==<the installed jax>"`); on a host without chips
libtpu is given a one-host environment, so it prints no missing-hardware errors.

GPUs: `CARD-N` is one node of N cards (`h100-8`, `a100-8`, `h200-1`, `t4-1`),
`CARD-MxN` M such nodes (`h100-2x8`). Each card's compiler target is the library's own
XLA `GpuTargetConfigProto` text (`gpu_targets/CARD.txtpb`, built from the card's public
figures: the wheels ship none); its device name, compute capability and memory are read
from that file, its peak is listed here. `devices(name)` needs the CUDA plugin
(`pip install "jax[cuda12]==<the installed jax>"`) and runs with JAX_PLATFORMS=cpu: no GPU
or driver is needed, nothing executes. A GPU compile never runs out of memory, so the fit
is judged against what a JAX process gets on the card (`GpuTopology.hbm_bytes`).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import re
from typing import Optional, Union

import jax
from jax.experimental import topologies as jax_topologies

from t2mlr_jax.accel.platforms import host_has_tpu_chips

GiB = 2 ** 30
MiB = 2 ** 20


class TopologyUnavailable(OSError):
  """libtpu or the CUDA plugin is missing, or would not describe the topology (a one-line
  CLI error)."""


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

  platform = "tpu"                    # what the compiled program runs on
  peak_text = "the chip's peak"       # what `peak_flops` is, as the report says it

  @property
  def memory_text(self) -> str:
    """What `hbm_bytes` is, as the report's header says it."""
    return f"{self.hbm_bytes / GiB:.2f} GiB HBM each"

  def devices(self, num_slices: int = 1) -> list:
    """The compile-only devices of `num_slices` such slices (needs libtpu)."""
    _answer_libtpus_host_questions()
    kwargs = {} if self.chip_config is None else {"chip_config_name": self.chip_config}
    if num_slices > 1:
      kwargs["num_slices"] = num_slices
    try:
      desc = jax_topologies.get_topology_desc(topology_name=self.jax_topology,
                                              platform="tpu", **kwargs)
    except Exception as e:
      raise TopologyUnavailable(
          f"could not build the {self.jax_topology} topology ({type(e).__name__}: "
          f"{_first_line(e)}); compiling for TPUs needs libtpu: "
          "pip install \"jax[tpu]==$(python -c 'import jax; print(jax.__version__)')\"") from e
    return _checked(list(desc.devices), self.num_devices * num_slices, self.jax_topology)


def _first_line(e: BaseException) -> str:
  return str(e).splitlines()[0] if str(e) else ""


def _checked(devices: list, expected: int, what: str) -> list:
  if len(devices) != expected:
    raise TopologyUnavailable(f"{what} gave {len(devices)} devices, expected {expected}")
  return devices


# ------------------------------------------------------------------------ NVIDIA GPUs

GPU_TARGETS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu_targets")
# What a JAX process may use on a card: XLA's allocator preallocates this fraction of the
# card's memory (JAX's default, or the variable's value when set) ...
MEM_FRACTION_ENV, MEM_FRACTION_DEFAULT = "XLA_PYTHON_CLIENT_MEM_FRACTION", 0.75
# ... less this margin inside that pool for what a compile-only program's figures leave
# out: cuDNN's and cuBLAS's workspaces (a compile without the card sizes them 0) and the
# allocator's fragmentation. The CUDA context (about 0.5 GiB) and NCCL's buffers are
# allocated outside the pool, in the rest of the card.
GPU_MARGIN_BYTES = GiB
GPUS_PER_NODE = (1, 2, 4, 8)


@dataclasses.dataclass(frozen=True)
class Card:
  """One NVIDIA card: its name in topology names ("h100"), its compiler target (the text of
  gpu_targets/NAME.txtpb) with what that file states (the device kind JAX reports, the
  compute capability, the memory the driver reports), and its dense peak."""
  name: str
  target_config: str                  # XLA's GpuTargetConfigProto, text form
  device_kind: str                    # jax.Device.device_kind ("NVIDIA H100 80GB HBM3")
  compute_capability: tuple           # (9, 0)
  memory_bytes: int                   # the whole card, as the driver reports it
  peak_flops: float                   # dense tensor-core peak FLOP/s in peak_dtype
  peak_dtype: str = "bfloat16"        # "float16" on the T4: it has no bf16 tensor cores


def _card(name: str, peak_flops: float, peak_dtype: str = "bfloat16") -> Card:
  """A Card from its target file (the single place its device figures are written)."""
  with open(os.path.join(GPU_TARGETS, f"{name}.txtpb")) as f:
    text = f.read()
  kind = re.search(r'device_description_str: "([^"]+)"', text).group(1)
  cc = re.search(r"cuda_compute_capability \{\s*major: (\d+)\s*minor: (\d+)", text)
  memory = int(re.search(r"device_memory_size: (\d+)", text).group(1))
  return Card(name, text, kind, (int(cc.group(1)), int(cc.group(2))), memory, peak_flops,
              peak_dtype)


# dense peaks per card (public figures): bf16 tensor cores; the T4 (Turing) has none, its
# fp16 tensor-core peak stands in (its fp32 peak is 8.1 TFLOP/s)
CARDS = {c.name: c for c in (
    _card("h100", 989e12),            # H100 SXM5 80 GB
    _card("h200", 989e12),            # H200 SXM 141 GB
    _card("a100", 312e12),            # A100 SXM4 80 GB
    _card("l4", 121e12),              # L4 24 GB
    _card("t4", 65e12, "float16"),    # T4 16 GB
)}


def card_of(device_kind: str) -> Optional[Card]:
  """The listed card JAX names `device_kind`, None for any other device."""
  return next((c for c in CARDS.values() if c.device_kind == device_kind), None)


def cuda_plugin_available() -> bool:
  """Whether JAX's CUDA plugin is installed (GPU compiles possible on this host)."""
  return any(importlib.util.find_spec(m) is not None
             for m in ("jax_cuda12_plugin", "jax_cuda13_plugin"))


def _mem_fraction() -> float:
  value = os.environ.get(MEM_FRACTION_ENV)
  if value is None:
    return MEM_FRACTION_DEFAULT
  try:
    fraction = float(value)
  except ValueError:
    fraction = -1.0
  if not 0 < fraction <= 1:
    raise ValueError(f"{MEM_FRACTION_ENV}={value!r} is invalid: allowed a number in (0, 1]")
  return fraction


@dataclasses.dataclass(frozen=True)
class GpuTopology:
  """`nodes` hosts of `gpus_per_node` cards each, and what a program may use on one card:
  `mem_fraction` of its memory less GPU_MARGIN_BYTES (`hbm_bytes`)."""
  name: str                           # as given ("h100-2x8")
  card: Card
  nodes: int
  gpus_per_node: int
  mem_fraction: float = MEM_FRACTION_DEFAULT

  platform = "gpu"

  @property
  def jax_topology(self) -> str:
    """JAX's GPU topology string: partitions x hosts a partition x devices a host."""
    return f"1x{self.nodes}x{self.gpus_per_node}"

  @property
  def num_devices(self) -> int:
    """Devices JAX sees: one a card."""
    return self.nodes * self.gpus_per_node

  @property
  def hbm_bytes(self) -> int:
    """The memory a program may use on one card (the fit is judged against it)."""
    return int(self.card.memory_bytes * self.mem_fraction) - GPU_MARGIN_BYTES

  @property
  def peak_flops(self) -> float:
    """Dense peak FLOP/s of one card (bf16; fp16 on the T4)."""
    return self.card.peak_flops

  @property
  def peak_text(self) -> str:
    """What `peak_flops` is, as the report says it."""
    return (f"the card's {self.card.peak_dtype} peak"
            + ("" if self.card.peak_dtype == "bfloat16" else " (no bf16 tensor cores)"))

  @property
  def memory_text(self) -> str:
    """What `hbm_bytes` is, as the report's header says it."""
    return (f"{self.hbm_bytes / GiB:.2f} GiB each for the program: {self.mem_fraction:g} of "
            f"{self.card.memory_bytes / GiB:.2f} GiB ({MEM_FRACTION_ENV}) less "
            f"{GPU_MARGIN_BYTES / GiB:g} GiB for workspaces")

  def devices(self, num_slices: int = 1) -> list:
    """The compile-only devices of the nodes (needs JAX's CUDA plugin, JAX_PLATFORMS=cpu
    on a host without a GPU)."""
    if num_slices != 1:
      raise ValueError(f"--num_slices={num_slices} is invalid for GPU nodes: allowed 1 "
                       f"(several nodes are named: {self.card.name}-{num_slices}x"
                       f"{self.gpus_per_node})")
    install = f"pip install \"jax[cuda12]=={jax.__version__}\""
    if not cuda_plugin_available():
      raise TopologyUnavailable(f"compiling for GPUs needs JAX's CUDA plugin (no GPU or "
                                f"driver needed): {install}")
    try:
      desc = jax_topologies.get_topology_desc("gpu", "cuda",
                                              target_config=self.card.target_config,
                                              topology=self.jax_topology)
    except Exception as e:
      raise TopologyUnavailable(
          f"could not build the {self.name} topology ({type(e).__name__}: "
          f"{_first_line(e)}); compiling for GPUs needs JAX's CUDA plugin of the installed "
          f"jax ({install}) and, on a host without a GPU, JAX_PLATFORMS=cpu") from e
    return _checked(list(desc.devices), self.num_devices, self.name)


def _gpu_topology(name: str) -> Optional[GpuTopology]:
  """The GpuTopology of 'CARD-N' or 'CARD-MxN', None when `name` is not of that form."""
  m = re.fullmatch(r"([a-z]+\d+)-(?:(\d+)x)?(\d+)", name.strip())
  if not m or m.group(1) not in CARDS:
    return None
  nodes, gpus = int(m.group(2) or 1), int(m.group(3))
  if gpus not in GPUS_PER_NODE or nodes < 1 or (m.group(2) and gpus != max(GPUS_PER_NODE)):
    raise _unknown(name)
  return GpuTopology(name.strip(), CARDS[m.group(1)], nodes, gpus, _mem_fraction())


def known_names() -> list[str]:
  """Every MaxText-style name the table resolves (e.g. 'v5e-16'), then the one-node GPU
  names ('h100-8'; 'h100-2x8' and the like name several nodes)."""
  out = []
  for gen, g in GENERATIONS.items():
    grids = _GRIDS_3D if g.dims == 3 else _GRIDS_2D
    for chips in grids:
      if chips <= _MAX_CHIPS[gen]:
        out.append(f"{gen}-{chips * g.cores_per_chip if g.name_counts_cores else chips}")
  return out + [f"{card}-{n}" for card in CARDS for n in GPUS_PER_NODE]


def _unknown(name: str) -> ValueError:
  return ValueError(f"--topology={name!r} is unknown: allowed a name such as "
                    f"{', '.join(known_names())} (chips on v5e/v6e, cores on v2-v4 and v5p; "
                    f"GPUs a node; CARD-Mx{max(GPUS_PER_NODE)} for M nodes), "
                    f"or JAX's 'GEN:AxB[xC]' with GEN one of {sorted(GENERATIONS)}")


def resolve(name: str) -> Union[Topology, GpuTopology]:
  """The Topology of a MaxText-style name or a JAX topology string, or the GpuTopology of
  a GPU node's name ('h100-8', 'h100-2x8')."""
  gpu = _gpu_topology(name)
  if gpu is not None:
    return gpu
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


def _answer_libtpus_host_questions() -> None:
  """libtpu, loaded on a host without chips, reads the TPU VM's accelerator type and
  worker hostnames from the environment and prints initialisation errors when they are
  unset. Give it a one-host answer there (setdefault: a user's values stand); what is
  compiled for is the topology asked for, not these."""
  if host_has_tpu_chips():
    return
  os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
  os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5litepod-4")


def devices(topology: Union[Topology, GpuTopology], num_slices: int = 1) -> list:
  """The compile-only devices of a topology (`num_slices` TPU slices over DCN)."""
  return topology.devices(num_slices)


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
