"""T2MLR and LRT outputs on tiny models, computed by the public API, for a bitwise guard.

`tests/fixtures/t2mlr_reference.npz` holds the parameters and tokens, and
`t2mlr_reference.json` a SHA-256 digest (with dtype, shape and max |x|) of every output:
T2MLR's as this module computed them before the recurrence interface was introduced
(commit 9fc3e0d), LRT's as of commit 5f36796 (before the schedules share that
interface): the logits, aux, losses and gradients of every mode plus generate.
`test_t2mlr_reference.py` recomputes them with today's code from the stored parameters
and asks for equality bit for bit, so a refactor of the modes cannot move T2MLR's numbers.

Regenerate (only when a change is meant to move the numbers):
    python tests/_t2mlr_reference.py tests/fixtures/t2mlr_reference
"""

import hashlib
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import conftest  # noqa: E402,F401  (the suite's XLA flags and matmul precision)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import traverse_util  # noqa: E402

from t2mlr_jax import LRTConfig, ModelConfig, T2MLRConfig, forward, generate, loss  # noqa: E402
from t2mlr_jax import init_params  # noqa: E402
from _util import active_params  # noqa: E402

B, T = 3, 12
CF = np.array([[2] * 12,
               [1, 1, 1, 1, 2, 2, 2, 1, 2, 2, 2, 2],
               [0, 0, 0, 1, 1, 2, 2, 2, 2, 2, 2, 2]], np.int32)
POS = np.array([list(range(12)), list(range(12)), [0, 0, 0] + list(range(9))], np.int32)
SEG = np.array([[0] * 7 + [1] * 5, [0] * 12, [0] * 12], np.int32)


def configs():
  """name -> ModelConfig: the S5-style residual cache and a raw cache with GQA and RoPE,
  and the scanned (remat) Jacobi path."""
  base = dict(vocab_size=37, d_model=32, n_layers=4, n_heads=4, n_kv_heads=2, d_ff=64,
              max_seq_len=64, rope_theta=10000.0)
  return {
      "residual": ModelConfig(**base, recurrence=T2MLRConfig(l_start=1, l_end=2, d_forward=4,
                                                             d_backward=2)),
      "raw_nope": ModelConfig(**{**base, "rope_theta": None}, recurrence=T2MLRConfig(
          l_start=0, l_end=-2, residual=False, d_forward=5, d_backward=2)),
      "remat": ModelConfig(**base, remat="full", recurrence=T2MLRConfig(
          l_start=1, l_end=-1, cache_norm="rmsnorm", d_forward=6, d_backward=3)),
  }


def lrt_configs():
  """name -> ModelConfig of LRT: layerwise feedback from the final state on a Llama-style
  backbone, and the shared projection from layer 1 on nanochat's backbone (windows,
  QK-norm, relu², softcap, α/β, value embeddings) with the kv refresh."""
  base = dict(vocab_size=37, d_model=32, n_layers=4, n_heads=4, n_kv_heads=2, d_ff=64,
              max_seq_len=64, rope_theta=10000.0)
  nanochat = dict(norm_scale=False, embed_norm=True, qk_norm=True, mlp_type="relu2",
                  logit_softcap=15.0, resid_lambdas=True, x0_lambdas=True,
                  window_pattern="SL", window_short=4, tie_embeddings=False)
  return {
      "lrt_layerwise": ModelConfig(**base, recurrence=LRTConfig(
          source_layer=-1, passes=2, gate_channels=16, refine_passes=2)),
      "lrt_shared_nanochat": ModelConfig(**base, **nanochat, recurrence=LRTConfig(
          source_layer=1, projection="shared", passes=3, kv_refresh=True, gate_channels=8,
          refine_passes=3, refine_weights=(1.0, 0.5, 0.5, 2.0))),
  }


def compute_lrt(name, cfg, params, tokens):
  """LRT's outputs: every mode's logits and aux, each training schedule's loss (per-pass
  losses too) and every gradient, and generate with left padding."""
  out = {}
  labels = np.concatenate([tokens[:, 1:], np.full((B, 1), -1, np.int32)], axis=1)
  labels = np.where(CF > 0, labels, -1)
  side = dict(control_flow=CF, positions=POS)
  for mode in ("parallel", "exact", "interleaved", "chunked", "multi_refine"):
    logits, aux = forward(params, cfg, tokens, mode=mode, return_aux=True, **side)
    out[mode] = logits
    for k, v in aux.items():
      if isinstance(v, (list, tuple)):        # the passes' logits, one array a pass
        out.update({f"{mode}_aux/{k}/{i}": a for i, a in enumerate(v)})
      else:
        out[f"{mode}_aux/{k}"] = v
  out["exact_segments"] = forward(params, cfg, tokens, mode="exact", segment_ids=SEG)
  for mode in ("interleaved", "chunked", "multi_refine"):
    def value(p, mode=mode):
      return loss(p, cfg, tokens, mode=mode, targets=labels, return_aux=True, **side)
    (v, aux), grads = jax.value_and_grad(value, has_aux=True)(params)
    out[f"{mode}_loss"] = v
    out[f"{mode}_loss/per_pass_losses"] = aux["per_pass_losses"]
    for k, g in traverse_util.flatten_dict(grads, sep="/").items():
      out[f"{mode}_grad/{k}"] = g
  prompt = tokens[:, :6]
  for pcf in (1, 2):
    toks, step_logits = generate(params, cfg, prompt, max_new_tokens=4,
                                 prompt_lengths=[6, 5, 3], prompt_control_flow=pcf,
                                 return_logits=True)
    out[f"generate_cf{pcf}/tokens"] = toks
    out[f"generate_cf{pcf}/logits"] = step_logits
  return {f"{name}/{k}": np.asarray(v) for k, v in out.items()}


def _ce(logits, labels):
  valid = labels >= 0
  logp = jax.nn.log_softmax(logits, axis=-1)
  nll = -jnp.take_along_axis(logp, jnp.where(valid, labels, 0)[..., None], axis=-1)[..., 0]
  return jnp.sum(jnp.where(valid, nll, 0.0)) / jnp.sum(valid)


def compute(name, cfg, params, tokens):
  """Every output the guard compares, as {key: np.ndarray}."""
  out = {}
  labels = np.concatenate([tokens[:, 1:], np.full((B, 1), -1, np.int32)], axis=1)
  labels = np.where(CF > 0, labels, -1)
  side = dict(control_flow=CF, positions=POS)
  out["parallel"] = forward(params, cfg, tokens, mode="parallel", **side)
  logits, aux = forward(params, cfg, tokens, mode="exact", return_aux=True, **side)
  out["exact"] = logits
  for k, v in aux.items():
    out[f"exact_aux/{k}"] = v
  out["exact_segments"] = forward(params, cfg, tokens, mode="exact", segment_ids=SEG)
  for d_f, d_b in ((1, 1), (3, 2), (T, 2)):
    logits, aux = forward(params, cfg, tokens, mode="jacobi", d_forward=d_f, d_backward=d_b,
                          return_aux=True, **side)
    out[f"jacobi_{d_f}_{d_b}"] = logits
    for k, v in aux.items():
      out[f"jacobi_{d_f}_{d_b}_aux/{k}"] = v

  def loss(p):
    return _ce(forward(p, cfg, tokens, mode="jacobi", **side), labels)
  value, grads = jax.value_and_grad(loss)(params)
  out["jacobi_loss"] = value
  for k, v in traverse_util.flatten_dict(grads, sep="/").items():
    out[f"jacobi_grad/{k}"] = v
  prompt = tokens[:, :6]
  for pcf in (1, 2):
    toks, step_logits = generate(params, cfg, prompt, max_new_tokens=4, prompt_lengths=[6, 5, 3],
                                 prompt_control_flow=pcf, return_logits=True)
    out[f"generate_cf{pcf}/tokens"] = toks
    out[f"generate_cf{pcf}/logits"] = step_logits
  toks = generate(params, cfg, prompt, max_new_tokens=3, prefill="jacobi")
  out["generate_jacobi_prefill/tokens"] = toks
  return {f"{name}/{k}": np.asarray(v) for k, v in out.items()}


def reference_params(name, cfg):
  if isinstance(cfg.recurrence, LRTConfig):      # the release's init: feedback paths on
    return init_params(cfg, jax.random.PRNGKey(len(name)))
  return active_params(cfg, seed=len(name))


def compute_all(stored_params=None):
  """All outputs; parameters from `stored_params` ({name: flat dict}) when given."""
  tokens = np.asarray(jax.random.randint(jax.random.PRNGKey(3), (B, T), 0, 37), np.int32)
  arrays = {"tokens": tokens}
  for name, cfg in {**configs(), **lrt_configs()}.items():
    if stored_params is None:
      params = reference_params(name, cfg)
    else:
      params = traverse_util.unflatten_dict(
          {tuple(k.split("/")): jnp.asarray(v) for k, v in stored_params[name].items()})
    for k, v in traverse_util.flatten_dict(params, sep="/").items():
      arrays[f"params/{name}/{k}"] = np.asarray(v)
    run = compute_lrt if isinstance(cfg.recurrence, LRTConfig) else compute
    arrays.update(run(name, cfg, params, tokens))
  return arrays


def digest(a: np.ndarray) -> dict:
  """What identifies an array bit for bit (plus its max |x|, to say how far it moved)."""
  a = np.ascontiguousarray(a)
  return {"sha256": hashlib.sha256(a.tobytes()).hexdigest(), "dtype": str(a.dtype),
          "shape": list(a.shape),
          "max_abs": float(np.max(np.abs(a))) if a.size and a.dtype != bool else 0.0}


def outputs(arrays: dict) -> dict:
  """{key: digest} of the computed outputs (not the parameters or tokens)."""
  return {k: digest(v) for k, v in arrays.items() if not k.startswith("params/") and k != "tokens"}


def stored_params(npz):
  out = {}
  for key in npz:
    if key.startswith("params/"):
      _, name, rest = key.split("/", 2)
      out.setdefault(name, {})[rest] = npz[key]
  return out


if __name__ == "__main__":
  arrays = compute_all()
  np.savez_compressed(sys.argv[1] + ".npz", **{k: v for k, v in arrays.items()
                                               if k.startswith("params/") or k == "tokens"})
  with open(sys.argv[1] + ".json", "w") as f:
    json.dump(outputs(arrays), f, indent=1, sort_keys=True)
  print(f"wrote {sys.argv[1]}.npz and .json ({len(arrays)} arrays)")
