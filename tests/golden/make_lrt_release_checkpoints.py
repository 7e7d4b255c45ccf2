"""Make tests/golden/lrt_release_checkpoints/: checkpoints written the way the official LRT
release (commit a133a67) writes them, by its own model code (torch, CPU, float32), and its
own evaluation of them.

    python tests/golden/make_lrt_release_checkpoints.py /path/to/Latent_recurrent_transformer

The path is a checkout of the release at a133a67. Two tiny models (2 layers, d_model 32,
vocabulary 61 padded to 64, T 16), one per schedule: `multi_refine` (use_multi_refine,
K = 2, equal weights, gate width 0 = full width: the release's defaults) and `interleaved`
(use_interleaved, S = 2, gate width 16). Each is built by `GPT.init_weights`, trained 3 steps
by torch AdamW on random tokens through the release's own training forward
(`forward_multi_refine_train` / `forward_interleaved_train`), and saved as
`scripts/base_train.py` saves: `model_000003.pt` (the raw `state_dict()`) and
`meta_000003.json` (step, val_bpb, model_config = the GPTConfig keyword arguments, ...),
the files `nanochat/checkpoint_manager.save_checkpoint` writes (its module is not imported:
it needs the release's tokenizer packages). The optimizer state is not kept.

Then the release's `nanochat/loss_eval.py` scores each on one held-out batch (eval.npz:
tokens, targets, token_bytes with 0 bytes for token 0): `evaluate_bpb` (BPB of the last
pass and every pass's: multi-refine passes over all positions, interleaved passes at their
own positions) and `evaluate_bpb_sequential(mode="recurrent")` (token by token with the
KV cache, the exact recurrence). The rotary table is kept in float32 (the two lines
make_lrt_refine_goldens.py edits) and checkpoint_manager is stubbed (unused); nothing else
of the release's code is changed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "lrt_release_checkpoints")
STEP = 3
BASE = dict(sequence_len=16, vocab_size=61, n_layer=2, n_head=2, n_kv_head=2, n_embd=32,
            window_pattern="SL", use_value_embeds=True, ve_every_layer=False,
            use_x0_residual=True, use_resid_lambdas=True, interleaved_kv_refresh=False,
            multi_refine_detach=False, multi_refine_loss_weights=())
MODELS = {
    "multi_refine": dict(BASE, ve_gate_channels=0, use_interleaved=False,
                         interleaved_num_passes=2, use_multi_refine=True,
                         multi_refine_num_passes=2),
    "interleaved": dict(BASE, ve_gate_channels=16, use_interleaved=True,
                        interleaved_num_passes=2, use_multi_refine=False,
                        multi_refine_num_passes=2),
}


def _refine_driver():
  spec = importlib.util.spec_from_file_location(
      "make_lrt_refine_goldens", os.path.join(HERE, "make_lrt_refine_goldens.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _json_config(cfg: dict) -> dict:
  return {k: list(v) if isinstance(v, tuple) else v for k, v in cfg.items()}


@torch.no_grad()
def sequential_logits(model, x) -> np.ndarray:
  """[B, T, V] logits of the release's token-by-token recurrence: the loop of its
  `evaluate_bpb_sequential(mode="recurrent")` (KV cache, h_final of t−1 fed to t), kept."""
  from nanochat.engine import KVCache
  c = model.config
  B, T = x.shape
  cache = KVCache(B, c.n_kv_head, T, c.n_embd // c.n_head, c.n_layer, x.device, torch.float32)
  h = torch.zeros(B, 1, c.n_embd)
  out = []
  for t in range(T):
    logits, h = model(x[:, t:t + 1], kv_cache=cache, h_final_prev=h, pass_idx=int(t > 0),
                      return_hidden=True)
    out.append(logits[:, 0].numpy())
  return np.stack(out, axis=1)


def make(gpt, loss_eval, name: str, cfg: dict, seed: int, eval_batch) -> dict:
  torch.manual_seed(seed)
  model = gpt.GPT(gpt.GPTConfig(**cfg), pad_vocab_size_to=64)
  model.init_weights()
  model.float()
  model.cos, model.sin = model.cos.float(), model.sin.float()
  train = (model.forward_multi_refine_train if cfg["use_multi_refine"]
           else model.forward_interleaved_train)
  opt = torch.optim.AdamW(model.parameters(), lr=3e-2, betas=(0.9, 0.95), weight_decay=0.0)
  g = torch.Generator().manual_seed(seed + 1)
  model.train()
  for _ in range(STEP):
    x = torch.randint(1, cfg["vocab_size"], (4, cfg["sequence_len"]), generator=g)
    y = torch.randint(1, cfg["vocab_size"], (4, cfg["sequence_len"]), generator=g)
    opt.zero_grad()
    train(x, y)["loss"].backward()
    opt.step()
  model.eval()
  x, y, token_bytes = eval_batch
  result = loss_eval.evaluate_bpb(model, [(x, y)], 1, token_bytes)
  sequential = loss_eval.evaluate_bpb_sequential(model, [(x, y)], 1, token_bytes,
                                                 mode="recurrent")
  directory = os.path.join(OUT, name)
  os.makedirs(directory, exist_ok=True)
  torch.save(model.state_dict(), os.path.join(directory, f"model_{STEP:06d}.pt"))
  meta = {"step": STEP, "val_bpb": result["bpb"], "model_config": _json_config(cfg),
          "user_config": {"note": "tests/golden/make_lrt_release_checkpoints.py"},
          "device_batch_size": 4, "max_seq_len": cfg["sequence_len"],
          "dataloader_state_dict": None,
          "loop_state": {"min_val_bpb": result["bpb"], "smooth_train_loss": None,
                         "total_training_time": 0.0}}
  with open(os.path.join(directory, f"meta_{STEP:06d}.json"), "w", encoding="utf-8") as f:
    json.dump(meta, f, indent=2)
  return {"bpb": result["bpb"], "per_pass_bpb": result["per_pass_bpb"],
          "sequential_bpb": sequential["bpb"]}, sequential_logits(model, x)


def main(argv=None):
  argv = sys.argv[1:] if argv is None else argv
  if len(argv) != 1:
    raise SystemExit(__doc__)
  gpt = _refine_driver().load_gpt(argv[0])
  # nanochat.engine (the KV cache of the sequential evaluation) imports load_model from the
  # checkpoint_manager the refine driver stubs; it is not called
  sys.modules["nanochat.checkpoint_manager"].load_model = None
  import nanochat.loss_eval as loss_eval  # the release's, on sys.path after load_gpt
  torch.set_default_dtype(torch.float32)
  torch.use_deterministic_algorithms(True)
  g = torch.Generator().manual_seed(7)
  T, V = BASE["sequence_len"], BASE["vocab_size"]
  x = torch.randint(0, V, (3, T), generator=g)
  y = torch.randint(0, V, (3, T), generator=g)
  y[0, :2] = -1                                  # ignored targets
  token_bytes = torch.randint(1, 5, (64,), generator=g)
  token_bytes[0] = 0                             # a special token: no bytes
  results, logits = {}, {}
  for i, (name, cfg) in enumerate(MODELS.items()):
    results[name], logits[f"{name}/sequential_logits"] = make(
        gpt, loss_eval, name, cfg, seed=11 + i, eval_batch=(x, y, token_bytes))
  np.savez_compressed(os.path.join(OUT, "eval.npz"), tokens=x.numpy().astype(np.int32),
                      targets=y.numpy().astype(np.int32),
                      token_bytes=token_bytes.numpy().astype(np.int32),
                      **{k: v.astype(np.float32) for k, v in logits.items()})
  doc = {"official_commit": _refine_driver().COMMIT, "torch": torch.__version__,
         "step": STEP, "results": results,
         "changes_to_official_code": "the rotary table kept in float32 (two lines)"}
  with open(os.path.join(OUT, "release_eval.json"), "w") as f:
    json.dump(doc, f, indent=1)
  print(json.dumps(results, indent=1))


if __name__ == "__main__":
  main()
