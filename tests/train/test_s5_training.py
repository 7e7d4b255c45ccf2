"""Every model type of the S5 experiments trains through the same main loop."""

import os
import sys

import jax
import numpy as np
import pytest

from t2mlr_jax.model import lstm
from t2mlr_jax.train.config import model_config
from t2mlr_jax.train.loop import train
from t2mlr_jax.train.metrics import read_metrics

from _util import REPO_ROOT

CONFIGS = os.path.join(REPO_ROOT, "configs")
sys.path.insert(0, CONFIGS)
import s5_retrieval  # noqa: E402
import s5_retrieval_all_layers  # noqa: E402
import s5_retrieval_lstm  # noqa: E402
import s5_retrieval_transformer  # noqa: E402
import variable_assignment  # noqa: E402


@pytest.mark.parametrize("module", [pytest.param(m, marks=pytest.mark.slow) for m in (
    s5_retrieval, s5_retrieval_transformer, s5_retrieval_lstm, s5_retrieval_all_layers)])
def test_tiny_run_reduces_loss_and_reports_lengths(tmp_path, module):
  config = module.get_config("tiny")
  config.train.update(num_steps=12, eval_every=12, checkpoint_every=12, log_every=1)
  config.optimizer.update(lr=3e-3, warmup_frac=0.0)
  train(config, str(tmp_path), progress=False)
  losses = [r["loss"] for r in read_metrics(str(tmp_path))]
  assert len(losses) == 12 and np.mean(losses[-3:]) < np.mean(losses[:3])
  final = read_metrics(str(tmp_path), "eval")[-1]
  assert set(final["seq_acc_by_length"]) == {"2", "6"}
  assert 0.0 <= final["state_acc"] <= 1.0 and "value_acc" in final


def test_matched_budgets():
  """The CPU presets compare models of (nearly) the same size."""
  for variant in ("", "word", *s5_retrieval.VALUE_VARIANTS, "v2_staged",
                  *s5_retrieval.GROUP_VARIANTS):
    ref = model_config(s5_retrieval.get_config(variant)).num_params()
    for module in (s5_retrieval_transformer, s5_retrieval_lstm, s5_retrieval_all_layers):
      n = model_config(module.get_config(variant)).num_params()
      assert abs(n / ref - 1) <= 0.10, (module.__name__, variant, n, ref)
  paper = s5_retrieval.get_config("paper")
  assert paper.model.rope_theta is None and paper.model.n_layers == 6
  assert paper.train.num_steps == 400_000 and paper.data.eval_max_actions == 48
  assert model_config(s5_retrieval_lstm.get_config("paper")).d_model == 360


@pytest.mark.parametrize("variant", ["", *s5_retrieval.VALUE_VARIANTS])
def test_value_variants_fit_their_sequences_and_jacobi_covers_the_span(variant):
  """The default job with v-character values: the longest training example fits seq_len
  (never truncated), the longest evaluated one max_seq_len, and D_f the recurrent span
  (the steps: N(1 + v) + 1 tokens), as the default's 17 at v = 1."""
  from t2mlr_jax.data import s5_examples
  c = s5_retrieval.get_config(variant)
  d = c.data
  longest = s5_examples.sequence_length(d.max_actions, value_len=d.value_len, group=d.group)
  assert longest <= c.train.seq_len < longest + 8
  longest_eval = max(map(int, d.eval_lengths.split(",")))
  assert s5_examples.sequence_length(longest_eval, value_len=d.value_len,
                                     group=d.group) <= c.model.max_seq_len
  assert c.model.schedule_options.d_forward == d.max_actions * (1 + d.value_len) + 1
  assert c.data.value_len == s5_retrieval.VALUE_VARIANTS.get(variant, 1)


def test_v2_staged_is_v2_after_one_character_values():
  """v2_staged differs from v2 only in its value curriculum: one-character values up to
  step 3000, then v2's two, in examples that fit v2's seq_len."""
  from t2mlr_jax.train import config as config_lib, tasks
  staged, v2 = s5_retrieval.get_config("v2_staged"), s5_retrieval.get_config("v2")
  diff = {k for k, v in config_lib.flatten(staged.to_dict()).items()
          if config_lib.flatten(v2.to_dict()).get(k) != v}
  assert diff == {"data.value_curriculum"} and staged.data.value_curriculum == "1:3000"
  src = tasks._s5_train_source(staged, staged.train.num_steps * staged.train.batch_size,
                               word_problem=False)
  b = staged.train.batch_size
  assert [src.value_len_at(i) for i in (0, 3000 * b - 1, 3000 * b)] == [1, 1, 2]
  assert max(len(src[i]["input_ids"]) for i in range(3000 * b - 40, 3000 * b + 40)) \
      <= staged.train.seq_len


@pytest.mark.parametrize("variant", list(s5_retrieval.GROUP_VARIANTS))
def test_group_variants_hold_their_dictionaries(variant):
  """The S4 variants: every training example (Z2 stage and S4 alike) fits seq_len, every
  S4 example and every evaluated one holds the variant's dictionary, and D_f still covers
  the action span (the dictionary is not recurrent)."""
  from t2mlr_jax.data import s5_examples
  from t2mlr_jax.train import tasks
  c = s5_retrieval.get_config(variant)
  group, n_dict = s5_retrieval.GROUP_VARIANTS[variant]
  assert (c.data.group, c.data.dict_size, c.data.value_len) == (group, n_dict, 1)
  task = tasks.get_task(c)
  source = task.train_source(c, 10 ** 6)
  late = range(2000 * c.train.batch_size, 2000 * c.train.batch_size + 64)   # after Z2+S4
  groups = set()
  for i in [*range(64), *late]:
    ex, groups = source[i], groups | {source.group_at(i)}
    assert len(ex["input_ids"]) <= c.train.seq_len
    if source.group_at(i) == group:          # (n_dict + N) pairs of 2 tokens, then `|`
      assert len(ex["input_ids"]) == (n_dict + s5_examples.state_positions(ex).sum()) * 2 + 1
  assert groups == {"Z2", group}
  for batch in task.eval_batches(c):
    assert batch["input_ids"].shape[1] <= c.model.max_seq_len
  assert c.model.schedule_options.d_forward == 2 * c.data.max_actions + 1


def test_lstm_is_causal():
  cfg = lstm.LSTMConfig(vocab_size=20, d_model=16, n_layers=2)
  params = lstm.init_params(cfg, jax.random.PRNGKey(0))
  assert sum(x.size for x in jax.tree.leaves(params)) == cfg.num_params()
  tokens = np.arange(10, dtype=np.int32)[None] % 20
  changed = tokens.copy()
  changed[0, 6:] = 0
  a, b = lstm.forward(params, cfg, tokens), lstm.forward(params, cfg, changed)
  np.testing.assert_array_equal(a[:, :6], b[:, :6])
  assert float(np.abs(a[:, 6:] - b[:, 6:]).max()) > 0


@pytest.mark.slow       # a training run; slow step
def test_variable_assignment_trains(tmp_path):
  config = variable_assignment.get_config("tiny")
  train(config, str(tmp_path), progress=False)
  final = read_metrics(str(tmp_path), "eval")[-1]
  assert final["num_examples"] == 8 and 0.0 <= final["seq_acc"] <= 1.0
