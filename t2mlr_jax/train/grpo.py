"""GRPO for any model of the library: a group of samples per prompt, drawn with each
sequence's own KV cache and recurrent state; rewards from a registered reward;
group-relative advantages; the clipped objective with a KL penalty to a frozen reference
(DeepSeekMath's, with TRL's variants), on log-probabilities scored under the control flow
the samples were drawn with (docs/rl.md).

A rollout row is one left-padded prompt followed by its completion: `Rollout` holds the
tokens and per-token side inputs a forward pass needs to score exactly what the sampler
saw, and `score` gives each completion token's log-probability under any mode ("exact":
the true recurrence, equal to the sampler's; a Jacobi schedule: an approximation whose gap
`score`'s callers can report).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple, Optional

import chex
import jax.numpy as jnp
import numpy as np

from t2mlr_jax.config import ModelConfig, invalid
from t2mlr_jax.losses import token_nll
from t2mlr_jax.model.control_flow import CF_PAD, CF_RECURRENT
from t2mlr_jax.model.decode import generate
from t2mlr_jax.model.modes import forward
from t2mlr_jax.registry import REWARDS
from t2mlr_jax.train.step import schedule_metrics

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo")
ADVANTAGE_EPS = 1e-4      # TRL's: std + 1e-4 in the group normalisation


@dataclasses.dataclass(frozen=True)
class GRPOConfig:
  """The algorithm's settings (the `rl` config group; docs/rl.md).

  loss_type "grpo": each completion's mean token loss, averaged over completions
  (DeepSeekMath); "bnpo": every completion token's loss over the batch's completion tokens
  (DAPO's token-level form); "dr_grpo": the summed token losses over completions x
  max_new_tokens (Dr. GRPO: no length bias). scale_rewards False: advantages are not
  divided by the group's std (Dr. GRPO). beta 0: no KL term, no reference model.
  iterations: optimisation steps on each batch of samples (μ; the old policy's
  log-probabilities are stored once per batch). epsilon_high: DAPO's clip-higher (None:
  epsilon). score_mode: the forward mode the loss scores completions under ("exact": the
  sampler's own policy; a schedule such as "jacobi" with its options: cheaper, approximate).
  reward: a registered reward's name (registry.REWARDS).
  """
  group_size: int = 8
  beta: float = 0.04
  epsilon: float = 0.2
  epsilon_high: Optional[float] = None
  loss_type: str = "grpo"
  scale_rewards: bool = True
  iterations: int = 1
  temperature: float = 1.0
  top_k: Optional[int] = None
  top_p: Optional[float] = None
  max_new_tokens: int = 64
  score_mode: str = "exact"
  reward: str = "exact"

  def __post_init__(self):
    REWARDS.get(self.reward, "rl.reward")
    if not isinstance(self.group_size, int) or self.group_size < 2:
      invalid("rl.group_size", self.group_size,
                    "an integer >= 2 (advantages compare samples within a group)")
    if not self.beta >= 0:
      invalid("rl.beta", self.beta, ">= 0 (0: no KL penalty)")
    if not 0 < self.epsilon < 1:
      invalid("rl.epsilon", self.epsilon, "a float in (0, 1)")
    if self.epsilon_high is not None and not self.epsilon_high > 0:
      invalid("rl.epsilon_high", self.epsilon_high, "None or > 0")
    if self.loss_type not in LOSS_TYPES:
      invalid("rl.loss_type", self.loss_type, f"one of {LOSS_TYPES}")
    if not isinstance(self.iterations, int) or self.iterations < 1:
      invalid("rl.iterations", self.iterations, "an integer >= 1")
    if not self.temperature > 0:
      invalid("rl.temperature", self.temperature,
                    "> 0 (the policy samples; its log-probabilities are of logits / temperature)")
    if self.top_k is not None and not (isinstance(self.top_k, int) and self.top_k >= 1):
      invalid("rl.top_k", self.top_k, "None or an integer >= 1")
    if self.top_p is not None and not 0 < self.top_p <= 1:
      invalid("rl.top_p", self.top_p, "None or a float in (0, 1]")
    if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
      invalid("rl.max_new_tokens", self.max_new_tokens, "an integer >= 1")
    if self.score_mode == "parallel":
      invalid("rl.score_mode", self.score_mode,
                    "'exact' or a training schedule (parallel ignores the recurrence)")

  @property
  def clip_high(self) -> float:
    return self.epsilon if self.epsilon_high is None else self.epsilon_high


def group_advantages(rewards, scale: bool = True):
  """[prompts, group_size] rewards of each prompt's samples -> advantages: reward minus the group's mean,
  divided by the group's (unbiased) std + 1e-4 when `scale` (TRL's form)."""
  rewards = jnp.asarray(rewards, jnp.float32)
  centred = rewards - rewards.mean(axis=1, keepdims=True)
  if not scale:
    return centred
  return centred / (rewards.std(axis=1, ddof=1, keepdims=True) + ADVANTAGE_EPS)


def objective(logp_BC, old_logp_BC, ref_logp_BC, advantages_B, mask_BC, rl: GRPOConfig):
  """(loss, metrics) of the clipped objective with the KL penalty (k3 estimator
  exp(ref − logp) − (ref − logp) − 1), aggregated by rl.loss_type over the completion
  tokens `mask_BC` marks; ref_logp may be None when rl.beta is 0."""
  mask = mask_BC.astype(jnp.float32)
  ratio = jnp.exp(logp_BC - old_logp_BC)
  adv = advantages_B[:, None]
  clipped = jnp.clip(ratio, 1 - rl.epsilon, 1 + rl.clip_high)
  per_token = -jnp.minimum(ratio * adv, clipped * adv)
  metrics = {}
  if rl.beta > 0:
    delta = ref_logp_BC - logp_BC
    kl = jnp.exp(delta) - delta - 1
    per_token = per_token + rl.beta * kl
    metrics["kl"] = jnp.sum(kl * mask) / jnp.maximum(mask.sum(), 1)
  lengths = mask.sum(axis=1)
  if rl.loss_type == "grpo":
    loss = jnp.mean(jnp.sum(per_token * mask, axis=1) / jnp.maximum(lengths, 1))
  elif rl.loss_type == "bnpo":
    loss = jnp.sum(per_token * mask) / jnp.maximum(mask.sum(), 1)
  else:
    loss = jnp.sum(per_token * mask) / (mask.shape[0] * mask.shape[1])
  low = (ratio < 1 - rl.epsilon) & (adv < 0)
  high = (ratio > 1 + rl.clip_high) & (adv > 0)
  metrics["clip_fraction"] = jnp.sum((low | high) * mask) / jnp.maximum(mask.sum(), 1)
  return loss, metrics


class Rollout(NamedTuple):
  """Prompts and their sampled completions, one row each (prompt rows repeated G times).

  tokens [B, P+C]: the left-padded prompt then the completion (after EOS the sampler
  repeats EOS); control_flow, positions, segment_ids [B, P+C]: what the sampler ran
  (padding a document of its own with cf 0); mask [B, C]: completion tokens up to and
  including the first EOS; sampler_logp [B, C]: each token's log-probability as drawn.
  """
  tokens: jnp.ndarray
  control_flow: jnp.ndarray
  positions: jnp.ndarray
  segment_ids: jnp.ndarray
  mask: jnp.ndarray
  sampler_logp: jnp.ndarray

  @property
  def prompt_len(self) -> int:
    return self.tokens.shape[1] - self.mask.shape[1]


def completion_mask(completions_BC, eos_id: Optional[int]):
  """[B, C] bool: the tokens up to and including each row's first EOS (all without one)."""
  if eos_id is None:
    return jnp.ones(completions_BC.shape, bool)
  is_eos = completions_BC == eos_id
  before = jnp.cumsum(is_eos, axis=1) - is_eos    # EOS tokens strictly before t
  return before == 0


def rollout_inputs(prompt_BP, lengths_B, prompt_cf_BP, completions_BC):
  """(tokens, control_flow, positions, segment_ids) [B, P+C] of left-padded prompts and
  their completions: the side inputs the decoder gave the same tokens."""
  rows, P = prompt_BP.shape
  C = completions_BC.shape[1]
  t = jnp.arange(P + C)[None, :]
  pad = (P - lengths_B)[:, None]
  valid = t >= pad
  cf = jnp.concatenate([prompt_cf_BP, jnp.full((rows, C), CF_RECURRENT, jnp.int32)], axis=1)
  return (jnp.concatenate([prompt_BP, completions_BC], axis=1).astype(jnp.int32),
          jnp.where(valid, cf, CF_PAD).astype(jnp.int32),
          jnp.maximum(t - pad, 0).astype(jnp.int32), valid.astype(jnp.int32))


def token_logprobs(logits_BCV, tokens_BC, temperature: float):
  """log softmax(logits / temperature) at each token [B, C] (fp32): the sampling policy's
  log-probability (top-k / top-p truncation is not in it, as in TRL)."""
  return -token_nll(logits_BCV.astype(jnp.float32) / temperature, tokens_BC)[0]


def score(params, cfg: ModelConfig, rollout: Rollout, *, mode: str, temperature: float,
          return_stats: bool = False, **mode_options):
  """[B, C] log-probabilities of each completion token under `mode` (the policy's at
  `temperature`): one forward over prompt and completion with the sampler's side inputs.
  return_stats: (log-probs, the forward's metrics as a training step logs them: T2MLR's
  mean gates, LRT's per-layer gates under its schedules, a Jacobi scorer's sweeps and
  residual)."""
  logits, aux = forward(params, cfg, rollout.tokens, mode=mode,
                        control_flow=rollout.control_flow, positions=rollout.positions,
                        segment_ids=rollout.segment_ids, return_aux=True, **mode_options)
  P, C = rollout.prompt_len, rollout.mask.shape[1]
  logp = token_logprobs(logits[:, P - 1:P + C - 1], rollout.tokens[:, P:], temperature)
  if not return_stats:
    return logp
  # scalars and per-layer vectors; the per-pass logits a schedule returns are not metrics
  return logp, {k: v for k, v in schedule_metrics(aux).items() if getattr(v, "ndim", 2) <= 1}


def left_pad(prompts: list, pad_id: int = 0, width: Optional[int] = None):
  """(tokens [B, P] int32, lengths [B]) of token lists, real tokens right-aligned; P is
  `width` (a fixed width: one compiled program for every batch) or the longest."""
  if not prompts or any(len(p) == 0 for p in prompts):
    raise ValueError("prompts must be a non-empty list of non-empty token lists")
  P = max(len(p) for p in prompts) if width is None else width
  if max(len(p) for p in prompts) > P:
    raise ValueError(f"a prompt of {max(len(p) for p in prompts)} tokens exceeds width={P}")
  out = np.full((len(prompts), P), pad_id, np.int32)
  for b, p in enumerate(prompts):
    out[b, P - len(p):] = p
  return out, np.asarray([len(p) for p in prompts], np.int32)


def sample(params, cfg: ModelConfig, prompts: list, prompt_cf: list, rl: GRPOConfig, rng,
           eos_id: Optional[int], width: Optional[int] = None) -> Rollout:
  """G samples of each prompt (token lists; prompt_cf: each prompt's control flow, a list
  of 1s and 2s per token) through the batched decoder: every row its own KV cache and
  recurrent state, tokens drawn at rl.temperature / top_k / top_p; prompts left-padded to
  `width` (None: the longest)."""
  G = rl.group_size
  tokens, lengths = left_pad([p for p in prompts for _ in range(G)], width=width)
  cf, _ = left_pad([list(c) for c in prompt_cf for _ in range(G)], pad_id=CF_RECURRENT,
                   width=width)
  completions, logp = generate(
      params, cfg, tokens, max_new_tokens=rl.max_new_tokens, temperature=rl.temperature,
      top_k=rl.top_k, top_p=rl.top_p, eos_id=eos_id, rng=rng, prompt_lengths=lengths,
      prompt_control_flow=cf, return_logprobs=True)
  tok, ctl, pos, seg = rollout_inputs(jnp.asarray(tokens), jnp.asarray(lengths),
                                      jnp.asarray(cf), completions)
  mask = completion_mask(completions, eos_id)
  chex.assert_shape(logp, (len(prompts) * G, rl.max_new_tokens))
  return Rollout(tok, ctl, pos, seg, mask, jnp.where(mask, logp, 0.0))
