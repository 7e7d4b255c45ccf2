"""Make tests/golden/lrt_refine_official_small.{npz,json}: the official LRT release's
multi-refinement training (commit a133a67, `GPT.forward_multi_refine_train`) on the tiny
model of lrt_official_small.npz, computed by the release's own code (torch, CPU, float32).

    python tests/golden/make_lrt_refine_goldens.py /path/to/Latent_recurrent_transformer

The path is a checkout of the release at a133a67 (its nanochat/ package). The driver
changes the release's code in the two ways lrt_official_small's did, both about the rotary
table (kept in float32; the bfloat16 assertion dropped), by editing the module's source
text as it loads it, and nothing else. Every case runs on lrt_official_small's parameters,
tokens and targets (a133a67 adds no parameter); the gate-width-0 case replaces each
layer's `attn.triple_gate.weight` [6, 32] by a full-width [6, 64] one drawn N(0, 0.1).
Per case: the per-pass losses and total loss, each pass's logits (the loop of
`forward_multi_refine_train` replayed with `return_hidden`), and the gradient of the total
loss: whole for every 1-D parameter and the gates, as concat(G.sum(1), G.sum(0)) for the
other matrices (lrt_official_small's K/V-refresh convention, to keep the file small).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import types

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
BASE = "lrt_official_small"
OUT = "lrt_refine_official_small"
COMMIT = "a133a67ad39a723a852d8d5bd1008b3c99e7d3ce"
# (name, multi_refine_num_passes, loss weights, detach, gate width)
CASES = (("k2", 2, (), False, 32),
         ("k3", 3, (), False, 32),
         ("k2_weighted", 2, (0.1, 0.3, 0.6), False, 32),
         ("k2_detach", 2, (0.0, 0.0, 1.0), True, 32),
         ("k2_nodetach_last", 2, (0.0, 0.0, 1.0), False, 32),
         ("k2_width0", 2, (), False, 0))
WHOLE = ("lambdas", "triple_gate")     # gradients kept whole (the rest: row and column sums)


def load_gpt(root: str):
  """The release's nanochat.gpt with the float32 rotary table (its two lines edited)."""
  sys.path.insert(0, root)
  sys.modules.setdefault("nanochat.checkpoint_manager", types.ModuleType("checkpoint_manager"))
  path = os.path.join(root, "nanochat", "gpt.py")
  text = open(path).read()
  edits = {"cos, sin = cos.bfloat16(), sin.bfloat16() # keep them in bfloat16":
           "pass  # float32 rotary table (golden driver)",
           'assert self.cos.dtype == torch.bfloat16, "Rotary embeddings must be in bfloat16"':
           "pass  # float32 rotary table (golden driver)"}
  for old, new in edits.items():
    if text.count(old) != 1:
      raise SystemExit(f"{path}: expected one '{old[:40]}...': is it commit {COMMIT[:7]}?")
    text = text.replace(old, new)
  spec = importlib.util.spec_from_loader("nanochat.gpt", loader=None, origin=path)
  module = importlib.util.module_from_spec(spec)
  module.__file__ = path
  sys.modules["nanochat.gpt"] = module
  exec(compile(text, path, "exec"), module.__dict__)
  return module


def grad_entry(name: str, g: np.ndarray):
  if g.ndim == 1 or any(w in name for w in WHOLE):
    return g
  return np.concatenate([g.sum(1), g.sum(0)])


def run_case(gpt, base_cfg: dict, state: dict, tokens, targets, K, weights, detach, width,
             seed: int):
  cfg = dict(base_cfg, use_interleaved=False, use_multi_refine=True,
             multi_refine_num_passes=K, multi_refine_detach=detach,
             multi_refine_loss_weights=tuple(weights), ve_gate_channels=width)
  torch.manual_seed(0)
  model = gpt.GPT(gpt.GPTConfig(**cfg), pad_vocab_size_to=64)
  sd = {k: torch.tensor(v) for k, v in state.items()}
  if width == 0:
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
      if name.endswith("attn.triple_gate.weight"):
        sd[name] = torch.randn(p.shape, generator=g) * 0.1
  model.load_state_dict(sd, strict=True)
  model.float()
  model.cos, model.sin = model.cos.float(), model.sin.float()
  x, y = torch.tensor(tokens, dtype=torch.long), torch.tensor(targets, dtype=torch.long)
  out = model.forward_multi_refine_train(x, y)
  model.zero_grad()
  out["loss"].backward()
  grads = {n: p.grad.detach().numpy().copy() for n, p in model.named_parameters()
           if p.grad is not None}
  with torch.no_grad():     # each pass's logits: the release's loop, replayed
    logits, h_final = [], None
    for k in range(K + 1):
      h = model._make_zero_h_final(x).float() if k == 0 else model._shift_right(h_final)
      lk, h_final = model(x, None, h_final_prev=h, return_hidden=True)
      logits.append(lk.numpy())
  params = {n: p.detach().numpy().copy() for n, p in model.named_parameters()}
  return out, np.stack(logits), grads, params, cfg


def main(argv=None):
  argv = sys.argv[1:] if argv is None else argv
  if len(argv) != 1:
    raise SystemExit(__doc__)
  gpt = load_gpt(argv[0])
  torch.set_default_dtype(torch.float32)
  torch.use_deterministic_algorithms(True)
  base = dict(np.load(os.path.join(HERE, BASE + ".npz")))
  meta = json.load(open(os.path.join(HERE, BASE + ".json")))
  state = {e["name"]: base[e["name"]] for e in meta["state_dict"]}
  arrays = {"tokens": base["tokens"], "targets": base["targets"]}
  cases = {}
  for i, (name, K, weights, detach, width) in enumerate(CASES):
    out, logits, grads, params, cfg = run_case(gpt, meta["gpt_config"], state, base["tokens"],
                                               base["targets"], K, weights, detach, width,
                                               seed=meta["seed"] + 3000 + i)
    arrays[f"{name}/loss"] = np.float32(out["loss"].item())
    arrays[f"{name}/per_pass_losses"] = np.asarray([l.item() for l in out["per_pass_losses"]],
                                                   np.float32)
    arrays[f"{name}/pass_logits"] = logits.astype(np.float32)
    for n, g in grads.items():
      arrays[f"{name}/grad/{n}"] = grad_entry(n, g).astype(np.float32)
    if width == 0:
      for n, p in params.items():
        if n.endswith("attn.triple_gate.weight"):
          arrays[f"{name}/param/{n}"] = p
    cases[name] = {"gpt_config": {k: list(v) if isinstance(v, tuple) else v
                                  for k, v in cfg.items()},
                   "loss": float(out["loss"]), "per_pass_losses":
                   [float(l) for l in out["per_pass_losses"]]}
    print(name, cases[name]["per_pass_losses"], float(out["loss"]))
  np.savez_compressed(os.path.join(HERE, OUT + ".npz"), **arrays)
  doc = {"official_commit": COMMIT, "base": BASE, "torch": torch.__version__,
         "cases": cases, "whole_gradients": list(WHOLE),
         "gradient_sums": "concat(G.sum(1), G.sum(0)) for every other 2-D parameter",
         "changes_to_official_code": "the rotary table kept in float32 (two lines); the "
         "checkpoint_manager module stubbed (unused)"}
  with open(os.path.join(HERE, OUT + ".json"), "w") as f:
    json.dump(doc, f, indent=1)
    f.write("\n")


if __name__ == "__main__":
  main()
