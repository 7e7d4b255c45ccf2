"""GRPO in the trainer's loop: the tiny RL config end to end, a resumed run equal to the
uninterrupted one, rows cut into prompts and gold responses, and bad RL settings refused
by field."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from accel.test_multiprocess import _env, _finish, _free_port

from t2mlr_jax import checkpoint
from t2mlr_jax.convert.pretrained import load_pretrained, pretrained_config
from t2mlr_jax.registry import REWARDS, Reward
from t2mlr_jax.train import rl
from t2mlr_jax.train.loop import train
from t2mlr_jax.train.metrics import read_metrics

from _util import REPO_ROOT, config_file, max_abs


def digits(completion: str, record: dict) -> float:
  """A reward a fresh model's samples differ on (how many of its characters are digits),
  so advantages are not zero and the update moves the policy."""
  return sum(ch.isdigit() for ch in completion) / 3.0


@pytest.fixture(scope="module")
def digits_reward():
  REWARDS.register(Reward(name="test_digits", fn=digits, source=__name__))
  yield "test_digits"
  REWARDS.unregister("test_digits")


def _config(**overrides):
  """The tiny RL config as _command's runs it: the digits reward, varied samples from a
  fresh model, a large learning rate, 3 steps on a data x fsdp x tensor = 2x2x2 mesh."""
  c = config_file("rl_variable_assignment", "tiny", **overrides)
  c.rl.reward = "test_digits"
  c.rl.temperature = 2.0
  c.train.update(num_steps=3, eval_every=3, checkpoint_every=3)
  c.optimizer.lr = 1e-2
  c.mesh.update(data=2, fsdp=2, tensor=2)
  return c


@pytest.fixture(scope="module")
def whole(digits_reward, tmp_path_factory):
  """An uninterrupted run of _config()."""
  workdir = str(tmp_path_factory.mktemp("rl") / "whole")
  train(_config(), workdir, progress=False)
  return workdir


def test_split_rows_cuts_each_row_at_its_first_supervised_position():
  ids = np.asarray([[1, 10, 11, 12, 13, 2, 0], [1, 20, 21, 22, 2, 0, 0]])
  targets = np.asarray([[-100, -100, -100, 13, 2, -100, -100], [-100, -100, 22, 2, -100, -100,
                                                                 -100]])
  cf = np.asarray([[1, 1, 1, 1, 2, 2, 0], [1, 1, 1, 2, 2, 0, 0]])
  prompts, flows, golds = rl.split_rows({"input_ids": ids, "target_ids": targets,
                                         "control_flow": cf})
  assert prompts == [[1, 10, 11, 12], [1, 20, 21]]
  assert flows == [[1, 1, 1, 1], [1, 1, 1]]
  assert golds == [[13, 2], [22, 2]]
  with pytest.raises(ValueError, match="row 0 of the batch has no supervised position"):
    rl.split_rows({"input_ids": ids, "target_ids": np.full(ids.shape, -100)})


def test_prompt_widths_are_a_few_buckets():
  assert [rl.prompt_width(n, 150) for n in (1, 16, 17, 100, 140)] == [16, 16, 32, 128, 150]


@pytest.mark.slow       # two runs of the tiny RL config (about 70 s)
def test_rl_trains_and_a_resumed_run_equals_the_uninterrupted_one(whole, tmp_path):
  parts = str(tmp_path / "parts")
  logs = read_metrics(whole)
  assert [r["step"] for r in logs] == [1, 2, 3]
  for r in logs:
    assert 0 <= r["reward_mean"] <= 1 and r["groups_all_equal"] < 1
    assert r["completion_length"] > 0 and r["sampler_scorer_gap"] < 2e-5
    assert r["kl"] >= 0 and 0 <= r["clip_fraction"] <= 1
    assert 0 < r["gate_rec"] < 1 and 0 < r["gate_cur"] < 1    # the scorer's mean gates
  assert logs[0]["kl"] == 0.0 and logs[-1]["kl"] > 0      # the policy leaves its reference
  assert read_metrics(whole, "eval")[-1]["step"] == 3
  train(_config(**{"train.stop_after_steps": 1}), parts, progress=False)
  train(_config(), parts, progress=False)
  (_, a), (_, b) = checkpoint.load(whole), checkpoint.load(parts)
  assert max(max_abs(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))) == 0.0
  assert [r["reward_mean"] for r in read_metrics(parts)] == [r["reward_mean"] for r in logs]


@pytest.mark.slow       # one run of the tiny RL config with rl.iterations 2
def test_several_updates_per_batch_score_the_old_policy_once(digits_reward, tmp_path):
  c = _config(**{"rl.iterations": 2})
  train(c, str(tmp_path), progress=False)
  logs = read_metrics(str(tmp_path))
  assert [r["step"] for r in logs] == [1, 2, 3]       # a step is one batch of samples
  # the old policy's log-probs are the exact scorer's: equal to the sampler's
  assert all(r["sampler_scorer_gap"] < 2e-5 for r in logs)
  assert any(r["clip_fraction"] > 0 or r["grad_norm"] > 0 for r in logs)


@pytest.mark.parametrize("override,message", [
    ({"rl.group_size": 1}, r"rl\.group_size=1 is invalid: allowed an integer >= 2"),
    ({"rl.reward": "nope"}, r"rl\.reward='nope' is invalid: allowed one of \('exact'"),
    ({"rl.max_new_tokens": 500}, r"rl\.max_new_tokens=500 is invalid with train\.seq_len"),
])
def test_bad_rl_settings_are_refused_by_field(override, message, tmp_path):
  c = config_file("rl_variable_assignment", "tiny", **override)
  with pytest.raises(ValueError, match=message):
    train(c, str(tmp_path), progress=False)


USER_REWARD = """
from t2mlr_jax.registry import REWARDS, Reward

def digits(completion, record):
  return sum(ch.isdigit() for ch in completion) / 3.0

REWARDS.register(Reward(name="test_digits", fn=digits, source=__name__))
"""


def _command(workdir, module, *extra):
  """main's command line of _config() with the reward from a user's file."""
  return [sys.executable, "-m", "t2mlr_jax.main", "--config=configs/rl_variable_assignment.py:tiny",
          f"--workdir={workdir}", "--progress=false", f"--user_module={module}",
          "--config.rl.reward=test_digits", "--config.rl.temperature=2.0",
          "--config.optimizer.lr=0.01", "--config.train.num_steps=3",
          "--config.train.eval_every=3", "--config.train.checkpoint_every=3",
          "--config.mesh.data=2", "--config.mesh.fsdp=2", "--config.mesh.tensor=2", *extra]


@pytest.mark.slow       # two processes of the tiny RL config (about 100 s)
def test_two_processes_run_grpo_like_one(whole, tmp_path):
  """Both processes sample and score the same rollouts (each gathers the global batch), the
  update is sharded over a data x fsdp x tensor mesh spanning them: rewards and losses equal
  the one-process run of the same 8-device mesh (`whole`, the user's reward file here)."""
  module = tmp_path / "reward.py"
  module.write_text(USER_REWARD)
  one, two, port = whole, str(tmp_path / "two"), _free_port()
  procs = [subprocess.Popen(
      _command(two, module, f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2",
               f"--process_id={i}"), cwd=REPO_ROOT, env=_env(4), stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT, text=True) for i in range(2)]
  for p, out in zip(procs, _finish(procs, timeout=300)):
    assert p.returncode == 0, out[-3000:]

  def logs(workdir):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
      return [r for r in map(json.loads, f) if r["kind"] == "train"]

  a, b = logs(one), logs(two)
  assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 2, 3]
  assert [r["reward_mean"] for r in a] == [r["reward_mean"] for r in b]
  assert a[0]["groups_all_equal"] < 1
  np.testing.assert_allclose([r["loss"] for r in b], [r["loss"] for r in a], rtol=0, atol=1e-5)


@pytest.mark.slow       # a one-step run to start from (about 25 s)
def test_model_init_from_takes_a_training_workdir(tmp_path):
  """RL starts from a run trained by next-token loss: `model.init_from` names its workdir,
  whose latest checkpoint's weights (the recurrence's included) are loaded as they are."""
  sft = str(tmp_path / "sft")
  c = config_file("variable_assignment", "tiny")
  c.train.update(num_steps=1, eval_every=1, checkpoint_every=1)
  train(c, sft, progress=False)
  saved_cfg, saved = checkpoint.load(sft)
  assert pretrained_config(sft, recurrence=saved_cfg.recurrence) == saved_cfg
  cfg, params = load_pretrained(sft, recurrence=saved_cfg.recurrence)
  assert cfg == saved_cfg
  assert max(max_abs(x, y) for x, y in zip(jax.tree.leaves(saved), jax.tree.leaves(params))) == 0
  rl_config = config_file("rl_variable_assignment", "tiny", **{"model.init_from": sft})
  rl_config.train.num_steps = 1
  train(rl_config, str(tmp_path / "rl"), progress=False)
  assert read_metrics(str(tmp_path / "rl"))[0]["kl"] == 0.0     # the policy starts as its reference


@pytest.mark.slow       # 16 GRPO steps of the tiny model, data parallel
def test_grpo_raises_a_reward_the_policy_can_learn(digits_reward, tmp_path):
  """The whole loop learns: a fresh model's samples rarely hold digits (about 10 of 259
  bytes), and GRPO on the digits reward makes them more frequent step after step, the
  policy moving away from its reference (KL > 0)."""
  c = _config(**{"rl.group_size": 8})
  c.rl.temperature = 1.0
  c.mesh.update(data=-1, fsdp=1, tensor=1)    # data parallel only: the mesh is not at issue
  c.train.update(num_steps=16, log_every=4, eval_every=16, checkpoint_every=16)
  train(c, str(tmp_path), progress=False)
  logs = read_metrics(str(tmp_path))
  rewards = [r["reward_mean"] for r in logs]          # each a 4-step window's mean
  assert [r["step"] for r in logs] == [4, 8, 12, 16]
  assert rewards[-1] > 2 * rewards[0] and rewards[-1] - rewards[0] > 0.05, rewards
  assert logs[-1]["kl"] > logs[0]["kl"] > 0
