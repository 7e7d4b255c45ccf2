"""Attention kernels for full sequences (training and parallel forwards), chosen by
`ModelConfig.attention`:

  xla     `attention.attend` (any backend, any mask: the reference);
  cudnn   `jax.nn.dot_product_attention(implementation="cudnn")`: GPU only, fp16/bf16;
  splash  the Pallas TPU splash-attention kernel shipped with JAX: causal, segment ids
          (packed documents; padding is its own segment), local windows (its band
          mask; a layer scan mixing windows switches between one kernel per window),
          one head layout per call; sequences whose length is a multiple of 128 (others
          run `xla`); on a CPU it runs in Pallas interpret mode (tests);
  auto    splash on TPU v4 and later, xla on TPU v2 / v3 (Mosaic cannot lower the
          kernel's matmuls there), cudnn on GPU for bf16/fp16 models, xla otherwise.

The kernel is chosen for the devices the program is compiled for (`target()`: the
platform and device kind of the mesh in context, e.g. the train step's, else the default
backend), so a TPU step compiled on a CPU host (`t2mlr_jax.compile`) gets the TPU kernel,
and Pallas interpret mode is used only when the target devices are CPUs.

Decoding keeps its cached path (`layers.Attention`). Every kernel returns what `attend`
returns at every non-padding query (padding queries are zeroed, as `attend` zeroes
queries that see no key); the Jacobi/exact/parallel modes call them unchanged.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu import splash_attention as sa
from jax.sharding import PartitionSpec as P

from t2mlr_jax.config import ATTENTION_IMPLS, invalid
from t2mlr_jax.model.attention import attend
from t2mlr_jax.sharding import batch_axes
from t2mlr_jax.topologies import generation_of

SPLASH_BLOCK = 128
SPLASH_MIN_TPU = 4     # the first TPU generation Mosaic lowers the kernel for


__all__ = ["ATTENTION_IMPLS", "Target", "attend_full", "check_available", "for_devices",
           "resolve", "segments_for", "target", "target_of"]


@dataclasses.dataclass(frozen=True)
class Target:
  """What a kernel is compiled for: the platform ("tpu", "gpu", "cpu") and, on TPU, the
  generation number (2 for "TPU v2", 5 for "TPU v5 lite" and "TPU v5")."""
  platform: str
  device_kind: str = ""

  @property
  def tpu_generation(self):
    return generation_of(self.device_kind) if self.platform == "tpu" else None


def target_of(devices) -> Target:
  """The Target of a device list (all of one kind, as a mesh's are)."""
  d = list(devices)[0]
  return Target(d.platform, getattr(d, "device_kind", ""))


def target() -> Target:
  """The devices being compiled for: the mesh in context (`jax.sharding.use_abstract_mesh`,
  which carries its devices' platform and kind), else the default backend's."""
  mesh = jax.sharding.get_abstract_mesh()
  if not mesh.empty:
    dev = mesh.abstract_device
    if dev is not None:
      return Target(dev.platform, dev.device_kind)
  return target_of(jax.devices()[:1])


def resolve(impl: str, dtype: str, where: Target | None = None) -> str:
  """The kernel `impl` means on the target devices ("auto" resolved; `where` defaults to
  `target()`). Refuses splash on TPU v2 / v3 and cudnn off a GPU, naming the field."""
  where = target() if where is None else where
  gen = where.tpu_generation
  if impl == "auto":
    if where.platform == "tpu":
      return "splash" if gen is None or gen >= SPLASH_MIN_TPU else "xla"
    if where.platform == "gpu" and dtype in ("bfloat16", "float16"):
      return "cudnn"
    return "xla"
  if impl == "splash" and gen is not None and gen < SPLASH_MIN_TPU:
    invalid("attention", impl, f"'xla' or 'auto' on {where.device_kind}: the splash kernel "
            f"needs TPU v{SPLASH_MIN_TPU} or later (Mosaic cannot lower its bf16 matmuls on "
            "TPU v2 / v3)")
  if impl == "splash" and where.platform == "gpu":
    invalid("attention", impl, "'cudnn', 'xla' or 'auto' on a GPU: splash is a TPU kernel "
            "(it runs in Pallas interpret mode on CPUs, for tests)")
  if impl == "cudnn" and (where.platform != "gpu" or dtype not in ("bfloat16", "float16")):
    invalid("attention", impl, f"'xla', 'splash' or 'auto' here: cudnn needs a GPU and a "
            f"bfloat16/float16 model (devices {where.platform}, dtype {dtype})")
  return impl


def for_devices(cfg, devices):
  """cfg with `attention` resolved for `devices` (a mesh's): the step builders call it
  once, so a kernel the devices cannot run is refused before anything is traced."""
  if not hasattr(cfg, "attention"):
    return cfg
  impl = resolve(cfg.attention, cfg.dtype, target_of(devices))
  return cfg if impl == cfg.attention else cfg.replace(attention=impl)


def segments_for(control_flow_BT, segment_ids_BT):
  """[B, T] int32 segment ids the kernels mask with: the packed segment (0 without
  packing), and -1 on padding (cf 0), which no real token's segment equals."""
  seg = (jnp.zeros(control_flow_BT.shape, jnp.int32) if segment_ids_BT is None
         else segment_ids_BT.astype(jnp.int32))
  return jnp.where(control_flow_BT == 0, -1, jnp.maximum(seg, 0))


def attend_full(impl: str, q_BTNK, k_BTMK, v_BTMK, mask_BTT, segments_BT, window=None,
                windows: tuple = ()):
  """Self-attention of a full sequence with kernel `impl` (resolved); `segments_BT` from
  `segments_for` (None: the mask is not a causal-within-segment mask, run xla). window:
  this layer's local window W (key s visible from t iff 0 <= t - s <= W; `mask_BTT` is
  already narrowed to it), a Python int, None (full), or a traced int32 taking one of
  `windows` (the model's per-layer windows, when a layer scan mixes them: each value gets
  its own kernel, chosen by `lax.switch`)."""
  T = q_BTNK.shape[1]
  if impl == "splash" and segments_BT is not None and T % SPLASH_BLOCK == 0:
    if window is None or isinstance(window, int):
      out = _splash(q_BTNK, k_BTMK, v_BTMK, segments_BT, window)
    else:
      choices = tuple(sorted(set(windows)))
      branches = [functools.partial(_splash, window=w) for w in choices]
      index = jnp.searchsorted(jnp.asarray(choices, jnp.int32), window)
      out = jax.lax.switch(index, branches, q_BTNK, k_BTMK, v_BTMK, segments_BT)
  elif impl == "cudnn" and segments_BT is not None:
    out = _cudnn(q_BTNK, k_BTMK, v_BTMK, mask_BTT)
  else:
    return attend(q_BTNK, k_BTMK, v_BTMK, mask_BTT)
  has_key = jnp.any(mask_BTT, axis=-1)[:, :, None, None]
  return jnp.where(has_key, out, jnp.zeros((), out.dtype))


@functools.lru_cache(maxsize=None)
def _splash_kernel(heads: int, T: int, interpret: bool, window=None):
  if window is None or window >= T - 1:
    one = sa.CausalMask((T, T))
  else:                    # 0 <= t - s <= window: the causal band of the local window
    one = sa.LocalMask((T, T), window_size=(int(window), 0), offset=0)
  mask = sa.MultiHeadMask([one for _ in range(heads)])
  b = min(SPLASH_BLOCK, T)
  sizes = sa.BlockSizes(block_q=b, block_kv=b, block_kv_compute=b, block_q_dkv=b,
                        block_kv_dkv=b, block_kv_dkv_compute=b, block_q_dq=b, block_kv_dq=b)
  # built once per shape with concrete mask-info arrays (cached: never a tracer of the
  # trace that first asked for it)
  with jax.ensure_compile_time_eval():
    return sa.make_splash_mha(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1,
                              interpret=interpret)


def _splash(q_BTNK, k_BTMK, v_BTMK, segments_BT, window=None):
  """Splash over a mesh: a Pallas kernel is opaque to XLA's partitioner, so under the
  train step's mesh it runs per shard (jax.shard_map): the batch split over
  ('data', 'fsdp') and the heads over 'tensor' where they divide, else replicated."""
  local = functools.partial(_splash_local, window=window)
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.size == 1:
    return local(q_BTNK, k_BTMK, v_BTMK, segments_BT)
  B, N, M = q_BTNK.shape[0], q_BTNK.shape[2], k_BTMK.shape[2]
  axes = batch_axes(mesh)
  batch = axes if B % math.prod(mesh.shape[a] for a in axes) == 0 else None
  t = mesh.shape.get("tensor", 1)
  heads = "tensor" if N % t == 0 and M % t == 0 else None
  qkv, seg = P(batch, None, heads, None), P(batch, None)
  return jax.shard_map(local, mesh=mesh, in_specs=(qkv, qkv, qkv, seg),
                       out_specs=qkv, check_vma=False)(q_BTNK, k_BTMK, v_BTMK, segments_BT)


def _splash_local(q_BTNK, k_BTMK, v_BTMK, segments_BT, window=None):
  B, T, N, K = q_BTNK.shape
  G = N // k_BTMK.shape[2]
  kernel = _splash_kernel(N, T, target().platform == "cpu", window)   # interpret on CPUs
  heads_first = lambda a: jnp.swapaxes(a, 1, 2)                      # [B, H, T, K]
  q = heads_first(q_BTNK) * jnp.asarray(1.0 / math.sqrt(K), q_BTNK.dtype)
  k = heads_first(jnp.repeat(k_BTMK, G, axis=2))                     # grouped heads
  v = heads_first(jnp.repeat(v_BTMK, G, axis=2))
  one = lambda q, k, v, s: kernel(q, k, v, segment_ids=sa.SegmentIds(q=s, kv=s))
  out = jax.vmap(one)(q, k, v, segments_BT)
  return jnp.swapaxes(out, 1, 2).astype(q_BTNK.dtype)


def _cudnn(q_BTNK, k_BTMK, v_BTMK, mask_BTT):
  return jax.nn.dot_product_attention(q_BTNK, k_BTMK, v_BTMK, mask=mask_BTT[:, None],
                                      implementation="cudnn")


def check_available(impl: str, dtype: str) -> None:
  """Refuse a kernel the default backend cannot run, naming the field."""
  resolve(impl, dtype, target_of(jax.devices()[:1]))
