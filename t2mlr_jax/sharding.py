"""Device mesh over ('data', 'fsdp', 'tensor') and the partition-spec table.

Every parameter kind has a row of logical axes; logical axes map to mesh axes.
A dimension its mesh axis does not divide (e.g. 9 heads on tensor=2) is
replicated instead; the 'fsdp' axis then tries the array's other dimensions first
(`spec_for`). Optimizer state mirrors the parameters: any leaf whose path
ends in a parameter path gets that parameter's spec; everything else (step
counters, scalars) is replicated.
"""

from __future__ import annotations

import math
import re
from typing import Any, Mapping, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from t2mlr_jax.config import ModelConfig
from t2mlr_jax.registry import FAMILIES, RECURRENCES

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")   # the batch dimension is split over both
# When 'fsdp' does not divide the model's width (576 on 256 chips), make_mesh factors it as
# fsdp x fsdp_inner, the outer part dividing the width: an array then shards over two of
# its dimensions (576 / 64 and 576 / 4), and the batch over data x fsdp x fsdp_inner.
FSDP_INNER = "fsdp_inner"

# Parameter paths (regex on "a/b/c") -> logical axis per dimension: each model family and
# each recurrence type declares its own rows (`partition_rules`; `param_rules` joins them).
LOGICAL_TO_MESH = {"vocab": "tensor", "embed": "fsdp", "q_heads": "tensor",
                   "kv_heads": "tensor", "mlp": "tensor", "layers": None}


def param_rules() -> tuple:
  """The partition table: every registered model family's rows, then every recurrence
  type's (read at each call, so an entry registered later is covered)."""
  return (tuple(r for f in FAMILIES.values() for r in f.partition_rules)
          + tuple(r for t in RECURRENCES.values() for r in t.partition_rules))


def fsdp_factors(fsdp: int, width: Optional[int]) -> tuple[int, int]:
  """(outer, inner) with fsdp = outer * inner and outer the largest divisor of fsdp that
  divides `width` (the model's d_model): (fsdp, 1) when fsdp divides it or width is None."""
  if width is None or width % fsdp == 0:
    return fsdp, 1
  outer = max(d for d in range(1, fsdp + 1) if fsdp % d == 0 and width % d == 0)
  return outer, fsdp // outer


def make_mesh(shape: Mapping[str, int], devices: Optional[Sequence[Any]] = None,
              model_width: Optional[int] = None) -> Mesh:
  """A mesh over MESH_AXES; one entry may be -1 (all remaining devices). model_width
  (the trainer passes d_model): when 'fsdp' does not divide it, the fsdp axis is factored
  into ('fsdp', 'fsdp_inner'), 'fsdp' the largest part that divides it (FSDP_INNER)."""
  devices = list(jax.devices() if devices is None else devices)
  sizes = {ax: int(shape.get(ax, 1)) for ax in MESH_AXES}
  unknown = sorted(set(shape) - set(MESH_AXES))
  if unknown:
    raise ValueError(f"mesh has unknown axes {unknown}: allowed {MESH_AXES}")
  free = [ax for ax, s in sizes.items() if s == -1]
  if len(free) > 1:
    raise ValueError(f"mesh: at most one axis may be -1, got {free}")
  for ax, s in sizes.items():
    if s == 0 or s < -1:
      raise ValueError(f"mesh.{ax}={s} is invalid: allowed a positive size or -1")
  fixed = math.prod(s for s in sizes.values() if s != -1)
  if free:
    if len(devices) % fixed:
      raise ValueError(f"mesh {sizes}: {len(devices)} devices are not divisible by the "
                       f"fixed axes' product {fixed}")
    sizes[free[0]] = len(devices) // fixed
  if math.prod(sizes.values()) != len(devices):
    raise ValueError(f"mesh shape {sizes} needs {math.prod(sizes.values())} devices but "
                     f"{len(devices)} are available: allowed shapes whose product is "
                     f"{len(devices)} (use -1 for one axis)")
  outer, inner = fsdp_factors(sizes["fsdp"], model_width)
  names = MESH_AXES if inner == 1 else ("data", "fsdp", FSDP_INNER, "tensor")
  shape_ = ([sizes[a] for a in MESH_AXES] if inner == 1
            else [sizes["data"], outer, inner, sizes["tensor"]])
  auto = (jax.sharding.AxisType.Auto,) * len(names)
  slices = len({getattr(d, "slice_index", 0) for d in devices})
  if slices > 1:
    # several slices (DCN between them): 'data' spans the slices, the rest each slice
    if sizes["data"] % slices:
      raise ValueError(f"mesh.data={sizes['data']} is invalid over {slices} slices: allowed "
                       f"multiples of {slices} (the data axis spans the slices)")
    ici = [shape_[0] // slices, *shape_[1:]]
    dcn = [slices] + [1] * (len(shape_) - 1)
    grid = mesh_utils.create_hybrid_device_mesh(ici, dcn, devices=devices)
    return Mesh(grid, names, axis_types=auto)
  # the topology-aware device order on TPU/GPU (ICI-local axes last), for any device list;
  # Auto axes keep sharding propagation as with the plain Mesh
  try:
    return jax.make_mesh(shape_, names, axis_types=auto, devices=devices)
  except (ValueError, NotImplementedError, AssertionError):
    # a device subset the topology-aware order cannot tile: keep the given order
    return Mesh(np.asarray(devices).reshape(shape_), names, axis_types=auto)


def batch_axes(mesh) -> tuple[str, ...]:
  """The mesh axes the batch dimension is split over: data x fsdp (x fsdp_inner)."""
  names = tuple(mesh.axis_names)
  return BATCH_AXES + ((FSDP_INNER,) if FSDP_INNER in names else ())


def _path_str(path) -> str:
  return "/".join(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k))))
                  for k in path)


def _logical_size(cfg: Optional[ModelConfig], logical: str, dim_size: int) -> int:
  """The count a mesh axis must divide: heads for head dims, else the dim size."""
  if cfg is not None and logical == "q_heads":
    return cfg.n_heads
  if cfg is not None and logical == "kv_heads":
    return cfg.n_kv_heads
  return dim_size


def spec_for(path: str, shape: Sequence[int], mesh: Mesh,
             cfg: Optional[ModelConfig] = None) -> P:
  """The PartitionSpec of one array from the rule table (replicated if no rule).

  FSDP's fallback: when the 'fsdp' axis does not divide the dimension the table gives it
  (576 on 256 devices), it shards the first other dimension it divides (never the
  stacked layers', which the layer scan slices), replicating only when none does. On a
  mesh with 'fsdp_inner' (make_mesh's factoring), a dimension both divide takes both;
  otherwise 'fsdp' takes one dimension and 'fsdp_inner' another."""
  for pattern, logical_axes in param_rules():
    if re.search(pattern, path) and len(logical_axes) == len(shape):
      axes = []
      for logical, size in zip(logical_axes, shape):
        mesh_axis = LOGICAL_TO_MESH.get(logical) if logical else None
        if mesh_axis == "fsdp":
          axes.append(None)             # placed below
          continue
        n = mesh.shape[mesh_axis] if mesh_axis else 1
        count = _logical_size(cfg, logical, size) if logical else size
        ok = mesh_axis is not None and n > 1 and count % n == 0 and size % n == 0
        axes.append(mesh_axis if ok else None)
      _place_fsdp(axes, logical_axes, shape, mesh)
      return P(*axes)
  return P()


def _place_fsdp(axes: list, logical_axes, shape, mesh) -> None:
  """Put the fsdp axis (and fsdp_inner) on the array's free dimensions, in place: the
  table's 'embed' dimension first, then the others (never 'layers'). One dimension the
  whole extent divides takes it all; else 'fsdp' one and 'fsdp_inner' another."""
  outer = mesh.shape["fsdp"] if "fsdp" in mesh.axis_names else 1
  inner = mesh.shape[FSDP_INNER] if FSDP_INNER in mesh.axis_names else 1
  wanted = [i for i, lg in enumerate(logical_axes) if lg and LOGICAL_TO_MESH.get(lg) == "fsdp"]
  if outer * inner == 1 or not wanted:
    return
  order = wanted + [i for i, lg in enumerate(logical_axes) if i not in wanted and lg != "layers"]
  for i in order:
    if axes[i] is None and shape[i] % (outer * inner) == 0:
      axes[i] = ("fsdp", FSDP_INNER) if inner > 1 else "fsdp"
      return
  placed = None
  for i in order:
    if outer > 1 and axes[i] is None and shape[i] % outer == 0:
      axes[i], placed = "fsdp", i
      break
  for i in order:
    if inner > 1 and axes[i] is None and i != placed and shape[i] % inner == 0:
      axes[i] = FSDP_INNER
      break


def replicated_bytes(tree, shardings) -> tuple[int, int]:
  """(bytes stored whole on every device, total bytes) of a tree of arrays or shapes
  and its shardings: what FSDP could not split."""
  rep = total = 0
  for leaf, sh in zip(jax.tree.leaves(tree), jax.tree.leaves(shardings)):
    nbytes = math.prod(leaf.shape) * np.dtype(leaf.dtype).itemsize
    total += nbytes
    if all(ax is None for ax in tuple(sh.spec)) and sh.mesh.size > 1:
      rep += nbytes
  return rep, total


def per_device_bytes(tree, shardings) -> int:
  """Bytes one device holds of a tree placed with `shardings` (the largest shard)."""
  out = 0
  for leaf, sh in zip(jax.tree.leaves(tree), jax.tree.leaves(shardings)):
    shard = sh.shard_shape(tuple(leaf.shape))
    out += math.prod(shard) * np.dtype(leaf.dtype).itemsize
  return out


def tree_shardings(tree, mesh: Mesh, cfg: Optional[ModelConfig] = None):
  """NamedShardings for every leaf of a params / train-state tree (arrays or shapes)."""
  def one(path, leaf):
    shape = getattr(leaf, "shape", ())
    return NamedSharding(mesh, spec_for(_path_str(path), shape, mesh, cfg))
  return jax.tree_util.tree_map_with_path(one, tree)


def batch_sharding(mesh: Mesh, ndim: int = 2) -> NamedSharding:
  """Batch-major arrays: the batch split over ('data', 'fsdp'[, 'fsdp_inner']), the rest
  replicated."""
  return NamedSharding(mesh, P(batch_axes(mesh), *([None] * (ndim - 1))))


def constrain_batch(x):
  """x (an array or a pytree of them: a recurrent state) with its leading (batch) axis
  constrained to ('data', 'fsdp') and the rest replicated, when traced under a mesh with those axes (`jax.sharding.use_abstract_mesh`,
  as the train step is); unchanged otherwise, or when the batch does not divide. Applied
  at layer boundaries and on the Jacobi / interleaved carries, so activations keep the
  batch layout whatever XLA's propagation would pick."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or not set(BATCH_AXES) <= set(mesh.axis_names):
    return x
  axes = batch_axes(mesh)
  n = math.prod(mesh.shape[a] for a in axes)

  def one(a):
    if a.shape[0] % n:
      return a
    return jax.lax.with_sharding_constraint(a, P(axes, *([None] * (a.ndim - 1))))
  return jax.tree.map(one, x)


def shard_eval_batch(batch: dict, mesh: Optional[Mesh], pad_values: dict):
  """(batch as global arrays split over the mesh's batch axes, real rows): evaluation's
  layout, the training batch's. Every process holds the whole eval batch (it is
  generated or read identically everywhere) and supplies its devices' rows; rows are
  padded with `pad_values` (unsupervised) up to a multiple of data × fsdp. mesh=None:
  the batch as default-device arrays, as before."""
  rows = len(next(iter(batch.values())))
  if mesh is None:
    return {k: jnp.asarray(v) for k, v in batch.items()}, rows
  extra = -rows % batch_divisor(mesh)
  out = {}
  for k, v in batch.items():
    v = np.asarray(v)
    if extra:
      fill = np.full((extra, *v.shape[1:]), pad_values.get(k, 0), v.dtype)
      v = np.concatenate([v, fill])
    sharding = batch_sharding(mesh, ndim=v.ndim)
    out[k] = jax.make_array_from_callback(v.shape, sharding, lambda index, v=v: v[index])
  return out, rows


def batch_divisor(mesh: Mesh) -> int:
  """Devices a batch is split over (data × fsdp): the global batch must be a multiple."""
  return math.prod(mesh.shape[a] for a in batch_axes(mesh))


def process_batch_slot(mesh: Mesh, global_batch: int) -> tuple[int, int]:
  """(slot, slots): this process feeds global batch rows [slot·B/slots, (slot+1)·B/slots).

  Processes whose devices hold the same batch rows (a 'tensor' axis spanning hosts, or a
  batch axis smaller than the process count) share a slot and must read the same
  examples; with one slot per process this is (process_index, process_count)."""
  rows = set()
  sharding = batch_sharding(mesh, ndim=1)
  for index in sharding.addressable_devices_indices_map((global_batch,)).values():
    sl = index[0]
    rows.add((sl.start or 0, global_batch if sl.stop is None else sl.stop))
  start, stop = min(r[0] for r in rows), max(r[1] for r in rows)
  covered = sorted(rows)
  if any(a[1] < b[0] for a, b in zip(covered, covered[1:])):
    raise ValueError(f"this process's devices hold non-contiguous batch rows {covered}: "
                     "order the mesh's devices by process")
  size = stop - start
  if global_batch % size or start % size:
    raise ValueError(f"this process's batch rows [{start}, {stop}) do not tile the global "
                     f"batch of {global_batch}")
  return start // size, global_batch // size
