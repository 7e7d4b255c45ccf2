"""Writes mixers_official_small.{npz,json}: what the official release's own mixing modules
(princeton-pli/T2MLR, src/t2mlr_wrapper/t2mlr_gate_zoo.py) compute in torch on CPU for
each case below (fp32 parameters and inputs, computed in float64): the output and the
gradients of sum(out ⊙ cot) w.r.t. h, the state and every parameter
(tests/model/test_mixers.py checks them).

    python tests/golden/make_mixer_goldens.py /path/to/T2MLR/src/t2mlr_wrapper

The release's file is imported from the given folder at generation time only.
"""

import importlib.util
import json
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
RELEASE_COMMIT = "4510e811cab5209f99b57318e233ece840a032ba"
B, T, D = 2, 3, 8

# name -> (release module, release constructor kwargs, our mixer_options, fixed parameters)
CASES = {
    "none": ("none", {}, {}, {}),
    "constant_weight": ("constant_weight", dict(recurrent_alpha=0.3, use_learnable_gate=True),
                        dict(recurrent_alpha=0.3, use_learnable_gate=True),
                        {"recurrent_alpha": [0.3]}),
    "constant_weight_fixed": ("constant_weight", dict(recurrent_alpha=0.7,
                                                      use_learnable_gate=False),
                              dict(recurrent_alpha=0.7), {}),
    "concat": ("concat", dict(use_recurrent_projection=True),
               dict(use_recurrent_projection=True), {}),
    "gated": ("gated", dict(use_recurrent_projection=True, use_learnable_recurrent_gate=True,
                            use_learnable_input_gate=True, recurrent_gate_init=0.5,
                            input_gate_init=0.5, gate_weight_init_std=1.0), {},
              {"rezero_gamma_recurrent_gate": [0.9], "rezero_gamma_input_gate": [0.4]}),
    "gated_mlp": ("gated", dict(
        use_recurrent_projection=True, recurrent_state_proj_type="mlp",
        recurrent_projection_dim=4, recurrent_state_mlp_num_layers=3,
        recurrent_state_mlp_activation="silu", use_learnable_recurrent_gate=True,
        use_learnable_input_gate=True, gate_proj_type="mlp", gate_mlp_hidden_dim=6,
        gate_mlp_num_layers=3, gate_mlp_activation="tanh", normalize_gates=True,
        recurrent_gate_input_detach=True, rezero_gamma_scalar=False), dict(
        recurrent_state_proj_type="mlp", recurrent_projection_dim=4,
        recurrent_state_mlp_num_layers=3, recurrent_state_mlp_activation="silu",
        gate_proj_type="mlp", gate_mlp_hidden_dim=6, gate_mlp_num_layers=3,
        gate_mlp_activation="tanh", normalize_gates=True, recurrent_gate_input_detach=True,
        rezero_gamma_scalar=False), {"recurrent_projection.scaling": 0.7}),
    "gated_fixed_gate": ("gated", dict(
        use_learnable_recurrent_gate=False, use_learnable_input_gate=True,
        use_rezero_residual=False, gate_input_detach=True), dict(
        use_recurrent_projection=False, use_learnable_recurrent_gate=False,
        use_rezero_residual=False, gate_input_detach=True), {}),
    "var_norm_gated": ("var_norm_gated", dict(use_learnable_gate=True,
                                              use_recurrent_projection=True),
                       dict(use_learnable_gate=True, use_recurrent_projection=True),
                       {"rezero_gamma": [0.6]}),
    "alpha_coupled": ("alpha_coupled", dict(
        use_learnable_gate=True, gate_proj_type="mlp", gate_mlp_num_layers=2,
        gate_mlp_activation="relu", gate_input_detach=True, rezero_gamma_scalar=False),
        dict(use_learnable_gate=True, gate_proj_type="mlp", gate_mlp_num_layers=2,
             gate_mlp_activation="relu", gate_input_detach=True, rezero_gamma_scalar=False),
        {}),
    "alpha_coupled_fixed": ("alpha_coupled", {}, {}, {"rezero_gamma": [0.5]}),
    "gated_norms": ("gated", dict(
        use_recurrent_projection=True, use_learnable_recurrent_gate=True,
        use_learnable_input_gate=True, pre_norm_streams=True, post_norm=True,
        post_norm_clamp=1.5), dict(pre_norm_streams=True, post_norm=True, post_norm_clamp=1.5),
        {"rezero_gamma_recurrent_gate": [0.9], "rezero_gamma_input_gate": [0.4]}),
    "alpha_coupled_norms": ("alpha_coupled", dict(
        use_learnable_gate=True, pre_norm_streams=True, pre_norm_type="layernorm",
        post_norm=True), dict(use_learnable_gate=True, pre_norm_streams=True,
                              pre_norm_type="layernorm", post_norm=True), {}),
    "concat_norms": ("concat", dict(pre_norm_streams=True), dict(pre_norm_streams=True), {}),
    "constant_weight_norms": ("constant_weight", dict(
        recurrent_alpha=0.4, use_learnable_gate=False, pre_norm_streams=True,
        pre_norm_type="layernorm"), dict(recurrent_alpha=0.4, pre_norm_streams=True,
                                        pre_norm_type="layernorm"), {}),
    "exponential_rotational_gated": ("exponential_rotational_gated", {}, {}, {}),
    "exponential_rotational_gated_norms": ("exponential_rotational_gated", dict(
        pre_norm_streams=True, post_norm=True, post_norm_clamp=2.0),
        dict(pre_norm_streams=True, post_norm=True, post_norm_clamp=2.0), {}),
    "exponential_rotational_gated_concat": ("exponential_rotational_gated", dict(
        concat_recurrent=True, exponential_rotational_gate_input_gate_input_detach=True),
        dict(concat_recurrent=True, exponential_rotational_gate_input_gate_input_detach=True),
        {}),
}


def load_zoo(folder: str):
  spec = importlib.util.spec_from_file_location("t2mlr_gate_zoo",
                                                os.path.join(folder, "t2mlr_gate_zoo.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def run_case(zoo, case: str, seed: int) -> dict:
  name, kwargs, _, fixed = CASES[case]
  torch.manual_seed(seed)
  module = zoo.get_t2mlr_mixing_module_class(name)(hidden_size=D, **kwargs).float()
  with torch.no_grad():
    for pname, p in module.named_parameters():      # every path active
      p.add_(0.3 * torch.randn_like(p))
      if pname in fixed:
        p.copy_(torch.tensor(fixed[pname], dtype=torch.float32).reshape(p.shape))
  # the fp32 parameters and inputs, computed in float64 (see tests/golden/README.md)
  module = module.double()
  h = torch.randn(B, T, D).double().requires_grad_(True)
  prev = (1.5 * torch.randn(B, T, D)).double().requires_grad_(True)
  cot = torch.randn(B, T, D).double()
  out, _ = module(h, prev)
  params = dict(module.named_parameters())
  grads = torch.autograd.grad((out * cot).sum(), [h, prev] + list(params.values()),
                              allow_unused=True)
  zero = torch.zeros(B, T, D, dtype=torch.float64)
  arrays = {"h": h, "prev": prev, "cot": cot, "out": out,
            "grad_h": zero if grads[0] is None else grads[0],
            "grad_prev": zero if grads[1] is None else grads[1]}
  arrays.update({f"param/{k}": v for k, v in params.items()})
  arrays.update({f"grad/{k}": (g if g is not None else torch.zeros_like(params[k]))
                 for k, g in zip(params, grads[2:])})
  return {f"{case}/{k}": v.detach().numpy().astype(np.float32) for k, v in arrays.items()}


def main(folder: str) -> None:
  zoo = load_zoo(folder)
  arrays, meta = {}, {"release_commit": RELEASE_COMMIT, "shape": [B, T, D], "cases": {}}
  for seed, case in enumerate(CASES):
    arrays.update(run_case(zoo, case, seed))
    name, kwargs, options, _ = CASES[case]
    meta["cases"][case] = {"mixer": name, "release_kwargs": kwargs, "mixer_options": options}
  np.savez_compressed(os.path.join(HERE, "mixers_official_small.npz"), **arrays)
  with open(os.path.join(HERE, "mixers_official_small.json"), "w") as f:
    json.dump(meta, f, indent=1)


if __name__ == "__main__":
  main(sys.argv[1])
