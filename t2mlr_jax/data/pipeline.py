"""Grain input pipelines: a random-access source -> padded, batched, prefetched batches.

Each process reads its own slice of the global index space (per-process
sharding), optionally shuffled with a seed, and yields numpy dicts of
[batch_per_process, seq_len] int32 arrays. The iterator is a Grain
`DatasetIterator`, whose state is checkpointed with the model.
"""

from __future__ import annotations

from typing import Any, Mapping

import grain
import numpy as np

from t2mlr_jax.losses import IGNORE as IGNORE_ID

# Fields every batch carries and their padding values (right padding).
PAD_VALUES = {"input_ids": 0, "target_ids": IGNORE_ID, "control_flow": 0}
OPTIONAL_PAD_VALUES = {"positions": 0, "segment_ids": -1}


def pad_example(example: Mapping[str, Any], seq_len: int,
                pad_id: int = 0) -> dict[str, np.ndarray]:
  """Right-pad one example's arrays to seq_len; an example longer than that is an error."""
  fills = {**PAD_VALUES, "input_ids": pad_id, **OPTIONAL_PAD_VALUES}
  length = len(example["input_ids"])
  if length > seq_len:
    raise ValueError(f"an example has {length} tokens but train.seq_len={seq_len}: allowed "
                     f"seq_len >= the longest example (examples are never truncated)")
  out = {}
  for key, fill in fills.items():
    if key not in example:
      continue
    arr = np.asarray(example[key], np.int32)
    if arr.shape != (length,):
      raise ValueError(f"example field {key} has shape {arr.shape}, expected ({length},)")
    out[key] = np.concatenate([arr, np.full(seq_len - length, fill, np.int32)])
  return out


def _check_split(global_batch: int, process_count: int) -> int:
  if global_batch % process_count:
    raise ValueError(f"train.batch_size={global_batch} is not divisible by the "
                     f"{process_count} processes: allowed multiples of {process_count}")
  return global_batch // process_count


def make_iterator(source, *, global_batch: int, seq_len: int, pad_id: int = 0,
                  shuffle: bool = False, seed: int = 0, num_threads: int = 1,
                  prefetch: int = 4, process_index: int = 0, process_count: int = 1,
                  num_examples: int | None = None) -> grain.DatasetIterator:
  """Batches of this process's share of `source` (a random-access source of example dicts).

  num_examples larger than the source repeats it in epochs, each in a new shuffled order
  when shuffle is set (a source already that long is read as is). Multi-host callers
  pass jax.process_index()/process_count(); this module stays JAX-free.
  """
  per_process = _check_split(global_batch, process_count)
  ds = grain.MapDataset.source(source)
  if len(ds) == 0:
    raise ValueError("the data source is empty")
  if shuffle:
    ds = ds.shuffle(seed=seed)
  if num_examples is not None and num_examples > len(ds):
    ds = ds.repeat(-(-num_examples // len(ds)))[:num_examples]
  ds = ds[process_index::process_count]
  ds = ds.map(lambda ex: pad_example(ex, seq_len, pad_id))
  ds = ds.batch(per_process, drop_remainder=True)
  options = grain.ReadOptions(num_threads=num_threads, prefetch_buffer_size=prefetch)
  return iter(ds.to_iter_dataset(options))


def stack_batches(examples, seq_len: int, batch_size: int, pad_id: int = 0):
  """Fixed eval batches: pad examples to seq_len and group them; the last batch is
  filled with fully-padded rows (target -100) so every batch has one shape."""
  padded = [pad_example(ex, seq_len, pad_id) for ex in examples]
  batches = []
  for i in range(0, len(padded), batch_size):
    chunk = padded[i:i + batch_size]
    while len(chunk) < batch_size:
      chunk.append({k: np.full(seq_len, PAD_VALUES.get(k, 0), np.int32) for k in chunk[0]})
    batches.append({k: np.stack([c[k] for c in chunk]) for k in chunk[0]})
  return batches
