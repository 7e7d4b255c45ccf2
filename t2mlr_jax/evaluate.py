"""Evaluate a model and print/write metrics as JSON.

A training run (its task's held-out set, exact recurrence):

    python -m t2mlr_jax.evaluate --workdir=workdirs/s5 [--step=N]

A downstream benchmark, from a training workdir or a Hugging Face directory:

    python -m t2mlr_jax.evaluate --task=gsm8k --data=test.jsonl --model=DIR [--tokenizer=DIR]
        [--chat] [--max_new_tokens=512] [--batch_size=8] [--output=OUTDIR]
    python -m t2mlr_jax.evaluate --task=arc_easy --data=ARC-Easy-Test.jsonl --model=DIR

Tasks: gsm8k, math500 (greedy generation; strict/flexible/### extraction, last
\\boxed{}), arc_easy, arc_challenge, hellaswag, piqa (log-likelihood; acc and
acc_norm). The summary is printed; with --output, summary.json and
predictions.jsonl (one line per example) are written there.
"""

import json
import os

from absl import app, flags

from t2mlr_jax.model.modes import MODES

_WORKDIR = flags.DEFINE_string("workdir", None, "training run directory (its task's eval set)")
_STEP = flags.DEFINE_integer("step", None, "checkpoint step (default: latest)")
_TASK = flags.DEFINE_string("task", None, "downstream task: gsm8k, math500, arc_easy, "
                            "arc_challenge, hellaswag, piqa")
_DATA = flags.DEFINE_string("data", None, "local JSONL file of the downstream task")
_LABELS = flags.DEFINE_string("labels", None, "PIQA labels file (*-labels.lst), if separate")
_MODEL = flags.DEFINE_string("model", None, "Hugging Face directory or training workdir")
_TOKENIZER = flags.DEFINE_string("tokenizer", None, "directory with tokenizer.json "
                                 "(default: --model)")
_OUTPUT = flags.DEFINE_string("output", None, "output file (--workdir) or directory (--task)")
_MODE = flags.DEFINE_enum("mode", "exact", list(MODES),
                          "forward mode for --workdir evaluation (exact is the true recurrence; "
                          "a training mode gives its training view)")
_CHAT = flags.DEFINE_bool("chat", False, "wrap prompts in the tokenizer's chat template")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 512, "generation length limit")
_BATCH = flags.DEFINE_integer("batch_size", 8, "prompts (or scoring requests) per batch")
_LIMIT = flags.DEFINE_integer("limit", None, "evaluate only the first N examples")
_PROMPT_CF = flags.DEFINE_integer("prompt_control_flow", 1, "1: prompt non-recurrent (SFT "
                                  "models, official generate); 2: recurrent (pretrained)")
_BOS = flags.DEFINE_bool("add_bos", False, "prepend the tokenizer's BOS token")


def evaluate_checkpoint(workdir, step=None, mode="exact") -> dict:
  from t2mlr_jax import checkpoint
  from t2mlr_jax.eval.runner import evaluate
  from t2mlr_jax.train.tasks import get_task
  ckpt = checkpoint.Checkpointer(workdir, read_only=True)
  step = ckpt.latest_step() if step is None else step
  ckpt.manager.close()
  if step is None:
    raise ValueError(f"no checkpoint found under {workdir}/checkpoints")
  config = checkpoint.load_config(workdir, step)
  cfg, params = checkpoint.load(workdir, step)
  task = get_task(config)
  results = evaluate(params, cfg, task.eval_batches(config), task.metrics, mode=mode)
  return {"step": step, "task": config.data.task, "mode": mode, **results}


def load_model(path: str):
  """(cfg, params) from a Hugging Face directory or a training workdir."""
  from t2mlr_jax import checkpoint
  from t2mlr_jax.convert import hf
  if os.path.isfile(os.path.join(path, "config.json")) and not os.path.isdir(
      os.path.join(path, "checkpoints")):
    return hf.from_hf(path)
  return checkpoint.load(path)


def evaluate_downstream(task, data, model, tokenizer_dir=None, *, limit=None, chat=False,
                        max_new_tokens=512, batch_size=8, prompt_control_flow=1,
                        add_bos=False, labels=None):
  from t2mlr_jax.data import multiple_choice as mc
  from t2mlr_jax.data import sft
  from t2mlr_jax.data.tokenizer import load_tokenizer
  from t2mlr_jax.eval import downstream
  tokenizer = load_tokenizer(tokenizer_dir or model)
  cfg, params = load_model(model)
  if task in downstream.GENERATION_TASKS:
    records = sft.read_records(data)[:limit]   # JSONL or tfds:NAME:SPLIT
    return downstream.evaluate_generation(
        task, params, cfg, tokenizer, records, chat=chat, max_new_tokens=max_new_tokens,
        batch_size=batch_size, prompt_control_flow=prompt_control_flow, add_bos=add_bos)
  if task in downstream.MC_TASKS:
    kwargs = {"labels_path": labels} if task == "piqa" and labels else {}
    examples = mc.read_task(task, data, **kwargs)[:limit]
    return downstream.evaluate_multiple_choice(task, params, cfg, tokenizer, examples,
                                               add_bos=add_bos, batch_size=batch_size)
  raise ValueError(f"--task={task!r} is invalid: allowed "
                   f"{downstream.GENERATION_TASKS + downstream.MC_TASKS}")


def main(argv):
  del argv
  from t2mlr_jax.train.metrics import quiet_absl_logs
  quiet_absl_logs()
  if _TASK.value:
    if not _DATA.value or not _MODEL.value:
      raise app.UsageError("--task needs --data and --model")
    summary, per_example = evaluate_downstream(
        _TASK.value, _DATA.value, _MODEL.value, _TOKENIZER.value, limit=_LIMIT.value,
        chat=_CHAT.value, max_new_tokens=_MAX_NEW.value, batch_size=_BATCH.value,
        prompt_control_flow=_PROMPT_CF.value, add_bos=_BOS.value, labels=_LABELS.value)
    if _OUTPUT.value:
      os.makedirs(_OUTPUT.value, exist_ok=True)
      with open(os.path.join(_OUTPUT.value, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
      with open(os.path.join(_OUTPUT.value, "predictions.jsonl"), "w") as f:
        for row in per_example:
          f.write(json.dumps(row) + "\n")
    print(json.dumps(summary, indent=2))
    return
  if not _WORKDIR.value:
    raise app.UsageError("give --workdir (a training run) or --task/--data/--model")
  results = evaluate_checkpoint(_WORKDIR.value, _STEP.value, _MODE.value)
  out = _OUTPUT.value or os.path.join(_WORKDIR.value, f"eval_step{results['step']}.json")
  with open(out, "w") as f:
    json.dump(results, f, indent=2)
  print(json.dumps(results, indent=2))


if __name__ == "__main__":
  app.run(main)
