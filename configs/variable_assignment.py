"""T2MLR on Variable Assignment (docs/experiments.md#tasks), byte-level, trained from
scratch on CPU.

The prompt (assignments, query) is non-recurrent (cf 1), the answer digit and EOS
recurrent (cf 2); the loss is on the answer only; accuracy is exact match of the
greedy answer under the exact recurrence. The paper's setting fine-tunes a
pretrained SmolLM2-135M (l_start 1, l_end -2, D_f/D_b 8/4, lr 5e-4, β2 0.99,
batch 128), which needs the Hugging Face import (see README).

Variants: default (CPU), tiny (tests).
"""

from t2mlr_jax.data.byte_tokenizer import VOCAB_SIZE
from t2mlr_jax.train.config import base_config


def get_config(variant: str = ""):
  c = base_config()
  c.name = "variable_assignment"
  c.data.task = "variable_assignment"
  c.data.update(va_depth=2, eval_examples_per_length=256, eval_batch_size=64)
  r, o = c.model.recurrence, c.model.schedule_options
  r.update(type="t2mlr", l_start=1, l_end=-2)
  o.update(d_forward=8, d_backward=4)
  c.model.update(vocab_size=VOCAB_SIZE, d_model=64, n_layers=4, n_heads=4, d_ff=256,
                 max_seq_len=256)
  c.optimizer.update(lr=1e-3, b2=0.99, weight_decay=0.01, warmup_frac=0.05)
  c.train.update(num_steps=3000, batch_size=32, seq_len=160, eval_every=500,
                 checkpoint_every=500, log_every=50)
  if variant == "tiny":
    c.model.update(d_model=32, n_layers=3, n_heads=2, d_ff=64)
    r.update(l_start=1, l_end=1)
    o.update(d_forward=2, d_backward=1)
    c.data.update(eval_examples_per_length=8, eval_batch_size=8)
    c.train.update(num_steps=3, batch_size=8, eval_every=3, checkpoint_every=3, log_every=1,
                   async_checkpointing=False)
  elif variant != "":
    raise ValueError(f"unknown variant {variant!r}: allowed '', 'tiny'")
  return c
