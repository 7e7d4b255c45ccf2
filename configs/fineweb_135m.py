"""T2MLR pretraining from scratch at SmolLM2-135M's shape on FineWeb-Edu (docs/training.md,
"Recipes of the official runs"), for accelerators.

The data is read as prepared ArrayRecord shards; make them once from local FineWeb-Edu
parquet files with SmolLM2's tokenizer (a directory holding its tokenizer.json):

    python -m t2mlr_jax.data.prepare --train='fineweb-edu/train/*.parquet' \\
        --validation='fineweb-edu/val/*.parquet' --tokenizer=SMOLLM2_TOKENIZER_DIR \\
        --block_size=2048 --out=data/fineweb_edu_smollm2
    python -m t2mlr_jax.main --config=configs/fineweb_135m.py --workdir=DIR

Meant for a TPU v5e-256 (one 2048-token sequence a chip; check before paying:
`python -m t2mlr_jax.compile --config=configs/fineweb_135m.py --topology=v5e-256`):
4.5 of 15.75 GiB a chip; the all_layers and 360m variants 11.6 and 6.9 GiB (docs/tpu.md).
The same global batch on 16 chips needs `train.grad_accum_steps` 8 on a v5e-16 (the
transformer variant 4), 4 on a v4-32 or a v6e-16. On GPUs (docs/gpu.md; check with
`--topology=h100-8`): one node of 8 H100s or 8 A100s (80 GB) with `train.grad_accum_steps=2`,
51.4 / 51.8 GiB of the 58.7 / 59.0 a JAX process gets on a card (99 / 100 without it).

Variants (`--config=configs/fineweb_135m.py:VARIANT`):
  (default)    SmolLM2-135M (30 layers, d_model 576, GQA 9/3, vocab 49152, tied) with T2MLR
               on layers 13-18 (the paper's middle block), Jacobi D_f/D_b 16/4; AdamW lr
               6e-4, β2 0.98, wd 0.01, 5% warm-up, cosine to 1%, batch 256 × 2048 tokens,
               5000 steps (2.6B tokens, ~20 per parameter), bf16, FSDP
  transformer  no recurrence, d_ff 1568 instead of 1536 (+2.1%): the same parameter count
               as the default within 0.05% (T2MLR adds W_rec and two gates, 5·576²)
  all_layers   T2MLR over every layer (0-29)
  360m         SmolLM2-360M's shape (32 layers, d_model 960), T2MLR on layers 14-19
  tiny         seconds on CPU, for tests: 2 layers, d_model 32, byte-level blocks of 32 of
               a synthetic corpus, data/tiny/lm_byte32 (main makes it: python -m
               t2mlr_jax.data.tiny)
"""

from t2mlr_jax.config import PRESETS
from t2mlr_jax.train.config import base_config, recurrence_config

VARIANTS = ("", "transformer", "all_layers", "360m", "tiny")


def get_config(variant: str = ""):
  if variant not in VARIANTS:
    raise ValueError(f"unknown variant {variant!r}: allowed one of {VARIANTS}")
  c = base_config()
  c.name = "fineweb_135m" + (f"_{variant}" if variant else "")
  shape = dict(PRESETS["smollm2-360m" if variant == "360m" else "smollm2-135m"])
  c.model.update(arch="transformer", dtype="bfloat16", attention="auto", **shape)
  c.model.max_seq_len = 2048
  span = (14, 19) if variant == "360m" else (0, shape["n_layers"] - 1) if (
      variant == "all_layers") else (13, 18)
  c.model.recurrence = recurrence_config("t2mlr", l_start=span[0], l_end=span[1])
  c.model.schedule_options.update(d_forward=16, d_backward=4)
  if variant == "transformer":
    c.model.recurrence.type = "none"
    c.model.d_ff = 1568
  c.optimizer.update(name="adamw", lr=6e-4, b1=0.9, b2=0.98, weight_decay=0.01,
                     warmup_frac=0.05, min_lr_frac=0.01, grad_clip=1.0)
  c.data.update(task="lm", path="data/fineweb_edu_smollm2", mask_documents=True,
                shuffle=True, eval_blocks=512, eval_batch_size=16, num_threads=8,
                prefetch=8)
  c.train.update(batch_size=256, seq_len=2048, num_steps=5000, eval_every=500,
                 checkpoint_every=500, log_every=20)
  c.mesh.update(data=1, fsdp=-1, tensor=1)
  if variant == "tiny":
    c.model.update(vocab_size=259, d_model=32, n_layers=2, n_heads=2, n_kv_heads=2, d_ff=64,
                   max_seq_len=64, dtype="float32")
    c.model.recurrence.update(l_start=1, l_end=1)
    c.model.schedule_options.update(d_forward=4, d_backward=2)
    c.data.update(path="data/tiny/lm_byte32", eval_blocks=8, eval_batch_size=4, num_threads=1,
                  prefetch=2)
    c.train.update(batch_size=8, seq_len=32, num_steps=4, eval_every=4, checkpoint_every=2,
                   log_every=1, async_checkpointing=False)
    c.mesh.update(data=-1, fsdp=1)
  return c
