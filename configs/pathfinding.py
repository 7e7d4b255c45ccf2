"""Pathfinding (docs/experiments.md#tasks): the unique shortest path through a DAG given as
shuffled edges, with parallel lanes and dead ends (data/pathfinding.py, the release's
generator and knobs).

From scratch on CPU (word-level vocabulary, one token per node name): backbones of 4-8
edges, 3 lanes, dead ends as the release draws them (a graph of more than 224 tokens, the
longest 5%, redrawn); the whole sequence recurrent as the release trains it; evaluated by
exact match of the greedy path under the exact recurrence, per backbone length, on held-out
graphs of the trained lengths and of longer ones (10, 12). 1000 steps of 32 graphs on 2
cores: the transformer 43 minutes (on a shared machine), T2MLR 5.1 s a step on an idle one
(about 85 minutes; all_layers sweeps every layer, more again). At this budget the
transformer solves no graph (docs/experiments.md#multi-hop-reasoning-at-cpu-scale). Arms,
parameter-matched (1.71-1.72M; the transformer's and LRT's MLPs absorb the difference):

    python -m t2mlr_jax.main --config=configs/pathfinding.py               # T2MLR, layers 2-3
    python -m t2mlr_jax.main --config=configs/pathfinding.py:transformer    # no recurrence
    python -m t2mlr_jax.main --config=configs/pathfinding.py:all_layers    # T2MLR, 0..-1
    python -m t2mlr_jax.main --config=configs/pathfinding.py:lrt           # LRT, interleaved

The release's recipe (scripts/pathfinding/train_pathfinding.sh), fine-tuning a pretrained
model on its text (syllable names, 20000 training graphs at its default knobs, 2 epochs,
AdamW lr 5e-4, β2 0.99, weight decay 0.01, 5% warm-up, cosine to 1%, 64 examples per
step, Jacobi 16/4, every token recurrent, gate init 0.5 with gain 1e-2):

    python -m t2mlr_jax.data.pathfinding --out=data/pathfinding
    python -m t2mlr_jax.main --config=configs/pathfinding.py:release_smollm2 \\
        --config.model.init_from=DIR    # SmolLM2-135M (HF directory or converted GGUF), L 2..-3
    python -m t2mlr_jax.main --config=configs/pathfinding.py:release_qwen \\
        --config.model.init_from=DIR    # Qwen2.5-0.5B, L 8..-9

Sized for one H100 (python -m t2mlr_jax.compile --config=configs/pathfinding.py:release_qwen
--config.model.init_from=qwen2.5-0.5b --topology=h100-1: 54.5 of 58.7 GiB).

The `short` setting, the smallest where the transformer begins to solve graphs on 2 cores:
backbones of 3-4 edges, one lane (graphs of at most 64 tokens), 2000 steps, evaluated on 3-6
edges; each arm prefixed (`short`, `short_transformer`, `short_all_layers`, `short_lrt`):

    python -m t2mlr_jax.main --config=configs/pathfinding.py:short_transformer

Variants: default, transformer, all_layers, lrt, each with a `short_` setting (`short` for
T2MLR), release_smollm2, release_qwen, tiny.
"""

from t2mlr_jax.train.config import base_config, recurrence_config, schedule_options_config

ARMS = ("", "transformer", "all_layers", "lrt")
RELEASE = {"release_smollm2": 2, "release_qwen": 8}     # the release's L_START per model


def _from_scratch(c, arm: str) -> None:
  """The CPU-sized graphs and model; `arm` picks the recurrence."""
  c.data.update(task="pathfinding", pf_path_min=4, pf_path_max=8, pf_lanes=3,
                pf_extra_min=1, pf_extra_max=2, pf_max_tokens=224,
                pf_eval_lengths="4,6,8,10,12", eval_examples_per_length=64,
                eval_batch_size=64)
  c.model.update(vocab_size=256, d_model=128, n_layers=6, n_heads=4, d_ff=512,
                 max_seq_len=384)
  c.model.recurrence.update(type="t2mlr", l_start=2, l_end=3)
  c.model.schedule_options.update(d_forward=8, d_backward=4)
  c.optimizer.update(lr=1e-3, b2=0.99, weight_decay=0.01, warmup_frac=0.05)
  c.train.update(num_steps=1000, batch_size=32, seq_len=224, eval_every=250,
                 checkpoint_every=250, log_every=50)
  set_arm(c, arm, transformer_d_ff=544, lrt_d_ff=376)


def _short(c) -> None:
  """Backbones of 3-4 edges and one lane: the transformer solves some 3-edge graphs by step
  1000 (docs/experiments.md#multi-hop-reasoning-at-cpu-scale)."""
  c.data.update(pf_path_min=3, pf_path_max=4, pf_lanes=1, pf_max_tokens=64,
                pf_eval_lengths="3,4,5,6")
  c.model.max_seq_len = 160
  c.train.update(num_steps=2000, seq_len=64)


# a setting's arms are its name + "_" + the arm (its T2MLR arm: the name alone)
SETTINGS = {"": None, "short": _short}


def split_variant(variant: str):
  """(setting, arm) of a from-scratch variant (`short_lrt` -> ('short', 'lrt')), or None."""
  for setting in SETTINGS:
    for arm in ARMS:
      if variant == "_".join(v for v in (setting, arm) if v):
        return setting, arm
  return None


def set_arm(c, arm: str, *, transformer_d_ff: int, lrt_d_ff: int) -> None:
  """One arm of a from-scratch comparison on a T2MLR config (prosqa.py's too): '' keeps it,
  `transformer` drops the recurrence, `all_layers` spans every layer, `lrt` is LRT with
  interleaved passes (S = 2); the d_ff given match T2MLR's parameter count."""
  if arm == "transformer":
    c.model.recurrence.type = "none"
    c.model.d_ff = transformer_d_ff    # the T2MLR block's parameters, spent on the MLPs
  elif arm == "all_layers":
    c.model.recurrence.update(l_start=0, l_end=-1)
  elif arm == "lrt":
    c.model.recurrence = recurrence_config("lrt", source_layer=-1, gate_channels=32)
    c.model.schedule_options = schedule_options_config(passes=2)
    c.model.d_ff = lrt_d_ff            # LRT's feedback paths' parameters, from the MLPs


def _release(c, l_start: int) -> None:
  """The release's recipe on a pretrained model (model.init_from) and its text data."""
  c.model.init_required = True          # the shape comes from model.init_from
  c.model.update(dtype="bfloat16", remat="full", max_seq_len=4096, attention="auto")
  c.model.recurrence.update(type="t2mlr", l_start=l_start, l_end=-l_start - 1,
                            gate_gain=1e-2, gate_init=0.5)
  c.model.schedule_options.update(d_forward=16, d_backward=4)
  c.optimizer.update(lr=5e-4, b2=0.99, weight_decay=0.01, warmup_frac=0.05, min_lr_frac=0.01)
  c.data.update(task="sft", format="prompt_response", path="data/pathfinding/"
                "pathfinding_train.jsonl", eval_path="data/pathfinding/pathfinding_test.jsonl",
                recurrent_prompt=True, packed=True, too_long="error", eval_limit=1000,
                eval_batch_size=32)
  # 2 epochs of 20000 examples at 64 per step
  c.train.update(num_steps=625, batch_size=64, grad_accum_steps=8, seq_len=4096,
                 eval_every=625, checkpoint_every=200, log_every=10)
  c.mesh.update(data=1, fsdp=-1, tensor=1)


def get_config(variant: str = ""):
  c = base_config()
  c.name = "pathfinding" + (f"_{variant}" if variant else "")
  if parsed := split_variant(variant):
    setting, arm = parsed
    _from_scratch(c, arm)
    if SETTINGS[setting]:
      SETTINGS[setting](c)
  elif variant in RELEASE:
    _release(c, RELEASE[variant])
  elif variant == "tiny":
    _from_scratch(c, "")
    c.data.update(pf_path_min=3, pf_path_max=4, pf_lanes=1, pf_extra_max=1,
                  pf_max_tokens=96, pf_eval_lengths="", eval_examples_per_length=4,
                  eval_batch_size=8)
    c.model.update(d_model=32, n_layers=3, n_heads=2, d_ff=64, max_seq_len=128,
                   vocab_size=64)
    c.model.recurrence.update(l_start=1, l_end=1)
    c.model.schedule_options.update(d_forward=2, d_backward=1)
    c.train.update(num_steps=3, batch_size=8, seq_len=96, eval_every=3, checkpoint_every=3,
                   log_every=1, async_checkpointing=False)
  else:
    raise ValueError(f"unknown variant {variant!r}: allowed {list(ARMS)}, the same with "
                     f"'short_' before ('short' alone for T2MLR), {list(RELEASE)} or 'tiny'")
  return c
