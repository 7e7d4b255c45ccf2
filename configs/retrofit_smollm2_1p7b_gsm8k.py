"""Retrofit T2MLR into SmolLM2-1.7B-Instruct and fine-tune on GSM8K-Aug (docs/training.md,
"Recipes of the official runs"; docs/experiments.md#published-results).

The paper's retrofit setting: pretrained weights + a T2MLR block on layers 4..-5
(γ = 0, so step 0 is exactly the pretrained model), gate init gain 1e-2, the
recurrence parameters' LR ×100, Jacobi D_f/D_b 16/8, AdamW lr 5e-4, β2 0.99,
weight decay 0.01, 3% warm-up, batch 64, sequences of 4096 tokens, prompts
non-recurrent and the loss on responses only (chat template on). Published:
GSM8K 35.8 -> 39.9, MATH500 12.8 -> 18.0.

    python -m t2mlr_jax.main --config=configs/retrofit_smollm2_1p7b_gsm8k.py \\
        --config.model.init_from=/models/SmolLM2-1.7B-Instruct \\
        --config.data.path=/data/gsm8k_aug/train.jsonl \\
        --config.data.eval_path=/data/gsm8k_aug/valid.jsonl --workdir=workdirs/retrofit
    python -m t2mlr_jax.evaluate --task=gsm8k --data=/data/gsm8k/test.jsonl \\
        --model=workdirs/retrofit --tokenizer=/models/SmolLM2-1.7B-Instruct --chat

Needs an accelerator (bf16, full remat, FSDP over all chips): meant for a TPU v5p-64,
20.5 of 95.7 GiB a chip (`python -m t2mlr_jax.compile
--config=configs/retrofit_smollm2_1p7b_gsm8k.py --topology=v5p-64
--config.model.init_from=smollm2-1.7b` checks it from the shape alone). On GPUs
(docs/gpu.md, `--topology=h100-8`): one 8×H100 node as it is, 56.7 of the 58.7 GiB a JAX
process gets on a card (2 GiB of headroom). Variant `tiny`: the same recipe at toy size for
tests, on a random 4-layer base model (data/tiny/base) and Variable Assignment records
(data/tiny/va_sft.jsonl); main makes both: python -m t2mlr_jax.data.tiny.
"""

from t2mlr_jax.train.config import base_config


def get_config(variant: str = ""):
  c = base_config()
  c.name = "retrofit_smollm2_1p7b_gsm8k"
  c.model.init_required = True           # model shape comes from model.init_from
  c.model.update(dtype="bfloat16", remat="full", max_seq_len=4096, attention="auto")
  c.model.recurrence.update(type="t2mlr", l_start=4, l_end=-5, gate_gain=1e-2)
  c.model.schedule_options.update(d_forward=16, d_backward=8)
  c.optimizer.update(lr=5e-4, b2=0.99, weight_decay=0.01, warmup_frac=0.03,
                     recurrence_lr_mult=100.0)
  c.data.update(task="sft", format="auto", chat=True, packed=True, too_long="drop",
                eval_limit=256, eval_batch_size=16)
  c.train.update(num_steps=6000, batch_size=64, seq_len=4096, eval_every=1000,
                 checkpoint_every=500, log_every=20)
  c.mesh.update(data=1, fsdp=-1, tensor=1)
  if variant == "tiny":
    c.model.update(dtype="float32", remat="none", max_seq_len=256, attention="xla",
                   init_from="data/tiny/base")
    c.data.path = "data/tiny/va_sft.jsonl"
    c.model.recurrence.update(l_start=1, l_end=-2)
    c.model.schedule_options.update(d_forward=4, d_backward=2)
    c.data.update(eval_limit=8, eval_batch_size=8, chat=False)
    c.train.update(num_steps=4, batch_size=8, seq_len=128, eval_every=4, checkpoint_every=4,
                   log_every=1, async_checkpointing=False)
    c.mesh.update(data=-1, fsdp=1)
  elif variant != "":
    raise ValueError(f"unknown variant {variant!r}: allowed '', 'tiny'")
  return c
