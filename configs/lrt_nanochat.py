"""LRT on nanochat's backbone (the official LRT release's model and optimizer).

Variants (`--config=configs/lrt_nanochat.py:VARIANT`):
  d20   nanochat depth 20 (d_model 1280, 10 heads of 128, vocab 32768, T 2048) with
        LRT-layerwise, interleaved S = 2; Muon for matrices + AdamW for embeddings and
        scalars at nanochat's learning rates; 524,288 tokens per step and steps for
        10 tokens per scaling parameter (the release's count: the layers' matrices, the
        LM head and LRT's W_k / W_v, not the embedding tables), as the release's
        comparison. Accelerators, bf16.
  d12   the same at depth 12 (d_model 768).
  tiny  seconds on CPU, for tests: 2 layers, d_model 32, on S5-Retrieval data.

Presets, after a comma (`--config=configs/lrt_nanochat.py:d20,official`): the official LRT
release's run (commit a133a67) where our defaults differ from it.
  official               interleaved S = 2 as the release trains it: gates reading the
                         full width (its ve_gate_channels 0; ours 32), the rotary table
                         in bfloat16, documents as one stream (block positions: the memory
                         resets at t = 0 only, attention across documents, every target
                         predicted; ours restart at each document), gradient accumulation
                         averaging the microbatches' means (ours weights by tokens).
  official_multi_refine  the same under its --multi-refine: K = 2 passes after pass 0 (its
                         default; its README's result is K = 3:
                         --config.model.schedule_options.refine_passes=3), equal weights,
                         no detach.
With d20/d12 a preset reads a prepared dataset (`lm` task: --config.data.path=DIR, from
python -m t2mlr_jax.data.prepare) as the release reads FineWeb: one token stream.

Slices (docs/tpu.md; check one with `python -m t2mlr_jax.compile
--config=configs/lrt_nanochat.py:d20 --topology=v5p-128`): d20 is meant for a TPU v5p-128
(86.2 of 95.7 GiB a chip; on a v5p-64 set `train.grad_accum_steps=2`, on a v6e-16 16),
d12 for a v5e-256 (14.2 of 15.75 GiB a chip; on a v5e-16 `grad_accum_steps=16`). On GPUs
(docs/gpu.md): d20 fits nanochat's 8×H100 node at its batch with `grad_accum_steps=8`
(54.4 of 58.7 GiB a card; 2 and 4 microbatches need 186 and 95 GiB), `--topology=h100-8`.

The d12/d20 variants read any tokenized text through the `sft` task
(--config.data.path=FILE.jsonl --config.data.tokenizer=DIR; vocabulary 32768 unless
overridden to the tokenizer's).
"""

import math

from t2mlr_jax.config import PRESETS
from t2mlr_jax.train.config import base_config, model_config, recurrence_config

VARIANTS = ("d20", "d12", "tiny")
RELEASE_PRESETS = ("official", "official_multi_refine")


def scaling_params(cfg) -> int:
  """Parameters without the token embedding and the value-embedding tables."""
  V, kv = cfg.padded_vocab, cfg.n_kv_heads * cfg.head_dim
  tables = V * cfg.d_model + len(cfg.value_embed_layers) * V * kv
  if cfg.recurrence is not None and cfg.recurrence.value_embeds:
    tables += cfg.n_layers * V * kv
  return cfg.num_params() - tables


def official(c, preset: str):
  """The release's settings where ours differ (docs/lrt_training.md lists each and why)."""
  c.model.recurrence.gate_channels = 0          # the full width
  c.model.ve_gate_channels = 0
  c.model.rope_table_dtype = "bfloat16"
  c.model.schedule_options.update(passes=2, kv_refresh=False, refine_passes=2,
                                  refine_weights=(), refine_detach=False)
  c.train.mode = "multi_refine" if preset == "official_multi_refine" else "interleaved"
  c.train.grad_accum_average = "microbatches"
  if c.data.task != "s5_retrieval":             # the tiny variant keeps its S5 data
    c.data.update(task="lm", documents="stream", mask_documents=False)
  c.name += f"_{preset}"
  return c


def get_config(variant: str = "d20"):
  variant, _, preset = variant.partition(",")
  if variant not in VARIANTS:
    raise ValueError(f"unknown variant {variant!r}: allowed one of {VARIANTS}")
  if preset and preset not in RELEASE_PRESETS:
    raise ValueError(f"unknown preset {preset!r}: allowed one of {RELEASE_PRESETS} (after a comma: "
                     f"{variant},official)")
  c = _config(variant)
  return official(c, preset) if preset else c


def _config(variant: str):
  c = base_config()
  c.name = f"lrt_nanochat_{variant}"
  shape = dict(PRESETS["nanochat-d12" if variant == "d12" else "nanochat-d20"])
  shape["value_embeds"] = None      # LRT's own value embeddings replace nanochat's (release)
  for key, value in shape.items():
    c.model[key] = value
  c.model.recurrence = recurrence_config("lrt", source_layer=-1)
  c.model.schedule_options.passes = 2
  c.optimizer.update(name="muon", matrix_lr=0.02, embedding_lr=0.2, unembedding_lr=0.004,
                     scalar_lr=0.5, adam_b1=0.8, adam_b2=0.95, weight_decay=0.0,
                     warmup_frac=0.0, min_lr_frac=0.0, grad_clip=0.0)
  c.train.mode = "auto"             # interleaved
  if variant == "tiny":
    c.model.update(n_layers=2, d_model=32, n_heads=2, n_kv_heads=2, d_ff=128,
                   vocab_size=188, max_seq_len=64)
    c.model.recurrence.gate_channels = 16
    c.data.update(task="s5_retrieval", group="S3", min_actions=1, max_actions=4,
                  eval_lengths="2,6", eval_examples_per_length=4, eval_batch_size=8)
    c.train.update(num_steps=6, batch_size=8, seq_len=48, eval_every=6, checkpoint_every=3,
                   log_every=1, async_checkpointing=False)
    return c
  c.model.update(dtype="bfloat16", attention="auto")
  c.data.update(task="sft", format="auto", packed=True, too_long="drop")
  c.mesh.update(data=1, fsdp=-1, tensor=1)
  batch, seq = 256, 2048
  c.train.update(batch_size=batch, seq_len=seq,
                 num_steps=math.ceil(10 * scaling_params(model_config(c)) / (batch * seq)),
                 eval_every=1000, checkpoint_every=1000, log_every=20)
  return c
