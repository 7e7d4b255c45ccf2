"""T2MLR and LRT outputs on tiny models, computed by the public API, for a refactor guard.

`tests/fixtures/t2mlr_reference.npz` holds the parameters and tokens, and
`t2mlr_reference.json` a fingerprint of every output (SHA-256 digest, dtype, shape, max |x|,
L2 norm and four fixed random projections): the logits, aux, losses and gradients of every
mode plus generate. `test_t2mlr_reference.py` recomputes them with today's code from the
stored parameters. XLA:CPU compiles for the host's vector units, so the last digits differ
between machines: an output whose digest moved must keep its norm and projections within
`RTOL` of its norm, above the margin measured when the fixture is made (`margins`: the same
outputs compiled for AVX and SSE4.2) and below what a 1e-3 change of one weight does.
Bit-for-bit equality is asked with T2MLR_REFERENCE_BITWISE=1 (a refactor meant to keep
every bit: regenerate on your machine first, refactor, compare).

The numbers guard two refactors: T2MLR's were fixed before the recurrence interface
(commit 9fc3e0d), LRT's before the schedules shared it (commit 5f36796). The digests made
then turned out to hold only on that session's machine; the fingerprints were remade on
2026-12-02 from the same stored parameters, with the code of commit 7dcb733 (the fixture's
own commit) and of today giving the same bits on the new machine.

Regenerate (only when a change is meant to move the numbers; keeps the stored parameters):
    python tests/_t2mlr_reference.py tests/fixtures/t2mlr_reference
"""

import hashlib
import json
import os
import subprocess
import sys
import time
import zlib

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
      "residual": ModelConfig(**base, recurrence=T2MLRConfig(l_start=1, l_end=2),
                              schedule_options=dict(d_forward=4, d_backward=2)),
      "raw_nope": ModelConfig(**{**base, "rope_theta": None}, recurrence=T2MLRConfig(
          l_start=0, l_end=-2, residual=False), schedule_options=dict(d_forward=5, d_backward=2)),
      "remat": ModelConfig(**base, remat="full", recurrence=T2MLRConfig(
          l_start=1, l_end=-1, cache_norm="rmsnorm"),
          schedule_options=dict(d_forward=6, d_backward=3)),
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
      "lrt_layerwise": ModelConfig(**base, recurrence=LRTConfig(source_layer=-1, gate_channels=16),
                                   schedule_options=dict(passes=2, refine_passes=2)),
      "lrt_shared_nanochat": ModelConfig(
          **base, **nanochat,
          recurrence=LRTConfig(source_layer=1, projection="shared", gate_channels=8),
          schedule_options=dict(passes=3, kv_refresh=True, refine_passes=3,
                                refine_weights=(1.0, 0.5, 0.5, 2.0))),
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


# Outputs whose digest moved must keep norm and projections within RTOL x max(norm,
# NORM_FLOOR). Made on an AVX2 host, the outputs compiled for AVX / SSE4.2 move by at most
# the fixture's `margins` (about 4e-6); scaling the MLP's down-projections by 1 + 1e-3
# moves a large share of them beyond RTOL (also in `margins`). The floor: outputs that are
# rounding noise by construction (a converged Jacobi residual, 7e-9) or tiny gradients
# (3.8e-4) are compared in absolute terms, not to their own norm.
RTOL = 1e-4
NORM_FLOOR = 1e-3
N_PROJ = 4


def _projections(key: str, a: np.ndarray) -> list:
  """N_PROJ dot products of the flattened array with fixed N(0, 1) vectors seeded by `key`."""
  rng = np.random.default_rng(zlib.crc32(key.encode()))
  flat = np.asarray(a, np.float64).ravel()
  return [float(rng.standard_normal(flat.size) @ flat) for _ in range(N_PROJ)]


def fingerprint(key: str, a: np.ndarray) -> dict:
  """What identifies an array bit for bit (digest), and what compares it to a tolerance
  (norm, projections; max |x| says how far it moved)."""
  a = np.ascontiguousarray(a)
  numeric = a.size and a.dtype != bool
  return {"sha256": hashlib.sha256(a.tobytes()).hexdigest(), "dtype": str(a.dtype),
          "shape": list(a.shape),
          "max_abs": float(np.max(np.abs(a))) if numeric else 0.0,
          "norm": float(np.linalg.norm(np.asarray(a, np.float64))) if numeric else 0.0,
          "proj": _projections(key, a) if numeric else []}


def outputs(arrays: dict) -> dict:
  """{key: fingerprint} of the computed outputs (not the parameters or tokens)."""
  return {k: fingerprint(k, v) for k, v in arrays.items()
          if not k.startswith("params/") and k != "tokens"}


def relative_change(expected: dict, got: dict) -> float:
  """max(|Δnorm|, max |Δprojection|) / max(norm, NORM_FLOOR) between two fingerprints (0
  if bitwise equal; inf if dtype or shape differ, or an integer output changed at all)."""
  if got["sha256"] == expected["sha256"]:
    return 0.0
  if (got["dtype"], got["shape"]) != (expected["dtype"], expected["shape"]):
    return float("inf")
  if not np.issubdtype(np.dtype(expected["dtype"]), np.floating):
    return float("inf")        # token ids, counts: equal or wrong
  scale = max(expected["norm"], NORM_FLOOR)
  deltas = [abs(got["norm"] - expected["norm"])]
  deltas += [abs(g - e) for g, e in zip(got["proj"], expected["proj"])]
  return max(deltas) / scale


def stored_params(npz):
  out = {}
  for key in npz:
    if key.startswith("params/"):
      _, name, rest = key.split("/", 2)
      out.setdefault(name, {})[rest] = npz[key]
  return out


def _fingerprints_in_subprocesses(prefix: str, xla_flags: list) -> list:
  """The outputs' fingerprints computed by other processes (concurrently), each with one
  more XLA flag."""
  procs = []
  for i, flag in enumerate(xla_flags):
    env = dict(os.environ)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + flag).strip()
    out = f"{prefix}.tmp{i}.json"
    procs.append((out, subprocess.Popen(
        [sys.executable, __file__, "--fingerprints-only", prefix, out], env=env)))
  got = []
  for out, proc in procs:
    if proc.wait() != 0:
      raise RuntimeError(f"computing {out} failed")
    with open(out) as f:
      got.append(json.load(f))
    os.remove(out)
  return got


def _machine() -> dict:
  sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
      __file__))), "experiments"))
  from s5_default_job import machine
  return machine()


def _max_change(expected: dict, got: dict) -> float:
  return max(relative_change(expected[k], got[k]) for k in expected)


def main(prefix: str):
  """(Re)make the fixture: fingerprints from the stored parameters (new ones if none), and
  the margins that justify RTOL."""
  stored = stored_params(dict(np.load(prefix + ".npz"))) if os.path.exists(prefix + ".npz") \
      else None
  arrays = compute_all(stored)
  prints = outputs(arrays)
  isas = ("AVX", "SSE4_2")
  others = _fingerprints_in_subprocesses(prefix, [f"--xla_cpu_max_isa={i}" for i in isas])
  margins = {f"xla_cpu_max_isa={i}": _max_change(prints, o) for i, o in zip(isas, others)}
  # A change the guard must catch: each model's MLP down-projections scaled by 1 + 1e-3.
  bumped = {name: {k: v * np.float32(1.001) if k.endswith("mlp/down/kernel") else v
                   for k, v in p.items()} for name, p in stored_params(arrays).items()}
  moved = outputs(compute_all(bumped))
  margins["mlp/down/kernel x (1 + 1e-3): outputs beyond rtol"] = sum(
      relative_change(prints[k], moved[k]) > RTOL for k in prints)
  if stored is None:
    np.savez_compressed(prefix + ".npz", **{k: v for k, v in arrays.items()
                                            if k.startswith("params/") or k == "tokens"})
  with open(prefix + ".json", "w") as f:
    json.dump({"rtol": RTOL, "margins": margins,
               "made": {"date": time.strftime("%Y-%m-%d"), **_machine(),
                        "jax": jax.__version__},
               "outputs": prints}, f, indent=1, sort_keys=True)
  print(json.dumps(margins, indent=1))


if __name__ == "__main__":
  if sys.argv[1] == "--fingerprints-only":
    with open(sys.argv[3], "w") as f:
      json.dump(outputs(compute_all(stored_params(dict(np.load(sys.argv[2] + ".npz"))))), f)
  else:
    main(sys.argv[1])
