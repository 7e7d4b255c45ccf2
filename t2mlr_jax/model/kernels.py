"""Attention kernels for full sequences (training and parallel forwards), chosen by
`ModelConfig.attention`:

  xla     `layers.attend` (any backend, any mask: the reference);
  cudnn   `jax.nn.dot_product_attention(implementation="cudnn")`: GPU only, fp16/bf16;
  splash  the Pallas TPU splash-attention kernel shipped with JAX: causal, segment ids
          (packed documents; padding is its own segment), one head layout per call;
          sequences whose length is a multiple of 128 and layers without a local window
          (others run `xla`); on a CPU it runs in Pallas interpret mode (tests);
  auto    splash on TPU, cudnn on GPU for bf16/fp16 models, xla otherwise.

Decoding keeps its cached path (`layers.Attention`). Every kernel returns what `attend`
returns at every non-padding query (padding queries are zeroed, as `attend` zeroes
queries that see no key); the Jacobi/exact/parallel modes call them unchanged.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from t2mlr_jax.config import ATTENTION_IMPLS, invalid
from t2mlr_jax.model.layers import attend

SPLASH_BLOCK = 128


__all__ = ["ATTENTION_IMPLS", "attend_full", "check_available", "resolve", "segments_for"]


def resolve(impl: str, dtype: str, backend: str | None = None) -> str:
  """The kernel `impl` means on this backend ("auto" resolved)."""
  backend = backend or jax.default_backend()
  if impl != "auto":
    return impl
  if backend == "tpu":
    return "splash"
  if backend == "gpu" and dtype in ("bfloat16", "float16"):
    return "cudnn"
  return "xla"


def segments_for(control_flow_BT, segment_ids_BT):
  """[B, T] int32 segment ids the kernels mask with: the packed segment (0 without
  packing), and -1 on padding (cf 0), which no real token's segment equals."""
  seg = (jnp.zeros(control_flow_BT.shape, jnp.int32) if segment_ids_BT is None
         else segment_ids_BT.astype(jnp.int32))
  return jnp.where(control_flow_BT == 0, -1, jnp.maximum(seg, 0))


def attend_full(impl: str, q_BTNK, k_BTMK, v_BTMK, mask_BTT, segments_BT):
  """Self-attention of a full sequence with kernel `impl` (resolved); `segments_BT` from
  `segments_for` (None: the mask is not a causal-within-segment mask, run xla)."""
  T = q_BTNK.shape[1]
  if impl == "splash" and segments_BT is not None and T % SPLASH_BLOCK == 0:
    out = _splash(q_BTNK, k_BTMK, v_BTMK, segments_BT)
  elif impl == "cudnn" and segments_BT is not None:
    out = _cudnn(q_BTNK, k_BTMK, v_BTMK, mask_BTT)
  else:
    return attend(q_BTNK, k_BTMK, v_BTMK, mask_BTT)
  has_key = jnp.any(mask_BTT, axis=-1)[:, :, None, None]
  return jnp.where(has_key, out, jnp.zeros((), out.dtype))


@functools.lru_cache(maxsize=None)
def _splash_kernel(heads: int, T: int, interpret: bool):
  from jax.experimental.pallas.ops.tpu import splash_attention as sa
  mask = sa.MultiHeadMask([sa.CausalMask((T, T)) for _ in range(heads)])
  b = min(SPLASH_BLOCK, T)
  sizes = sa.BlockSizes(block_q=b, block_kv=b, block_kv_compute=b, block_q_dkv=b,
                        block_kv_dkv=b, block_kv_dkv_compute=b, block_q_dq=b, block_kv_dq=b)
  # built once per shape with concrete mask-info arrays (cached: never a tracer of the
  # trace that first asked for it)
  with jax.ensure_compile_time_eval():
    return sa.make_splash_mha(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1,
                              interpret=interpret)


def _splash(q_BTNK, k_BTMK, v_BTMK, segments_BT):
  """Splash over a mesh: a Pallas kernel is opaque to XLA's partitioner, so under the
  train step's mesh it runs per shard (jax.shard_map): the batch split over
  ('data', 'fsdp') and the heads over 'tensor' where they divide, else replicated."""
  from jax.sharding import PartitionSpec as P

  from t2mlr_jax.sharding import BATCH_AXES
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.size == 1:
    return _splash_local(q_BTNK, k_BTMK, v_BTMK, segments_BT)
  B, N, M = q_BTNK.shape[0], q_BTNK.shape[2], k_BTMK.shape[2]
  batch = BATCH_AXES if B % math.prod(mesh.shape[a] for a in BATCH_AXES) == 0 else None
  t = mesh.shape.get("tensor", 1)
  heads = "tensor" if N % t == 0 and M % t == 0 else None
  qkv, seg = P(batch, None, heads, None), P(batch, None)
  return jax.shard_map(_splash_local, mesh=mesh, in_specs=(qkv, qkv, qkv, seg),
                       out_specs=qkv, check_vma=False)(q_BTNK, k_BTMK, v_BTMK, segments_BT)


def _splash_local(q_BTNK, k_BTMK, v_BTMK, segments_BT):
  from jax.experimental.pallas.ops.tpu import splash_attention as sa
  B, T, N, K = q_BTNK.shape
  G = N // k_BTMK.shape[2]
  kernel = _splash_kernel(N, T, jax.default_backend() != "tpu")
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
  """Refuse a kernel this backend cannot run, naming the field."""
  backend = jax.default_backend()
  if impl == "cudnn" and (backend != "gpu" or dtype not in ("bfloat16", "float16")):
    invalid("attention", impl, f"'xla', 'splash' or 'auto' here: cudnn needs a GPU and a "
            f"bfloat16/float16 model (backend {backend}, dtype {dtype})")

