"""GRPO in the trainer's loop (train/loop.py): a config with an `rl` group trains by RL on
its task's data instead of by next-token loss, with everything else of the loop (mesh,
Orbax checkpoints and bit-identical resume, SIGTERM saves, evaluations, metrics).

Each step takes the task's batch as it would for SFT, cuts each row at its first
supervised position into a prompt (with its control flow) and a gold response, samples
`rl.group_size` completions of every prompt through the batched decoder (each row its own
KV cache and recurrent state; the RNG is the seed folded with the step, so a resumed run
draws what the uninterrupted one drew), scores them with the registered reward against
the gold response's text, and takes `rl.iterations` optimizer updates of the GRPO
objective (train/grpo.py) scored under `rl.score_mode`. The reference model of the KL
term is the run's starting parameters (a fresh init or `model.init_from`), rebuilt the
same way on resume.
"""

from __future__ import annotations

import functools
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

from t2mlr_jax import sharding
from t2mlr_jax.model import decode
from t2mlr_jax.registry import REWARDS, family_of
from t2mlr_jax.train import grpo
from t2mlr_jax.train.config import config_fields, data_config
from t2mlr_jax.train.step import apply_update, at_step, recurrence_metrics, state_shardings


def rl_fields() -> dict:
  """The `rl` config group: GRPOConfig's fields at their defaults (an RL config adds it
  to base_config())."""
  return config_fields(grpo.GRPOConfig)


def rl_config(config) -> Optional[grpo.GRPOConfig]:
  """The typed, checked `rl` group, or None for a config without one (next-token
  training)."""
  group = config.get("rl")
  if group is None:
    return None
  return grpo.GRPOConfig(**dict(group))


def updates_per_step(config) -> int:
  """Optimizer updates one loop step takes: rl.iterations under RL, else 1 (the
  optimizer's schedule counts updates)."""
  rl = rl_config(config)
  return 1 if rl is None else rl.iterations


def check(config, cfg, task, needs_tokenizer: bool = True) -> None:
  """What RL needs of the rest of the config, each refusal naming its field (the compile
  tool, which reads no text, skips the tokenizer's)."""
  rl = rl_config(config)
  if getattr(data_config(config), "packed", False):
    raise ValueError("data.packed=True is invalid under RL: allowed False (each row one "
                     "example, cut into its prompt and gold response)")
  if needs_tokenizer and task.tokenizer is None and not (config.data.get("tokenizer")
                                                         or config.model.init_from):
    raise ValueError(f"data.task={task.name} has no vocabulary of its own: set data.tokenizer "
                     "or model.init_from (rewards read the completions as text)")
  width = _max_prompt_width(config)
  if width + rl.max_new_tokens > cfg.max_seq_len:
    raise ValueError(f"rl.max_new_tokens={rl.max_new_tokens} is invalid with train.seq_len="
                     f"{config.train.seq_len}: allowed prompt width {width} + max_new_tokens "
                     f"<= model.max_seq_len={cfg.max_seq_len}")
  if not getattr(family_of(cfg), "decodes", False):
    raise ValueError(f"model.arch={config.model.arch} does not decode: allowed a family that "
                     "declares decodes=True (RL samples from the policy)")


def _max_prompt_width(config) -> int:
  """The longest prompt a row of train.seq_len tokens can hold (its response at least one
  token)."""
  return config.train.seq_len - 1


def prompt_width(longest: int, most: int) -> int:
  """The width a batch's prompts are left-padded to: the power of two (at least 16) that
  holds the longest, at most `most`, so a run compiles a few sampler and scorer programs,
  not one per batch."""
  return min(most, max(16, 1 << (longest - 1).bit_length()))


def split_rows(batch: dict):
  """(prompts, prompt control flows, gold responses): each row cut at its first supervised
  position (the prompt ends there; the gold response is the supervised targets, EOS
  included). A row without a supervised position is an error."""
  ids, targets = np.asarray(batch["input_ids"]), np.asarray(batch["target_ids"])
  cf = batch.get("control_flow")
  cf = np.full(ids.shape, 2, np.int32) if cf is None else np.asarray(cf)
  prompts, flows, golds = [], [], []
  for b in range(ids.shape[0]):
    sup = np.nonzero(targets[b] >= 0)[0]
    if sup.size == 0:
      raise ValueError(f"row {b} of the batch has no supervised position: RL needs each "
                       "row to be a prompt and its response")
    s = int(sup[0])
    prompts.append(ids[b, :s + 1].tolist())
    flows.append(np.where(cf[b, :s + 1] == 0, 2, cf[b, :s + 1]).tolist())
    golds.append(targets[b, s:][targets[b, s:] >= 0].tolist())
  return prompts, flows, golds


def host(tree):
  """A pytree's values as numpy on this process: every process gets the whole of a global
  array that spans several (each samples and scores the same rows: rewards run on hosts)."""
  def one(a):
    if isinstance(a, jax.Array) and not a.is_fully_addressable and not a.is_fully_replicated:
      return np.asarray(multihost_utils.process_allgather(a, tiled=True))
    return np.asarray(a)
  return jax.tree.map(one, tree)


def _text(tokenizer, ids, eos_id) -> str:
  ids = list(ids)
  if eos_id is not None and eos_id in ids:
    ids = ids[:ids.index(eos_id)]
  return tokenizer.decode(ids)


def rewards_of(reward: str, tokenizer, prompts, golds, completions_BC, mask_BC, G: int,
               eos_id) -> np.ndarray:
  """[prompts, group_size] rewards of each prompt's G completions (text up to EOS) against its gold."""
  fn = REWARDS.get(reward, "rl.reward").fn
  comps, mask = np.asarray(completions_BC), np.asarray(mask_BC)
  out = np.zeros((len(prompts), G), np.float32)
  for b, (prompt, gold) in enumerate(zip(prompts, golds)):
    record = {"prompt": _text(tokenizer, prompt, None), "response": _text(tokenizer, gold, eos_id)}
    for g in range(G):
      r = b * G + g
      out[b, g] = fn(_text(tokenizer, comps[r][mask[r]], eos_id), record)
  return out


class RLStep:
  """(state, batch) -> (state, metrics): one GRPO step, the loop's train step under RL."""

  def __init__(self, config, cfg, tx, schedule, mesh, num_steps: int, reference, tokenizer):
    self.rl = rl_config(config)
    self.cfg = family_of(cfg).for_devices(cfg, mesh.devices.flat)
    self.tx, self.schedule, self.mesh = tx, schedule, mesh
    self.num_steps, self.reference, self.tokenizer = num_steps, reference, tokenizer
    self.seed = config.train.seed
    self.most = _max_prompt_width(config)
    self.eos_id = getattr(tokenizer, "eos_id", None)
    self._update = update_step(self.cfg, self.rl, tx, schedule, num_steps, mesh)
    self._score = jax.jit(functools.partial(_score, cfg=self.cfg, rl=self.rl))

  def __call__(self, state, batch):
    rl, G = self.rl, self.rl.group_size
    step = int(host(state.step))
    prompts, flows, golds = split_rows(host(batch))
    now = at_step(state.params, self.cfg, state.step, self.num_steps)
    rng = jax.random.fold_in(jax.random.PRNGKey(self.seed), step)
    width = prompt_width(max(len(p) for p in prompts), self.most)
    rollout = grpo.sample(now, self.cfg, prompts, flows, rl, rng, self.eos_id, width=width)
    completions, mask = host((rollout.tokens[:, rollout.prompt_len:], rollout.mask))
    rewards = rewards_of(rl.reward, self.tokenizer, prompts, golds, completions, mask, G,
                         self.eos_id)
    adv = grpo.group_advantages(rewards, scale=rl.scale_rewards).reshape(-1)
    old = self._score(now, rollout) if rl.iterations > 1 else None
    ref = self._score(self.reference, rollout) if rl.beta > 0 else None
    for i in range(rl.iterations):
      state, metrics = self._update(state, rollout, old, ref, adv, last=i == rl.iterations - 1)
      if i == 0:      # scored by the parameters that sampled: the scorer's distance to them
        gap = metrics["sampler_scorer_gap"]
    metrics["sampler_scorer_gap"] = gap
    lengths = mask.sum(1)
    metrics.update(
        reward_mean=float(rewards.mean()), reward_std=float(rewards.std()),
        reward_group_std=float(rewards.std(axis=1).mean()),
        groups_all_equal=float(np.mean(rewards.std(axis=1) == 0)),
        completion_length=float(lengths.mean()))
    return state, metrics


def update_step(cfg, rl, tx, schedule, num_steps: int, mesh):
  """jit(state, rollout, old_logp, ref_logp, advantages, last=) -> (state, metrics): one
  optimizer update of the GRPO objective (the state donated, kept in its shardings)."""
  return jax.jit(functools.partial(
      _update, cfg=cfg, rl=rl, tx=tx, schedule=schedule, num_steps=num_steps, mesh=mesh,
      shardings=state_shardings(cfg, tx, mesh)), static_argnames=("last",), donate_argnums=0)


def aot_steps(config, cfg, tx, schedule, mesh, state_abs, params_abs) -> list:
  """What the compile tool compiles of an RL config (accel/aot.py), as (name, jitted,
  abstract args, FLOPs, extra): the GRPO update on the largest rollout a step can draw
  (train.batch_size prompts x rl.group_size, prompts at their widest) and the sampler (the
  prompt's exact prefill and the decode loop over those rows). Beside either program the
  device holds the other's arrays: the reference model (rl.beta > 0) is counted as
  resident."""
  rl = rl_config(config)
  B = config.train.batch_size * rl.group_size
  P, C = _max_prompt_width(config), rl.max_new_tokens
  rows2, rows1 = sharding.batch_sharding(mesh), sharding.batch_sharding(mesh, 1)
  ints = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.int32, sharding=rows2)
  floats = lambda *shape: jax.ShapeDtypeStruct(
      shape, jnp.float32, sharding=rows2 if len(shape) == 2 else rows1)
  rollout = grpo.Rollout(ints(B, P + C), ints(B, P + C), ints(B, P + C), ints(B, P + C),
                         jax.ShapeDtypeStruct((B, C), jnp.bool_, sharding=rows2),
                         floats(B, C))
  old = floats(B, C) if rl.iterations > 1 else None
  ref = floats(B, C) if rl.beta > 0 else None
  update = update_step(cfg, rl, tx, schedule, config.train.num_steps, mesh)
  held = lambda tree: sharding.per_device_bytes(tree, jax.tree.map(lambda a: a.sharding, tree))
  reference = held(params_abs) if rl.beta > 0 else 0
  extra = {"mode": f"GRPO, {rl.score_mode} scorer", "rows": B, "prompt_width": P,
           "completion_tokens": C, "resident_bytes": reference}
  steps = [("train", _Lowered(update, None, last=True), (state_abs, rollout, old, ref, floats(B)),
            None, extra)]
  prompt_cf = getattr(data_config(config), "recurrent_prompt", False)
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  sample_args = (params_abs, ints(B, P), jax.ShapeDtypeStruct((B,), jnp.int32, sharding=rows1),
                 ints(B, P), jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=replicated))
  sampler = _Lowered(decode._generate, ("params", "prompt", "lengths", "prompt_cf", "rng"),
                     cfg=cfg, max_new_tokens=C, temperature=rl.temperature,
                     top_k=rl.top_k, top_p=rl.top_p, eos_id=0, recurrent_prompt=prompt_cf,
                     return_logits=False, prefill_mode="exact", prefill_tol=None,
                     return_logprobs=True)
  # beside the sampler: the optimizer state and the reference
  steps.append(("sample", sampler, sample_args, None,
                {"rows": B, "prompt_width": P, "completion_tokens": C,
                 "resident_bytes": held(state_abs) - held(params_abs) + reference}))
  return steps


class _Lowered:
  """A jitted function with some keyword arguments fixed: `lower(*args)` as aot calls it
  (the args passed by `names` when given), under the mesh's abstract form (the model's
  activation constraints read it)."""

  def __init__(self, jitted, names, **kwargs):
    self.jitted, self.names, self.kwargs = jitted, names, kwargs

  def lower(self, *args):
    mesh = jax.tree.leaves(args)[0].sharding.mesh
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
      if self.names is None:
        return self.jitted.lower(*args, **self.kwargs)
      return self.jitted.lower(**dict(zip(self.names, args)), **self.kwargs)


def _score(params, rollout, *, cfg, rl):
  return grpo.score(params, cfg, rollout, mode=rl.score_mode, temperature=rl.temperature)


def _update(state, rollout, old_logp, ref_logp, adv, *, cfg, rl, tx, schedule, num_steps,
            mesh, shardings, last: bool):
  """One optimizer update of the GRPO objective; the state's step advances on the batch's
  last update (a loop step is one batch of samples); a non-finite loss or gradient skips
  it and sets the sticky flag, as the next-token step does. The new state keeps the
  trainer's shardings (a resumed run's restored state has them: the same programs)."""
  now = at_step(state.params, cfg, state.step, num_steps)

  def loss_fn(params):
    logp, stats = grpo.score(params, cfg, rollout, mode=rl.score_mode,
                             temperature=rl.temperature, return_stats=True)
    old = jax.lax.stop_gradient(logp) if old_logp is None else old_logp
    loss, aux = grpo.objective(logp, old, ref_logp, adv, rollout.mask, rl)
    # max |scorer - sampler| log-probability: 0 up to rounding in exact mode, the
    # approximation's size under a schedule (meaningful at the batch's first update)
    gap = jnp.where(rollout.mask, jax.lax.stop_gradient(logp) - rollout.sampler_logp, 0.0)
    stats = jax.tree.map(jax.lax.stop_gradient, stats)   # the scorer's gates on the rollouts
    return loss, {**stats, **aux, "sampler_scorer_gap": jnp.max(jnp.abs(gap))}

  with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
    (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(now)
  new_state, grad_norm = apply_update(state, now, grads, loss, tx, advance=last)
  metrics = {"loss": loss, "grad_norm": grad_norm, "lr": schedule(state.step * rl.iterations),
             **aux, **recurrence_metrics(now, cfg)}
  return jax.lax.with_sharding_constraint(new_state, shardings), metrics
