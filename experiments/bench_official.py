"""Our Jacobi training step against the official PyTorch T2MLR release's, side by side.

    python experiments/bench_official.py --official_repo=/tmp/t2mlr_official \
        --official_commit=4510e811cab5209f99b57318e233ece840a032ba

One process, one batch, the same weights: the official release (princeton-pli/T2MLR,
imported at run time from --official_repo, never copied here) builds a random
SmolLM2-135M-shaped Llama (transformers' LlamaForCausalLM) wrapped by its T2MLRWrapper
on layers 13..18 (inclusive) with the S5 settings that tests/golden/README.md records
(gated mixer, W_rec projection, learnable gates, residual cache, detached, clipped RMS
norm) and γ_rec = γ_cur = 0.5 (raw, as bench_train's step part). Its state dict is
mapped to our parameters by `t2mlr_jax.convert.official.from_official`.

Each side runs its Jacobi training step — forward with D_f sweeps, D_b of them carrying
gradient, next-token cross-entropy, backward — on batch 1 × T 256 tokens, fp32, every
position recurrent (control flow 2), no jacobi_tol (every sweep runs):

  official: T2MLRWrapper.forward in train() mode (batch_approximate_forward) then the
            loss of its trainer (CrossEntropyLoss on logits[:, :-1] vs ids[:, 1:]) and
            loss.backward(), torch with --threads threads;
  ours:     jit(value_and_grad) of cross_entropy(forward(mode="jacobi"), next tokens).

The losses (and a few gradients) are compared, then both steps are timed alternately
(bench_common.alternate) and the medians written to experiments/results/--out.

The official snapshot needs two import shims (as for the golden outputs): it imports
components.t2mlr_utils, which it does not ship (components.rcot_utils defines the
imported function, unused on this path), and IPython (imported, never called). With
transformers 5.x the base config's use_cache must be False: batch_approximate_forward
filters `past_key_values` from the captured layer kwargs, which 5.x renamed `cache`, so a
KV cache created by the first pass would leak into the middle-block re-runs.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as bc  # noqa: E402

SHAPE = "smollm2-135m"
L_START, L_END = 13, 18          # inclusive
BATCH, SEQ_LEN = 1, 256

# The S5 settings of the golden outputs (tests/golden/t2mlr_official_small.json), which
# are our T2MLRConfig defaults (residual cache, detached, clipped RMS norm, gates at 0.5).
OFFICIAL_SETTINGS = dict(
    t2mlr_enabled=True, recurrent_mixing_module_name="gated", recurrent_weight=0.5,
    connection_detach=False, use_recurrent_projection=True, recurrent_projection_dim=None,
    recurrent_state_proj_type="auto", use_learnable_gate=True,
    use_learnable_recurrent_gate=True, use_learnable_input_gate=True,
    recurrent_gate_init=0.5, input_gate_init=0.5, gate_weight_init_std=1.0,
    gate_proj_type="linear", normalize_gates=False, pre_norm_streams=False, post_norm=False,
    recurrent_residual_to_recurrent_cache=True,
    recurrent_residual_to_recurrent_cache_weight=1.0,
    recurrent_residual_to_recurrent_cache_detach=True,
    recurrent_residual_to_recurrent_cache_post_norm=True,
    recurrent_residual_to_recurrent_cache_post_norm_eps=1e-6,
    recurrent_residual_to_recurrent_cache_post_norm_clamp=5.0,
    recurrent_skip_to_l_end=False, mixing_module_kwargs=None,
    bfa_gradient_checkpointing=False, bfa_memory_efficient_cache=False)


def import_official(repo: str):
  """T2MLRWrapper from the official checkout (its src/ on sys.path), with the two shims."""
  src = os.path.join(repo, "src")
  if not os.path.isfile(os.path.join(src, "t2mlr_wrapper", "t2mlr_wrapper.py")):
    raise SystemExit(f"--official_repo={repo!r}: no src/t2mlr_wrapper/t2mlr_wrapper.py there")
  sys.path.insert(0, src)
  if importlib.util.find_spec("IPython") is None:
    stub = types.ModuleType("IPython")
    stub.embed = lambda *a, **k: None
    sys.modules["IPython"] = stub
  import components
  if importlib.util.find_spec("components.t2mlr_utils") is None:
    import components.rcot_utils as utils
    sys.modules["components.t2mlr_utils"] = utils
    components.t2mlr_utils = utils
  from t2mlr_wrapper import T2MLRWrapper
  return T2MLRWrapper


def official_commit(repo: str, given):
  if given:
    return given
  try:
    return subprocess.check_output(["git", "-C", repo, "rev-parse", "HEAD"], text=True,
                                   stderr=subprocess.DEVNULL).strip()
  except Exception:  # an exported tree
    return "unknown (pass --official_commit)"


def official_flops(cfg, d_f, d_b):
  """Matmul FLOPs of the official step by the same cost model as t2mlr_jax.flops.

  Forward: a full plain pass (all layers + head), D_f - 1 middle-block passes with the
  mixer, a final full pass with the mixer. Gradient: the final full pass, the last D_b
  middle passes, and the lower layers of the first pass once more (the middle passes
  re-use its l_start input without detaching it)."""
  from t2mlr_jax import flops as F
  tokens = BATCH * SEQ_LEN
  layer = F.layer_flops(cfg, BATCH, SEQ_LEN)
  head, mix = F.head_flops(cfg, tokens), F.mixer_flops(cfg, tokens)
  n_mid = L_END - L_START + 1
  full = cfg.n_layers * layer + head
  fwd = full + (d_f - 1) * (n_mid * layer + mix) + full + mix
  n_grad = min(d_b, d_f - 1)
  with_grad = full + mix + n_grad * (n_mid * layer + mix) + L_START * layer
  return fwd + 2 * with_grad


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--official_repo", required=True, help="checkout of princeton-pli/T2MLR")
  p.add_argument("--official_commit", default=None,
                 help="its commit (read with git when the checkout has .git)")
  p.add_argument("--repeats", type=int, default=5)
  p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
  p.add_argument("--d_forward", type=int, default=16)
  p.add_argument("--d_backward", type=int, default=4)
  p.add_argument("--gamma", type=float, default=0.5, help="raw γ_rec = γ_cur")
  p.add_argument("--attn", default="sdpa", choices=("sdpa", "eager"),
                 help="transformers attention implementation of the official model")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--out", default="bench_official.json")
  args = p.parse_args()

  T2MLRWrapper = import_official(args.official_repo)
  import jax
  import numpy as np
  import torch
  import torch.nn.functional as TF
  import transformers

  from t2mlr_jax import ModelConfig, T2MLRConfig
  from t2mlr_jax.convert.hf import config_to_hf
  from t2mlr_jax.convert.official import from_official
  from t2mlr_jax.flops import train_step_flops

  from bench_train import loss_and_grad

  torch.set_num_threads(args.threads)
  torch.manual_seed(args.seed)
  rec = T2MLRConfig(l_start=L_START, l_end=L_END)
  options = dict(d_forward=args.d_forward, d_backward=args.d_backward, jacobi_tol=None)
  preset = ModelConfig.preset(SHAPE, recurrence=rec, schedule_options=options)
  print("preset:", preset, flush=True)

  # ---- the official model, random init, γ set
  hf_dict = config_to_hf(preset)
  hf_cfg = transformers.LlamaConfig(
      **{k: v for k, v in hf_dict.items() if k not in ("architectures", "torch_dtype")},
      use_cache=False,                          # see the module docstring (transformers 5.x)
      attn_implementation=args.attn)
  base = transformers.LlamaForCausalLM(hf_cfg).float()
  settings = types.SimpleNamespace(
      **OFFICIAL_SETTINGS, l_start=L_START, l_end=L_END, batch_forward=True,
      batch_forward_approximate_depth=args.d_forward,
      batch_backward_approximate_depth=args.d_backward)
  model = T2MLRWrapper.from_base_model(base, settings)
  mixer = model.layers[L_START].t2mlr_mixing_module
  with torch.no_grad():
    mixer.rezero_gamma_recurrent_gate.fill_(args.gamma)
    mixer.rezero_gamma_input_gate.fill_(args.gamma)
  model.train()                                 # config.batch_forward = True: the Jacobi path
  assert model.config.batch_forward and model.l_start == L_START and model.l_end == L_END
  assert model.config.batch_forward_approximate_depth == args.d_forward
  assert model.config.batch_backward_approximate_depth == args.d_backward
  n_official = sum(t.numel() for t in model.parameters())

  # ---- the same weights on our side
  sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
  cfg, params = from_official(sd, {**hf_dict}, l_start=L_START, l_end=L_END,
                              schedule_options=options)
  diff = {k: (getattr(cfg, k), getattr(preset, k)) for k in preset.__dataclass_fields__
          if getattr(cfg, k) != getattr(preset, k)}
  if diff:
    raise SystemExit(f"converted config differs from the preset: {diff}")
  params = jax.device_put(params)

  tokens = np.random.RandomState(args.seed).randint(0, cfg.vocab_size,
                                                    (BATCH, SEQ_LEN)).astype(np.int32)
  ids = torch.as_tensor(tokens, dtype=torch.long)
  cf = torch.full_like(ids, 2)                  # every position recurrent

  ours = loss_and_grad(cfg, "jacobi")           # jit(value_and_grad), labels = next tokens

  def official_step():
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, control_flows=cf)
    logits = out.logits
    loss = TF.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                            ids[:, 1:].reshape(-1))
    loss.backward()
    return loss.detach()

  # ---- one step each: losses and gradients
  (loss_ours, aux), grads = jax.block_until_ready(ours(params, tokens))
  loss_off = float(official_step())
  grads = jax.device_get(grads)
  named = dict(model.named_parameters())
  mix = f"t2mlr_model.model.layers.{L_START}.t2mlr_mixing_module."
  lay = lambda i: (f"t2mlr_model.model.layers.{i}.model." if i == L_START
                   else f"t2mlr_model.model.layers.{i}.")
  pairs = {
      "gamma_rec": (grads["recurrence"]["gamma_rec"], mix + "rezero_gamma_recurrent_gate"),
      "gamma_cur": (grads["recurrence"]["gamma_cur"], mix + "rezero_gamma_input_gate"),
      "w_rec": (grads["recurrence"]["w_rec"]["kernel"].T, mix + "recurrent_projection.weight"),
      "f_rec": (grads["recurrence"]["f_rec"]["kernel"].T, mix + "recurrent_gate_proj.weight"),
      "f_cur_bias": (grads["recurrence"]["f_cur"]["bias"], mix + "input_gate_proj.bias"),
      "embed (tied)": (grads["embed"]["embedding"], "t2mlr_model.model.embed_tokens.weight"),
      "final_norm": (grads["final_norm"]["scale"], "t2mlr_model.model.norm.weight"),
  }
  for i in (0, L_START - 1, L_START, L_END, cfg.n_layers - 1):
    pairs[f"layer{i}.q"] = (grads["layers"]["attn"]["q"]["kernel"][i].T,
                            lay(i) + "self_attn.q_proj.weight")
    pairs[f"layer{i}.down"] = (grads["layers"]["mlp"]["down"]["kernel"][i].T,
                               lay(i) + "mlp.down_proj.weight")
  grad_check = {}
  for name, (g_ours, key) in pairs.items():
    g_ref = named[key].grad.detach().numpy()
    g_ours = np.asarray(g_ours, np.float32).reshape(g_ref.shape)
    scale = float(np.max(np.abs(g_ref)))
    grad_check[name] = {"max_abs_ref": scale,
                        "max_abs_diff": float(np.max(np.abs(g_ours - g_ref))),
                        "rel": float(np.max(np.abs(g_ours - g_ref)) / max(scale, 1e-30))}
  loss_ours = float(loss_ours)
  with torch.no_grad():                         # the recurrence must move the loss
    plain = model(input_ids=ids, control_flows=torch.ones_like(ids)).logits
    loss_plain = float(TF.cross_entropy(plain[:, :-1].reshape(-1, plain.shape[-1]),
                                        ids[:, 1:].reshape(-1)))
  model.zero_grad(set_to_none=True)
  print(f"loss ours {loss_ours:.7f} official {loss_off:.7f} |diff| "
        f"{abs(loss_ours - loss_off):.2e}; sweeps {int(aux['jacobi_sweeps'])}", flush=True)
  print("worst gradient rel diff:",
        max(grad_check.items(), key=lambda kv: kv[1]["rel"]), flush=True)

  # ---- timing, alternated
  official_step()                               # a second warm-up run of torch
  times = bc.alternate({"ours": lambda: ours(params, tokens), "official": official_step},
                       args.repeats)
  med = {k: bc.median(v) for k, v in times.items()}
  f_ours = train_step_flops(cfg, BATCH, SEQ_LEN, "jacobi", schedule_options=dict(
      d_forward=args.d_forward, d_backward=args.d_backward))
  f_off = official_flops(cfg, args.d_forward, args.d_backward)
  result = {
      "shape": SHAPE, "batch": BATCH, "seq_len": SEQ_LEN, "dtype": "float32",
      "l_start": L_START, "l_end": L_END, "d_forward": args.d_forward,
      "d_backward": args.d_backward, "jacobi_tol": None, "gamma_raw": args.gamma,
      "control_flow": "all 2 (every position recurrent)", "params": cfg.num_params(),
      "official_params": n_official, "repeats": args.repeats,
      "official": {"repo": "princeton-pli/T2MLR",
                   "commit": official_commit(args.official_repo, args.official_commit),
                   "torch": torch.__version__, "transformers": transformers.__version__,
                   "torch_threads": torch.get_num_threads(), "attn_implementation": args.attn,
                   "use_cache": False, "settings": OFFICIAL_SETTINGS},
      "loss": {"ours": loss_ours, "official": loss_off,
               "abs_diff": abs(loss_ours - loss_off),
               "official_plain_no_recurrence": loss_plain},
      "jacobi_sweeps_ours": int(aux["jacobi_sweeps"]),
      "grad_check": grad_check,
      "ms_per_step": {k: round(v * 1e3, 1) for k, v in med.items()},
      "ours_over_official": round(med["ours"] / med["official"], 3),
      "gflops_per_step": {"ours": round(f_ours / 1e9, 1), "official": round(f_off / 1e9, 1)},
      "gflops_per_s": {"ours": round(f_ours / med["ours"] / 1e9, 1),
                       "official": round(f_off / med["official"] / 1e9, 1)},
      "what_each_computes": {
          "ours": ("jit(value_and_grad): layers 0..12 once; sweep 0 = plain middle block "
                   "13..18 (its raw output, shifted, is the first cache; no gradient since "
                   "D_b < D_f); D_f-1-D_b middle sweeps without gradient (stop-gradient "
                   "inputs and weights); D_b middle sweeps with gradient; final middle pass "
                   "with the mixer, layers 19..29, head; CE over T-1 next tokens. FLOPs "
                   "from t2mlr_jax.flops.train_step_flops."),
          "official": ("T2MLRWrapper.batch_approximate_forward in train mode: a full plain "
                       "forward (all 30 layers and the LM head; layer 13's input and layer "
                       "18's output captured by hooks), D_f-1 re-runs of layers 13..18 with "
                       "the mixer (all under autograd; caches detached when more than D_b "
                       "sweeps remain), then a full forward again (layers 0..12 recomputed) "
                       "with the last cache; the trainer's CE on logits[:, :-1] vs "
                       "ids[:, 1:]; loss.backward(). Gradients reach layers 0..12 twice "
                       "(through the final pass and through the non-detached layer-13 input "
                       "of the first pass). FLOPs by the same cost model (official_flops)."),
      },
      "raw_seconds": {k: [round(x, 4) for x in v] for k, v in times.items()},
  }
  path = bc.write_json(args.out, result)
  print({k: v for k, v in result.items() if k not in ("raw_seconds", "what_each_computes",
                                                      "grad_check", "official")}, flush=True)
  print("wrote", path)


if __name__ == "__main__":
  main()
