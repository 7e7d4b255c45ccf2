"""Future-token prediction probe (the T2MLR paper's Appendix B; the release's
src/train_medusa.py): how much a frozen model's last hidden state says about tokens further
ahead than the next one, T2MLR against its plain twin on the same data.

K heads read the backbone's final hidden state (the last layer's output, before the final
norm: the release's default `hidden_layer_index=-1`) under the exact recurrence; head k
predicts the token at offset k + 2 (t+2 .. t+K+1). A head is linear (`--head_layers=1`) or
an MLP with SiLU (`--head_layers=2`, hidden d_model). Heads train with AdamW on the
checkpoint's own task data (the training task's source, features computed once: the backbone
is frozen) where the token at that offset is supervised, and are scored on the task's
held-out batches: per-offset cross-entropy and accuracy.

    python experiments/future_token_probe.py --workdir=workdirs/s5 --name=t2mlr
    python experiments/future_token_probe.py --workdir=workdirs/s5_transformer --name=transformer
    python experiments/future_token_probe.py --table

Results accumulate in experiments/results/future_token_probe.json (one record per name,
written when the run ends). Ours differs from the release where noted: features under the
exact recurrence (the release reads them under its batch Jacobi forward), and the MLP head's
residual is not offered (the release's `use_residual_connection` is never applied in its
forward).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as bc  # noqa: E402

RESULTS = "future_token_probe.json"


def offset_targets(target_ids, offset: int):
  """The token at t + offset for each position t ([B, T]; -100 where it is not supervised
  or past the end): target_ids[t] holds the token at t + 1."""
  import numpy as np
  tgt = np.asarray(target_ids)
  out = np.full_like(tgt, -100)
  shift = offset - 1
  if shift < tgt.shape[1]:
    out[:, :tgt.shape[1] - shift] = tgt[:, shift:]
  return out


def features(params, cfg, batches, mode: str = "exact"):
  """[(hidden [B, T, D] float32, target_ids [B, T]) ...] of the frozen backbone."""
  import jax
  import numpy as np

  from t2mlr_jax.model.modes import hidden_states
  run = jax.jit(lambda p, b: hidden_states(p, cfg, b["input_ids"], mode=mode,
                                           control_flow=b["control_flow"])[0])
  return [(np.asarray(run(params, {k: b[k] for k in ("input_ids", "control_flow")}),
                      np.float32), np.asarray(b["target_ids"])) for b in batches]


def init_heads(rng, d_model: int, vocab: int, num_heads: int, head_layers: int):
  """One linear map (or a SiLU MLP of hidden d_model) per offset."""
  import jax
  import jax.numpy as jnp
  keys = jax.random.split(rng, num_heads * head_layers)
  scale = d_model ** -0.5

  def dense(k, n_in, n_out):
    return {"w": jax.random.normal(k, (n_in, n_out), jnp.float32) * scale,
            "b": jnp.zeros((n_out,), jnp.float32)}
  heads = []
  for h in range(num_heads):
    ks = keys[h * head_layers:(h + 1) * head_layers]
    layers = [dense(k, d_model, d_model) for k in ks[:-1]] + [dense(ks[-1], d_model, vocab)]
    heads.append(layers)
  return heads


def head_logits(layers, x):
  import jax
  for layer in layers[:-1]:
    x = jax.nn.silu(x @ layer["w"] + layer["b"])
  return x @ layers[-1]["w"] + layers[-1]["b"]


def head_loss(layers, x, targets):
  """(summed cross-entropy, right predictions, supervised count) of one head on one batch."""
  import jax.numpy as jnp
  import optax
  logits = head_logits(layers, x)
  mask = targets >= 0
  nll = optax.softmax_cross_entropy_with_integer_labels(logits, jnp.where(mask, targets, 0))
  right = (jnp.argmax(logits, -1) == targets) & mask
  return jnp.sum(nll * mask), jnp.sum(right), jnp.sum(mask)


def train_heads(feats, vocab: int, *, num_heads: int, head_layers: int, steps: int,
                lr: float, seed: int):
  """Heads fitted on cached features (batches cycled), AdamW with cosine decay."""
  import jax
  import jax.numpy as jnp
  import optax
  d_model = feats[0][0].shape[-1]
  heads = init_heads(jax.random.PRNGKey(seed), d_model, vocab, num_heads, head_layers)
  tx = optax.adamw(optax.cosine_decay_schedule(lr, steps), weight_decay=0.0)
  opt = tx.init(heads)
  targets = [[offset_targets(t, k + 2) for k in range(num_heads)] for _, t in feats]

  @jax.jit
  def step(heads, opt, x, tgts):
    def loss_fn(hs):
      total = 0.0
      for layers, t in zip(hs, tgts):
        s, _, n = head_loss(layers, x, t)
        total = total + s / jnp.maximum(n, 1)
      return total
    loss, grads = jax.value_and_grad(loss_fn)(heads)
    updates, opt = tx.update(grads, opt, heads)
    return optax.apply_updates(heads, updates), opt, loss

  for i in range(steps):
    x, _ = feats[i % len(feats)]
    heads, opt, _ = step(heads, opt, x, targets[i % len(feats)])
  return heads


def score_heads(heads, feats) -> dict:
  """{offset: {loss, acc, tokens}} on held-out features."""
  import jax
  score = jax.jit(head_loss)
  out = {}
  for k, layers in enumerate(heads):
    s = r = n = 0.0
    for x, t in feats:
      a, b, c = score(layers, x, offset_targets(t, k + 2))
      s, r, n = s + float(a), r + float(b), n + float(c)
    out[str(k + 2)] = {"loss": s / max(n, 1), "acc": r / max(n, 1), "tokens": int(n)}
  return out


def probe(workdir: str, *, num_heads: int = 4, head_layers: int = 1, steps: int = 500,
          train_batches: int = 16, lr: float = 3e-3, seed: int = 0, mode: str = "exact",
          step=None) -> dict:
  """The probe of one training run's checkpoint (`step`, the latest by default) on its own
  task's data."""
  from t2mlr_jax import checkpoint
  from t2mlr_jax.data import pipeline
  from t2mlr_jax.train import tasks
  config = checkpoint.load_config(workdir)
  if step is None and not checkpoint.is_export(workdir):
    step = max(checkpoint.saved_steps(workdir), default=None)
  cfg, params = checkpoint.load(workdir, step)[:2]
  task = tasks.get_task(config)
  batch = config.train.batch_size
  src = task.train_source(config, batch * train_batches)
  examples = [src[i] for i in range(batch * train_batches)]
  seq_len = max(len(ex["input_ids"]) for ex in examples)
  train = pipeline.stack_batches(examples, seq_len, batch)
  started = time.time()
  heads = train_heads(features(params, cfg, train, mode), cfg.vocab_size, num_heads=num_heads,
                      head_layers=head_layers, steps=steps, lr=lr, seed=seed)
  held_out = features(params, cfg, task.eval_batches(config), mode)
  return {"workdir": workdir, "step": step, "task": config.data.task, "params": cfg.num_params(),
          "recurrence": config.model.recurrence.get("type"),
          "heads": num_heads, "head_layers": head_layers, "steps": steps,
          "train_examples": len(examples), "mode": mode, "offsets": score_heads(heads, held_out),
          "wall_s": round(time.time() - started, 1), "commit": bc.git_commit(),
          "date": time.strftime("%Y-%m-%d")}


def table(results: dict) -> str:
  """One row per probed run: held-out accuracy (and loss) per offset."""
  runs = results.get("runs", {})
  if not runs:
    return "(no runs recorded yet)"
  offsets = sorted({o for r in runs.values() for o in r["offsets"]}, key=int)
  lines = ["| run | task | params | " + " | ".join(f"t+{o} acc (loss)" for o in offsets) + " |",
           "|---|---|---|" + "---|" * len(offsets)]
  for name, r in runs.items():
    cells = " | ".join(f"{r['offsets'][o]['acc']:.3f} ({r['offsets'][o]['loss']:.2f})"
                       if o in r["offsets"] else "—" for o in offsets)
    lines.append(f"| {name} | {r['task']} | {r['params'] / 1e6:.2f}M | {cells} |")
  return "\n".join(lines)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--workdir", help="a training run (its latest checkpoint is probed)")
  p.add_argument("--step", type=int, default=None,
                 help="the checkpoint's step (the latest: unset), to probe runs at one budget")
  p.add_argument("--name", help="the record's name (default: the workdir's basename)")
  p.add_argument("--heads", type=int, default=4, help="offsets 2..heads+1")
  p.add_argument("--head_layers", type=int, default=1, choices=(1, 2))
  p.add_argument("--steps", type=int, default=500)
  p.add_argument("--train_batches", type=int, default=16)
  p.add_argument("--lr", type=float, default=3e-3)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--out", default=RESULTS)
  p.add_argument("--table", action="store_true", help="print the recorded table and exit")
  args = p.parse_args(argv)
  if args.table:
    print(table(bc.read_json(args.out, default={"runs": {}})))
    return
  if not args.workdir:
    p.error("--workdir is required (a training run), or --table")
  if args.heads < 1:
    p.error(f"--heads={args.heads} is invalid: allowed integers >= 1")
  record = probe(args.workdir, num_heads=args.heads, head_layers=args.head_layers,
                 steps=args.steps, train_batches=args.train_batches, lr=args.lr, seed=args.seed,
                 step=args.step)
  results = bc.read_json(args.out, default={"runs": {}})
  results["runs"][args.name or os.path.basename(os.path.normpath(args.workdir))] = record
  bc.write_json(args.out, results)
  print(table(results))


if __name__ == "__main__":
  main()
