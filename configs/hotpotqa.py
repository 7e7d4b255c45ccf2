"""HotpotQA, distractor setting (docs/experiments.md#tasks): answer a multi-hop question from
ten paragraphs, two of which hold the facts; scored by the official EM and F1.

The release's recipe (scripts/hotpotqa/train_hotpotqa.sh, which as shipped cannot train:
DO_TRAIN=False, no data paths, and preprocessors its code does not register): SmolLM2-135M,
L 1..-2, Jacobi 16/8, AdamW lr 1e-4, β2 0.95, no weight decay, 5% warm-up, cosine to 2%,
32 examples per step (4 x 8 accumulated), at most 5000 steps, every token recurrent,
gate init 0.5 with gain 1e-2, sequences up to 8192 tokens. Our prompt is the paragraphs
("Title: ...\\n<sentences>", a blank line apart), then "Question: ...\\nAnswer:"; the response
is the answer (data/hotpotqa.py):

    python -m t2mlr_jax.data.hotpotqa --input=hotpot_train_v1.1.json \\
        --out=data/hotpotqa/train.jsonl
    python -m t2mlr_jax.data.hotpotqa --input=hotpot_dev_distractor_v1.json \\
        --out=data/hotpotqa/dev.jsonl
    python -m t2mlr_jax.main --config=configs/hotpotqa.py:release_smollm2 \\
        --config.model.init_from=DIR      # SmolLM2-135M: HF directory or converted GGUF
    python -m t2mlr_jax.evaluate --task=hotpotqa --data=hotpot_dev_distractor_v1.json \\
        --model=workdirs/hotpotqa_release_smollm2 --max_new_tokens=32 --prompt_control_flow=2

The files come from hotpotqa.github.io (none is downloaded at run time). Sized for one
H100 (python -m t2mlr_jax.compile --config=configs/hotpotqa.py:release_smollm2
--config.model.init_from=smollm2-135m --topology=h100-1).

Variants: release_smollm2 (the default), tiny (the synthetic records of data/tiny on the
tiny random base model: python -m t2mlr_jax.data.tiny).
"""

from t2mlr_jax.train.config import base_config


def get_config(variant: str = ""):
  c = base_config()
  c.name = "hotpotqa_release_smollm2" if variant in ("", "release_smollm2") else "hotpotqa_tiny"
  c.model.init_required = True          # the shape comes from model.init_from
  c.model.update(dtype="bfloat16", remat="full", max_seq_len=8192, attention="auto")
  c.model.recurrence.update(type="t2mlr", l_start=1, l_end=-2, gate_gain=1e-2, gate_init=0.5)
  c.model.schedule_options.update(d_forward=16, d_backward=8)
  c.optimizer.update(lr=1e-4, b1=0.9, b2=0.95, weight_decay=0.0, warmup_frac=0.05,
                     min_lr_frac=0.02)
  c.data.update(task="sft", format="prompt_response", path="data/hotpotqa/train.jsonl",
                eval_path="data/hotpotqa/dev.jsonl", recurrent_prompt=True, packed=True,
                too_long="drop", eval_limit=500, eval_batch_size=16)
  c.train.update(num_steps=5000, batch_size=32, grad_accum_steps=8, seq_len=8192,
                 eval_every=1000, checkpoint_every=500, log_every=20)
  c.mesh.update(data=1, fsdp=-1, tensor=1)
  if variant == "tiny":
    c.model.update(dtype="float32", remat="none", max_seq_len=512, attention="xla",
                   init_from="data/tiny/base")
    c.data.update(path="data/tiny/hotpotqa_sft.jsonl", eval_path=None, eval_limit=8,
                  eval_batch_size=8)
    c.model.schedule_options.update(d_forward=4, d_backward=2)
    c.train.update(num_steps=3, batch_size=8, grad_accum_steps=1, seq_len=256, eval_every=3,
                   checkpoint_every=3, log_every=1, async_checkpointing=False)
    c.mesh.update(data=-1, fsdp=1)
  elif variant not in ("", "release_smollm2"):
    raise ValueError(f"unknown variant {variant!r}: allowed 'release_smollm2' or 'tiny'")
  return c
