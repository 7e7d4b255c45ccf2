"""Retrofit T2MLR into SmolLM2-135M-Instruct on Variable Assignment, rendered as chat.

The paper's retrofit recipe on the real 135M model: pretrained weights + a T2MLR
block (γ = 0, so step 0 is exactly the pretrained model), gate init gain 1e-2,
the recurrence parameters' LR ×100, AdamW with β2 0.99, and the Variable Assignment
Jacobi depths D_f/D_b 8/4 (the GSM8K retrofit uses 16/8; docs/training.md).
Prompts are the Variable Assignment prompts (docs/experiments.md#tasks) in the chat
template (non-recurrent, cf 1); the response walks the alias chain (`z=l`, `l=v`, `v=1`,
`### 1`) and is recurrent (cf 2) with the loss on it. Sized for a CPU: the block is the
middle fifth (layers 12-17 of 30), 120 steps of 8 examples, lr 2e-4.

    python -m t2mlr_jax.convert --from-gguf SmolLM2-135M-Instruct.Q4_1.gguf --to smollm2
    python experiments/retrofit_smollm2.py      # data, the three arms, greedy eval

Variants: default (T2MLR), `transformer` (the same fine-tune without recurrence),
`tiny` / `tiny_transformer` (seconds on CPU: a random 4-layer base model,
data/tiny/base, on data/tiny/va_sft.jsonl; main makes both: python -m t2mlr_jax.data.tiny).
"""

from t2mlr_jax.train.config import base_config


def get_config(variant: str = ""):
  c = base_config()
  c.name = "retrofit_smollm2_135m_va"
  c.model.init_required = True           # model shape comes from model.init_from
  c.model.update(dtype="float32", max_seq_len=2048)
  c.model.recurrence.update(type="t2mlr", l_start=12, l_end=17, gate_gain=1e-2)
  c.model.schedule_options.update(d_forward=8, d_backward=4)
  c.optimizer.update(lr=2e-4, b2=0.99, weight_decay=0.01, warmup_frac=0.05,
                     recurrence_lr_mult=100.0)
  c.data.update(task="sft", format="prompt_response", chat=True, packed=False,
                eval_limit=64, eval_batch_size=16)
  c.train.update(num_steps=120, batch_size=8, seq_len=144, eval_every=120,
                 checkpoint_every=60, log_every=10)
  if variant in ("transformer", "tiny_transformer"):
    c.model.recurrence.type = "none"
  if variant.startswith("tiny"):
    c.model.update(max_seq_len=256, init_from="data/tiny/base")
    c.data.path = "data/tiny/va_sft.jsonl"
    c.model.recurrence.update(l_start=1, l_end=1)
    c.model.schedule_options.update(d_forward=4, d_backward=2)
    c.data.update(eval_limit=8, eval_batch_size=8, chat=False)
    c.train.update(num_steps=3, batch_size=8, seq_len=128, eval_every=3, checkpoint_every=3,
                   log_every=1, async_checkpointing=False)
  elif variant not in ("", "transformer"):
    raise ValueError(f"unknown variant {variant!r}: allowed '', 'transformer', 'tiny', "
                     "'tiny_transformer'")
  return c
