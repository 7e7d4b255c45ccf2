"""GRPO on GSM8K after the paper's retrofit (configs/retrofit_smollm2_1p7b_gsm8k.py): the
retrofitted, fine-tuned SmolLM2-1.7B-Instruct post-trained by RL with a verifiable reward
(the number after `####`; docs/rl.md), the T2MLR recurrence's own learning-rate multiplier
and no-decay leaves as in the retrofit.

    python -m t2mlr_jax.main --config=configs/rl_smollm2_1p7b_gsm8k.py \\
        --config.model.init_from=workdirs/retrofit \\
        --config.data.tokenizer=/models/SmolLM2-1.7B-Instruct \\
        --config.data.path=/data/gsm8k_aug/train.jsonl \\
        --config.data.eval_path=/data/gsm8k_aug/valid.jsonl --workdir=workdirs/retrofit_rl

32 prompts a step (chat template, non-recurrent as in the fine-tune), 8 samples each at
temperature 1, 256 new tokens, KL 0.04 to the fine-tuned model, AdamW lr 1e-6 (constant
after 10 warm-up steps), 500 steps; completions scored under the training schedule's Jacobi
16/8 (the gap to the sampler's exact policy is logged as `sampler_scorer_gap`). Meant for
the retrofit's TPU v5p-64, FSDP over the 32 chips: the GRPO update on 256 rows of 767 + 256
tokens takes 19.0 GiB of 95.7 a chip, the sampler 4.6 GiB, each with the other's arrays
beside it (python -m t2mlr_jax.compile --config=configs/rl_smollm2_1p7b_gsm8k.py
--config.model.init_from=smollm2-1.7b --topology=v5p-64, from the shape alone; docs/rl.md).

Variants: default, tiny (the recipe at toy size on data/tiny's base model and Variable
Assignment records: the tests').
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from t2mlr_jax.train.rl import rl_fields  # noqa: E402

import retrofit_smollm2_1p7b_gsm8k  # noqa: E402


def get_config(variant: str = ""):
  if variant not in ("", "tiny"):
    raise ValueError(f"unknown variant {variant!r}: allowed '', 'tiny'")
  c = retrofit_smollm2_1p7b_gsm8k.get_config(variant)
  c.name = "rl_smollm2_1p7b_gsm8k" + (f"_{variant}" if variant else "")
  c.rl = rl_fields()
  c.rl.update(group_size=8, beta=0.04, max_new_tokens=256, reward="gsm8k", score_mode="jacobi")
  c.data.update(packed=False, too_long="drop")
  c.optimizer.update(lr=1e-6, weight_decay=0.0, warmup_frac=0.02, min_lr_frac=1.0)
  c.train.update(num_steps=500, batch_size=32, seq_len=768, eval_every=100,
                 checkpoint_every=50, log_every=1)
  c.model.max_seq_len = 1024
  if variant == "tiny":
    c.rl.update(group_size=2, max_new_tokens=8)
    c.model.max_seq_len = 256
    c.train.update(num_steps=2, batch_size=8, seq_len=128, eval_every=2, checkpoint_every=2)
  return c
