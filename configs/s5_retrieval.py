"""T2MLR on S5-Retrieval (docs/experiments.md#tasks; the paper's recipe: docs/training.md):
the library's embedded default job.

Variants (`--config=configs/s5_retrieval.py:VARIANT`):
  (default)  a CPU-sized run (14 min on 2 cores) on the group S3 that learns the state
             and the lookup, see docs/experiments.md
  word       the plain word problem on S3 (the CPU length sweep)
  v2, v4     the default job with 2- or 4-character values (the official v is 4): a
             dictionary the fixed state of an LSTM must hold grows with v
  v2_staged  v2 with one-character values for the first 3000 steps (by then the default
             job has learned the state and the lookup), then two
  s4, s4_d16 the default job on the group S4 with a dictionary of all 24 elements, or of
             16 (the actions used, topped up at random; 16: the longest evaluated N),
             one-character values: against S3's at most 6 pairs the dictionary an
             LSTM's state must hold grows by its keys
  tiny       seconds on CPU, for tests
  paper      the official setting (S5, 6 layers, H 384, NoPE, 400k steps,
             train 1-32 / test 1-48 actions) for accelerators
"""

from t2mlr_jax.train.config import base_config


def get_config(variant: str = ""):
  c = base_config()
  c.name = "s5_retrieval"
  c.data.task = "s5_retrieval"
  r, o = c.model.recurrence, c.model.schedule_options
  r.type, r.l_start, r.l_end = "t2mlr", 1, -2
  o.d_forward, o.d_backward = 16, 4
  c.optimizer.update(lr=5e-4, b2=0.95, weight_decay=0.01, warmup_frac=0.05)
  if variant == "paper":
    c.model.update(vocab_size=188, d_model=384, n_layers=6, n_heads=6, d_ff=1536,
                   max_seq_len=1024, tie_embeddings=False)
    c.model.rope_theta = None                 # NoPE, as the official S5 run
    c.data.update(group="S5", min_actions=1, max_actions=32, eval_min_actions=1,
                  eval_max_actions=48, eval_examples_per_length=100)
    c.train.update(num_steps=400_000, batch_size=16, seq_len=328, eval_every=10_000,
                   checkpoint_every=5_000, log_every=100)
  elif variant == "tiny":
    c.model.update(vocab_size=188, d_model=32, n_layers=3, n_heads=2, d_ff=64,
                   max_seq_len=128, tie_embeddings=False)
    c.model.rope_theta = None
    r.update(l_start=1, l_end=1)
    o.update(d_forward=4, d_backward=2)
    c.data.update(group="S3", min_actions=1, max_actions=4, eval_lengths="2,6",
                  eval_examples_per_length=4, eval_batch_size=8)
    c.train.update(num_steps=6, batch_size=8, seq_len=48, eval_every=6, checkpoint_every=3,
                   log_every=1, async_checkpointing=False)
  elif variant == "word":
    # CPU preset of the length sweep: the plain word problem on S3, train 1-16 actions.
    c.data.task = "s5_word_problem"
    c.model.update(vocab_size=188, d_model=64, n_layers=4, n_heads=4, d_ff=256,
                   max_seq_len=512, tie_embeddings=False)
    c.model.rope_theta = None
    # D_f = the longest training sequence: Jacobi then trains on exact caches. With
    # D_f = 8 the same model reached only 0.22 / 0.02 sequence accuracy at 24 / 32.
    r.update(l_start=1, l_end=2)
    o.update(d_forward=16, d_backward=4)
    c.optimizer.update(lr=3e-3, b2=0.98)
    c.data.update(group="S3", min_actions=1, max_actions=16, curriculum_start=2,
                  curriculum_steps=500, eval_lengths="4,8,16,24,32,40,48",
                  eval_examples_per_length=128, eval_batch_size=128)
    c.train.update(num_steps=2000, batch_size=64, seq_len=16, eval_every=500,
                   checkpoint_every=500, log_every=50)
  elif variant == "":
    # CPU default (14 min on 2 cores): the S5-Retrieval format on the group S3 with
    # one-character values (v=1) and 1-8 actions (curriculum from 2), evaluated up
    # to 16. D_f covers the recurrent span (2·8 + 1 tokens): exact caches in training.
    # For the first 2000 steps each example draws its actions from the subgroup Z2 or
    # from S3, half and half: on the Z2 half dictionaries hold at most 2 pairs, where the
    # lookup circuit forms and then carries over to S3's 6 keys, while the S3 half
    # learns the state from step 0. Without the Z2 examples the lookup stayed at chance
    # for 5000 steps; with a Z2-only stage the S3 state was learned only in the last
    # 1000-3000 steps, and whether by step 6000 depended on the CPU's rounding
    # (docs/experiments.md).
    c.model.update(vocab_size=188, d_model=64, n_layers=4, n_heads=4, d_ff=256,
                   max_seq_len=512, tie_embeddings=False)
    c.model.rope_theta = None
    r.update(l_start=1, l_end=2)
    o.update(d_forward=17, d_backward=4)
    c.optimizer.update(lr=3e-3, b2=0.98)
    c.data.update(group="S3", group_curriculum="Z2+S3:2000", value_len=1, min_actions=1,
                  max_actions=8, curriculum_start=2, curriculum_steps=1000,
                  eval_lengths="4,8,12,16", eval_examples_per_length=128, eval_batch_size=128)
    c.train.update(num_steps=6000, batch_size=32, seq_len=32, eval_every=1000,
                   checkpoint_every=500, log_every=50)
  elif variant in VALUE_VARIANTS:
    # The default job with v-character values: sequences of (N_dict + N)(1 + v) + 1 tokens
    # (N_dict <= 6 on S3), a recurrent span of N(1 + v) + 1 = 25 / 41 at 8 actions, which
    # D_f covers as the default's 17 does (Jacobi trains on exact caches).
    v = VALUE_VARIANTS[variant]
    c = get_config("")
    c.data.value_len = v
    c.model.schedule_options.d_forward = 8 * (1 + v) + 1
    c.train.seq_len = _fitting_seq_len(c)
  elif variant == "v2_staged":
    # v2 with its values staged as the Z2 stage stages the dictionary: one character up to
    # step 3000 (where the default job's state and lookup have formed), then two. At v2
    # from step 0 T2MLR's state reached only 0.60 by step 6000 (docs/experiments.md).
    c = get_config("v2")
    c.data.value_curriculum = "1:3000"
  elif variant in GROUP_VARIANTS:
    # The default job over a larger group with a larger dictionary: N_dict pairs, `|`,
    # then N steps, (N_dict + N) * 2 + 1 tokens. The mixed Z2 stage is the
    # default's (Z2 examples keep 2-pair dictionaries, where the lookup forms); the
    # action span, and so D_f = 17, is the default's.
    group, n_dict = GROUP_VARIANTS[variant]
    c = get_config("")
    c.data.update(group=group, dict_size=n_dict, group_curriculum=f"Z2+{group}:2000")
    c.train.seq_len = _fitting_seq_len(c)
  else:
    named = (*VALUE_VARIANTS, "v2_staged", *GROUP_VARIANTS)
    raise ValueError(f"unknown variant {variant!r}: allowed '', 'tiny', 'word', 'paper', "
                     f"{', '.join(repr(v) for v in named)}")
  return c


def _fitting_seq_len(c) -> int:
  """The longest training example's length (data.s5_examples.sequence_length), up to a
  multiple of 8."""
  from t2mlr_jax.data import s5_examples
  d = c.data
  n = s5_examples.sequence_length(d.max_actions, value_len=d.value_len,
                                  dict_size=d.dict_size, group=d.group)
  return -(-n // 8) * 8


VALUE_VARIANTS = {"v2": 2, "v4": 4}
GROUP_VARIANTS = {"s4": ("S4", 24), "s4_d16": ("S4", 16)}   # (group, dictionary pairs)
