"""Attention kernels for full sequences (training and parallel forwards), chosen by
`ModelConfig.attention`:

  xla     `attention.attend` (any backend, any mask: the reference);
  cudnn   cuDNN's fused flash attention (`jax.nn.dot_product_attention(
          implementation="cudnn")`): NVIDIA GPUs of compute capability 8.0 (Ampere) and
          later, fp16/bf16 models, head sizes that are multiples of 8 up to 128 (256
          from Hopper, 9.0, on); two forms (`_cudnn`): without packed documents causal
          with sequence lengths and the layer's local window (no mask in memory), with
          them the dense mask; an odd length with the mask runs `xla`;
  splash  the Pallas TPU splash-attention kernel shipped with JAX: causal, segment ids
          (packed documents; padding is its own segment), local windows (its band
          mask; a layer scan mixing windows switches between one kernel per window),
          one head layout per call; sequences whose length is a multiple of 128 (others
          run `xla`); on a CPU it runs in Pallas interpret mode (tests);
  auto    splash on TPU v4 and later, xla on TPU v2 / v3 (Mosaic cannot lower the
          kernel's matmuls there), cudnn on GPUs where it runs (above), xla otherwise
          (fp32 models; the T4, compute capability 7.5).

The kernel is chosen for the devices the program is compiled for (`target()`: the
platform, device kind and GPU compute capability of the mesh in context, e.g. the train
step's, else the default backend), so a TPU or GPU step compiled on a CPU host
(`t2mlr_jax.compile`) gets that accelerator's kernel, and Pallas interpret mode is used
only when the target devices are CPUs. JAX's own cuDNN checks read the local backend (a
CPU there), so the card's limits are applied here (`cudnn_unsupported`).

Decoding keeps its cached path (`layers.Attention`). Every kernel returns what `attend`
returns at every non-padding query (padding queries are zeroed, as `attend` zeroes
queries that see no key); the Jacobi/exact/parallel modes call them unchanged.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu import splash_attention as sa
from jax.sharding import PartitionSpec as P

from t2mlr_jax.accel.topologies import card_of, generation_of
from t2mlr_jax.config import ATTENTION_IMPLS, invalid
from t2mlr_jax.model.attention import attend
from t2mlr_jax.sharding import batch_axes

SPLASH_BLOCK = 128
SPLASH_MIN_TPU = 4     # the first TPU generation Mosaic lowers the kernel for
# cuDNN's fused flash attention (fp16 / bf16): Ampere (8.0) and later; head sizes that are
# multiples of 8, up to 128 before Hopper (9.0), up to 256 from it on
CUDNN_DTYPES = ("bfloat16", "float16")
CUDNN_MIN_CAPABILITY = (8, 0)
CUDNN_HEAD_MULTIPLE = 8
CUDNN_MAX_HEAD = {(9, 0): 256, (8, 0): 128}   # from this capability on: the largest head


__all__ = ["ATTENTION_IMPLS", "KernelInputs", "Target", "attend_full", "check_available",
           "cudnn_unsupported", "for_devices", "kernel_inputs", "resolve", "segments_for",
           "target", "target_of"]


@dataclasses.dataclass(frozen=True)
class Target:
  """What a kernel is compiled for: the platform ("tpu", "gpu", "cpu"), the device kind,
  and on a GPU its compute capability ((9, 0) on Hopper; None when unknown). On TPU the
  generation number comes from the kind (2 for "TPU v2", 5 for "TPU v5 lite" and
  "TPU v5")."""
  platform: str
  device_kind: str = ""
  compute_capability: Optional[tuple] = None

  @property
  def tpu_generation(self):
    return generation_of(self.device_kind) if self.platform == "tpu" else None


def _capability(device_kind: str, device=None) -> Optional[tuple]:
  """A GPU's compute capability: the device's own (a real or compile-only GPU reports
  it), else the listed card's of that kind (topologies.CARDS: an abstract mesh carries
  only the kind), else a local device's of that kind; None when unknown."""
  cc = getattr(device, "compute_capability", None)
  if cc is None:
    card = card_of(device_kind)
    if card is not None:
      return card.compute_capability
    local = next((d for d in jax.local_devices() if d.device_kind == device_kind), None)
    cc = getattr(local, "compute_capability", None)
  return None if cc is None else tuple(int(x) for x in str(cc).split(".")[:2])


def target_of(devices) -> Target:
  """The Target of a device list (all of one kind, as a mesh's are)."""
  d = list(devices)[0]
  kind = getattr(d, "device_kind", "")
  return Target(d.platform, kind, _capability(kind, d) if d.platform == "gpu" else None)


def target() -> Target:
  """The devices being compiled for: the mesh in context (`jax.sharding.use_abstract_mesh`,
  which carries its devices' platform and kind), else the default backend's."""
  mesh = jax.sharding.get_abstract_mesh()
  if not mesh.empty:
    dev = mesh.abstract_device
    if dev is not None:
      gpu = dev.platform == "gpu"
      return Target(dev.platform, dev.device_kind,
                    _capability(dev.device_kind) if gpu else None)
  return target_of(jax.devices()[:1])


def cudnn_unsupported(where: Target, dtype: str, head_dim: Optional[int] = None
                      ) -> Optional[str]:
  """Why cuDNN's fused attention cannot run a `dtype` model of head size `head_dim` on
  `where` ("a GPU of compute capability 8.0 or later (Tesla T4 is 7.5)"), None when it
  can. An unknown capability (a GPU not in topologies.CARDS, under an abstract mesh) is
  taken to support it."""
  if where.platform != "gpu" or dtype not in CUDNN_DTYPES:
    return (f"a GPU and a bfloat16/float16 model (devices {where.platform}, dtype "
            f"{dtype})")
  cc = where.compute_capability
  if cc is not None and tuple(cc) < CUDNN_MIN_CAPABILITY:
    return (f"a GPU of compute capability {'.'.join(map(str, CUDNN_MIN_CAPABILITY))} or "
            f"later ({where.device_kind} is {'.'.join(map(str, cc))})")
  if head_dim is not None:
    largest = max(CUDNN_MAX_HEAD.items())[1] if cc is None else max(
        (h for c, h in CUDNN_MAX_HEAD.items() if tuple(cc) >= c), default=0)
    if head_dim % CUDNN_HEAD_MULTIPLE or head_dim > largest:
      return (f"a head size that is a multiple of {CUDNN_HEAD_MULTIPLE} and at most "
              f"{largest} on {where.device_kind or 'this GPU'} (model.head_dim {head_dim})")
  return None


def resolve(impl: str, dtype: str, where: Target | None = None,
            head_dim: Optional[int] = None) -> str:
  """The kernel `impl` means on the target devices ("auto" resolved; `where` defaults to
  `target()`) for a `dtype` model of head size `head_dim` (None: not checked). Refuses
  splash on TPU v2 / v3 or a GPU, and cudnn where it cannot run, naming the field."""
  where = target() if where is None else where
  gen = where.tpu_generation
  if impl == "auto":
    if where.platform == "tpu":
      return "splash" if gen is None or gen >= SPLASH_MIN_TPU else "xla"
    if where.platform == "gpu" and cudnn_unsupported(where, dtype, head_dim) is None:
      return "cudnn"
    return "xla"
  if impl == "splash" and gen is not None and gen < SPLASH_MIN_TPU:
    invalid("attention", impl, f"'xla' or 'auto' on {where.device_kind}: the splash kernel "
            f"needs TPU v{SPLASH_MIN_TPU} or later (Mosaic cannot lower its bf16 matmuls on "
            "TPU v2 / v3)", prefix="model.")
  if impl == "splash" and where.platform == "gpu":
    invalid("attention", impl, "'cudnn', 'xla' or 'auto' on a GPU: splash is a TPU kernel "
            "(it runs in Pallas interpret mode on CPUs, for tests)", prefix="model.")
  why = cudnn_unsupported(where, dtype, head_dim) if impl == "cudnn" else None
  if why is not None:
    allowed = ("'xla' or 'auto' on " + (where.device_kind or "this GPU")
               if where.platform == "gpu" else "'xla', 'splash' or 'auto' here")
    invalid("attention", impl, f"{allowed}: cudnn needs {why}", prefix="model.")
  return impl


def for_devices(cfg, devices):
  """cfg with `attention` resolved for `devices` (a mesh's): the step builders call it
  once, so a kernel the devices cannot run is refused before anything is traced."""
  if not hasattr(cfg, "attention"):
    return cfg
  impl = resolve(cfg.attention, cfg.dtype, target_of(devices), cfg.head_dim)
  return cfg if impl == cfg.attention else cfg.replace(attention=impl)


def segments_for(control_flow_BT, segment_ids_BT):
  """[B, T] int32 segment ids the kernels mask with: the packed segment (0 without
  packing), and -1 on padding (cf 0), which no real token's segment equals."""
  seg = (jnp.zeros(control_flow_BT.shape, jnp.int32) if segment_ids_BT is None
         else segment_ids_BT.astype(jnp.int32))
  return jnp.where(control_flow_BT == 0, -1, jnp.maximum(seg, 0))


class KernelInputs(NamedTuple):
  """What the fused kernels mask with, built once per sequence (`kernel_inputs`).

  segments_BT: [B, T] int32 from `segments_for` (splash's segment ids; -1 is padding).
  lengths_B: [B] int32, each row's tokens before its trailing padding (at least 1), given
  when the sequence has no segment ids: cuDNN then runs causal with these lengths and no
  mask. None with segment ids (packed documents, or padding elsewhere than at the end,
  as generate's left-padded prompts give it), where cuDNN takes the dense mask."""
  segments_BT: jnp.ndarray
  lengths_B: Optional[jnp.ndarray] = None


def kernel_inputs(control_flow_BT, segment_ids_BT) -> KernelInputs:
  """The KernelInputs of a sequence: its segments, and its lengths when it has no segment
  ids (its padding, control flow 0, then must be at the end of each row: the data
  pipelines pad on the right)."""
  segments = segments_for(control_flow_BT, segment_ids_BT)
  if segment_ids_BT is not None:
    return KernelInputs(segments)
  T = control_flow_BT.shape[1]
  after_last = jnp.max(jnp.where(control_flow_BT != 0, jnp.arange(1, T + 1), 0), axis=1)
  return KernelInputs(segments, jnp.maximum(after_last, 1).astype(jnp.int32))


def attend_full(impl: str, q_BTNK, k_BTMK, v_BTMK, mask_BTT,
                inputs: Optional[KernelInputs], window=None, windows: tuple = ()):
  """Self-attention of a full sequence with kernel `impl` (resolved); `inputs` from
  `kernel_inputs` (None: the mask is not a causal-within-segment mask, run xla). window:
  this layer's local window W (key s visible from t iff 0 <= t - s <= W; `mask_BTT` is
  already narrowed to it), a Python int, None (full), or a traced int32 taking one of
  `windows` (the model's per-layer windows, when a layer scan mixes them: each value gets
  its own kernel, chosen by `lax.switch`)."""
  T = q_BTNK.shape[1]
  if impl == "splash" and inputs is not None and T % SPLASH_BLOCK == 0:
    if window is None or isinstance(window, int):
      out = _splash(q_BTNK, k_BTMK, v_BTMK, inputs.segments_BT, window)
    else:
      choices = tuple(sorted(set(windows)))
      branches = [functools.partial(_splash, window=w) for w in choices]
      index = jnp.searchsorted(jnp.asarray(choices, jnp.int32), window)
      out = jax.lax.switch(index, branches, q_BTNK, k_BTMK, v_BTMK, inputs.segments_BT)
    keep = jnp.any(mask_BTT, axis=-1)
  elif impl == "cudnn" and inputs is not None and (inputs.lengths_B is not None
                                                  or T % 2 == 0):
    out = _cudnn(q_BTNK, k_BTMK, v_BTMK, inputs, mask_BTT, window, windows)
    keep = inputs.segments_BT >= 0          # every real query sees itself
  else:
    return attend(q_BTNK, k_BTMK, v_BTMK, mask_BTT)
  return jnp.where(keep[:, :, None, None], out, jnp.zeros((), out.dtype))


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


def _cudnn(q_BTNK, k_BTMK, v_BTMK, inputs: KernelInputs, mask_BTT, window=None,
           windows: tuple = (), implementation: str = "cudnn"):
  """cuDNN's fused attention in the cheapest form the sequence allows (docs/gpu.md):

  causal  no segment ids (`inputs.lengths_B` given): `is_causal` with the rows' lengths
          as query and key lengths (trailing padding skipped) and the layer's window as
          cuDNN's sliding window: O(B) inputs, no mask, the blocks outside the causal
          band skipped; a traced window (a layer scan mixing windows) switches between
          one call per window;
  mask    segment ids (packed documents): the dense [B, 1, T, T] mask (already narrowed
          to the window), which JAX hands cuDNN as an additive bias: 2·B·T² bytes a call
          and, under grad, a bias gradient of the same size (JAX's cuDNN VJP always
          computes it); with `is_causal` so the blocks above the diagonal are skipped.

  `implementation="xla"` runs the same arguments through JAX's reference (tests)."""
  call = functools.partial(jax.nn.dot_product_attention, is_causal=True,
                           implementation=implementation)
  if inputs.lengths_B is None:
    return call(q_BTNK, k_BTMK, v_BTMK, mask=mask_BTT[:, None])
  T, lengths = q_BTNK.shape[1], inputs.lengths_B

  def one(q, k, v, window):
    local = None if window is None or window >= T - 1 else (int(window), 0)
    return call(q, k, v, query_seq_lengths=lengths, key_value_seq_lengths=lengths,
                local_window_size=local)

  if window is None or isinstance(window, int):
    return one(q_BTNK, k_BTMK, v_BTMK, window)
  choices = tuple(sorted(set(windows)))
  index = jnp.searchsorted(jnp.asarray(choices, jnp.int32), window)
  return jax.lax.switch(index, [functools.partial(one, window=w) for w in choices],
                        q_BTNK, k_BTMK, v_BTMK)


def check_available(impl: str, dtype: str, head_dim: Optional[int] = None) -> None:
  """Refuse a kernel the default backend cannot run, naming the field."""
  resolve(impl, dtype, target_of(jax.devices()[:1]), head_dim)
