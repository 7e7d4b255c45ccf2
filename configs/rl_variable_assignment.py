"""GRPO on Variable Assignment (docs/rl.md): a model trained on the task by next-token loss
(configs/variable_assignment.py) then post-trained by RL, the reward 1 for the exact
answer (the digit and EOS), 0 otherwise; held-out accuracy is the task's greedy exact
match under the exact recurrence.

    python -m t2mlr_jax.main --config=configs/variable_assignment.py --workdir=workdirs/va
    python -m t2mlr_jax.main --config=configs/rl_variable_assignment.py \\
        --config.model.init_from=workdirs/va --workdir=workdirs/va_rl

8 samples of each of 16 prompts a step at temperature 1, KL 0.04 to the starting model,
one update per batch; completions scored under the exact recurrence (the sampler's own
policy). The `transformer` variant starts from a model trained with no recurrence
(configs/variable_assignment.py with --config.model.recurrence.type=none).

Variants: default, transformer, tiny (a fresh tiny model, two steps: the tests').
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from t2mlr_jax.train.rl import rl_fields  # noqa: E402

import variable_assignment  # noqa: E402


def get_config(variant: str = ""):
  if variant not in ("", "transformer", "tiny"):
    raise ValueError(f"unknown variant {variant!r}: allowed '', 'transformer', 'tiny'")
  c = variable_assignment.get_config("tiny" if variant == "tiny" else "")
  c.name = "rl_variable_assignment" + (f"_{variant}" if variant else "")
  c.rl = rl_fields()
  c.rl.update(group_size=8, beta=0.04, max_new_tokens=4, reward="exact")
  c.optimizer.update(lr=1e-5, warmup_frac=0.0, weight_decay=0.0)
  c.train.update(num_steps=200, batch_size=16, eval_every=50, checkpoint_every=50,
                 log_every=10)
  if variant == "transformer":
    c.model.recurrence.type = "none"
  if variant == "tiny":
    c.rl.update(group_size=2, max_new_tokens=3)
    c.train.update(num_steps=2, batch_size=8, eval_every=2, checkpoint_every=2, log_every=1,
                   async_checkpointing=False)
  return c
