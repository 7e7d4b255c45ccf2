"""Writes options_official_small.{npz,json}: what the official release's T2MLR wrapper
(princeton-pli/T2MLR, src/t2mlr_wrapper, unmodified, imported from a checkout at
generation time only) computes on the tiny random Llama of t2mlr_official_small under
each recurrence option of the cases below: exact logits (its token-by-token
exact_sequence_recurrent_forward), Jacobi logits (batch_approximate_forward) at two depths,
and the Jacobi loss with its gradient (the mixer's in full, the base model's vectors in
full and its matrices as row and column sums, to keep the file small; the base model's
weights are stored once, `base/param/`) (tests/model/test_golden.py
checks ours against them, the options read from each case's settings by
`convert.official.settings_from_official`).

    python tests/golden/make_option_goldens.py /path/to/T2MLR [COMMIT]

torch on CPU, fp32. With transformers 5.x the base config's use_cache is False (the
release's Jacobi path filters the old cache kwarg names from the captured layer kwargs;
5.24 renamed it). Two import shims: components.t2mlr_utils (not shipped; rcot_utils
defines the imported function, unused here) and IPython (imported, never called).
"""

import dataclasses
import json
import os
import subprocess
import sys
import types

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "experiments"))
from bench_official import import_official  # noqa: E402  (the release with its two shims)

L_START, L_END = 2, 3
B, T = 2, 8
DEPTHS = ((2, 1), (8, 2))          # (D_f, D_b) of the Jacobi logits
GRAD_DEPTH = (3, 2)               # of the loss and its gradient
MIXER = "t2mlr_mixing_module."
BASE = dict(vocab_size=61, hidden_size=48, num_hidden_layers=5, num_attention_heads=6,
            num_key_value_heads=3, intermediate_size=96, rope_theta=50000.0,
            tie_word_embeddings=True, max_position_embeddings=128, rms_norm_eps=1e-5,
            hidden_act="silu", attention_bias=False, mlp_bias=False, bos_token_id=1,
            eos_token_id=2)
# the gated mixer with a projection and learnable gates (the paper's Φ), no cache options
GATED = dict(t2mlr_enabled=True, recurrent_mixing_module_name="gated",
             use_recurrent_projection=True, use_learnable_gate=True,
             use_learnable_recurrent_gate=True, use_learnable_input_gate=True,
             recurrent_gate_init=0.5, input_gate_init=0.5, gate_weight_init_std=1.0)
S5_CACHE = dict(recurrent_residual_to_recurrent_cache=True,
                recurrent_residual_to_recurrent_cache_detach=True,
                recurrent_residual_to_recurrent_cache_post_norm=True)
# Why both rows share the non-recurrent prompt: the release's exact mode decides per step,
# for the whole batch, whether the cache residual applies (any row recurrent at that step).
FINDING = ("In the release's exact_sequence_recurrent_forward a row at a non-recurrent "
           "position gets the cache residual (and its post-norm) in its state when another "
           "row of the batch is recurrent at that step, so a row's logits depend on the other "
           "rows' control flow; its batch (Jacobi) path and ours decide per row. The cases "
           "here give every row the same control flow, where the two agree.")
CASES = {
    "connection_detach": dict(GATED, **S5_CACHE, connection_detach=True),
    "raw_cache": dict(GATED),
    "residual_weighted": dict(
        GATED, recurrent_residual_to_recurrent_cache=True,
        recurrent_residual_to_recurrent_cache_weight=0.5,
        recurrent_residual_to_recurrent_cache_post_norm=True,
        recurrent_residual_to_recurrent_cache_post_norm_eps=1e-5,
        recurrent_residual_to_recurrent_cache_post_norm_clamp=2.0),
    "skip_to_l_end": dict(
        GATED, recurrent_skip_to_l_end=True, recurrent_skip_to_l_end_weight=0.7,
        recurrent_skip_to_l_end_post_norm=True, recurrent_skip_to_l_end_post_norm_clamp=2.0),
    "skip_detached": dict(GATED, recurrent_skip_to_l_end=True,
                          recurrent_skip_to_l_end_detach=True),
    "fixed_recurrent_weight": dict(GATED, **S5_CACHE, use_learnable_recurrent_gate=False,
                                   recurrent_weight=0.3),
    "alpha_coupled_cache": dict(t2mlr_enabled=True, recurrent_mixing_module_name="alpha_coupled",
                                use_learnable_gate=True, **S5_CACHE),
}


def main(repo: str, commit=None):
  import torch
  import torch.nn.functional as F
  import transformers
  T2MLRWrapper = import_official(repo)
  commit = commit or subprocess.run(["git", "-C", repo, "rev-parse", "HEAD"],
                                    capture_output=True, text=True).stdout.strip() or "unknown"
  rng = np.random.RandomState(0)
  ids = torch.as_tensor(rng.randint(0, BASE["vocab_size"], (B, T)), dtype=torch.long)
  cf = torch.full_like(ids, 2)
  cf[:, :3] = 1                                  # a non-recurrent prompt of 3 tokens (see FINDING)
  arrays = {"input_ids": ids.numpy().astype(np.int32), "control_flows": cf.numpy().astype(np.int32)}
  meta = {"finding": FINDING, "release_commit": commit, "base_config": BASE, "l_start": L_START, "l_end": L_END,
          "depths": DEPTHS, "grad_depth": GRAD_DEPTH, "cases": {},
          "versions": {"torch": torch.__version__, "transformers": transformers.__version__}}
  for name, settings in CASES.items():
    torch.manual_seed(4321)
    hf_cfg = transformers.LlamaConfig(**BASE, use_cache=False, attn_implementation="eager")
    base = transformers.LlamaForCausalLM(hf_cfg).float()
    full = dict(settings, l_start=L_START, l_end=L_END, batch_forward=True,
                batch_forward_approximate_depth=GRAD_DEPTH[0],
                batch_backward_approximate_depth=GRAD_DEPTH[1])
    model = T2MLRWrapper.from_base_model(base, types.SimpleNamespace(**_with_defaults(full)))
    mixer = model.layers[L_START].t2mlr_mixing_module
    with torch.no_grad():                        # every mixer path active
      for p in mixer.parameters():
        p.add_(0.3 * torch.randn_like(p))
    sd = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    for k, v in sd.items():
      if MIXER in k:
        arrays[f"{name}/param/{k}"] = v
      elif f"base/param/{k}" in arrays:          # the same base model in every case
        assert np.array_equal(arrays[f"base/param/{k}"], v), k
      else:
        arrays[f"base/param/{k}"] = v
    model.eval()
    model.config.batch_forward = False
    with torch.no_grad():
      arrays[f"{name}/exact_logits"] = model(input_ids=ids, control_flows=cf).logits.numpy()
    model.train()
    model.config.batch_forward = True
    for d_f, d_b in DEPTHS:
      model.config.batch_forward_approximate_depth = d_f
      model.config.batch_backward_approximate_depth = d_b
      with torch.no_grad():
        arrays[f"{name}/jacobi_logits_Df{d_f}_Db{d_b}"] = model(
            input_ids=ids, control_flows=cf).logits.numpy()
    model.config.batch_forward_approximate_depth, model.config.batch_backward_approximate_depth = \
        GRAD_DEPTH
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=ids, control_flows=cf).logits
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
    loss.backward()
    arrays[f"{name}/loss"] = np.float32(loss.item())
    for k, p in model.named_parameters():
      if p.grad is None:
        continue
      g = p.grad.numpy().copy()
      if MIXER in k or g.ndim < 2:
        arrays[f"{name}/grad/{k}"] = g
      else:                                      # a base matrix: its row and column sums
        arrays[f"{name}/grad_sums/{k}"] = np.concatenate([g.sum(1), g.sum(0)])
    meta["cases"][name] = settings
    print(name, float(loss), flush=True)
  np.savez_compressed(os.path.join(HERE, "options_official_small.npz"), **arrays)
  with open(os.path.join(HERE, "options_official_small.json"), "w") as f:
    json.dump(meta, f, indent=1)
    f.write("\n")


def _with_defaults(settings: dict) -> dict:
  """The release's T2MLRSettings defaults under the given settings (the wrapper reads its
  settings as attributes; `from_base_model` takes any namespace)."""
  from t2mlr_wrapper.t2mlr_config import T2MLRSettings  # the release, at generation time
  return {**{f.name: f.default for f in dataclasses.fields(T2MLRSettings)
             if f.default is not dataclasses.MISSING}, **settings}


if __name__ == "__main__":
  main(*sys.argv[1:3])
