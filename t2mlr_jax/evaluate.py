"""Evaluate a model and print/write metrics as JSON.

A training run (its task's held-out set, exact recurrence):

    python -m t2mlr_jax.evaluate --workdir=workdirs/s5 [--step=N]

A downstream benchmark, from a training workdir or a Hugging Face directory:

    python -m t2mlr_jax.evaluate --task=gsm8k --data=test.jsonl --model=DIR [--tokenizer=DIR]
        [--chat] [--max_new_tokens=512] [--batch_size=8] [--output=OUTDIR]
    python -m t2mlr_jax.evaluate --task=arc_easy --data=ARC-Easy-Test.jsonl --model=DIR

Bits per byte on a prepared dataset's held-out blocks (t2mlr_jax.data.prepare), in the
views parallel (recurrence off), the training view (Jacobi / interleaved) and exact:

    python -m t2mlr_jax.evaluate --task=bpb --data=DATA_DIR --model=DIR [--split=validation]
        [--blocks=256] [--mode=exact] [--batch_size=8] [--output=FILE.json]

Tasks: gsm8k, math500 (greedy generation; strict/flexible/### extraction, last
\\boxed{}), arc_easy, arc_challenge, hellaswag, piqa (log-likelihood; acc and
acc_norm). The summary is printed; with --output, summary.json and
predictions.jsonl (one line per example) are written there.
"""

import json
import os
import sys

from absl import app, flags

from t2mlr_jax import checkpoint, cli, loading, paths
from t2mlr_jax.data import lm, multiple_choice as mc, sft
from t2mlr_jax.data.pipeline import stack_batches
from t2mlr_jax.eval import downstream
from t2mlr_jax.eval.bpb import evaluate_bpb
from t2mlr_jax.model.modes import mode_names
from t2mlr_jax.train.checkpointer import Checkpointer
from t2mlr_jax.train.metrics import quiet_absl_logs
from t2mlr_jax.train.tasks import get_task, run_eval

_WORKDIR = flags.DEFINE_string("workdir", None, "training run directory (its task's eval set)")
_STEP = flags.DEFINE_integer("step", None, "checkpoint step (default: latest)")
_TASK = flags.DEFINE_string("task", None, "bpb (bits per byte on a prepared dataset) or a "
                            "downstream task: gsm8k, math500, arc_easy, arc_challenge, "
                            "hellaswag, piqa")
_DATA = flags.DEFINE_string("data", None, "local JSONL file of the downstream task, or the "
                            "prepared dataset directory for --task=bpb")
_SPLIT = flags.DEFINE_string("split", "validation", "--task=bpb: the dataset split")
_BLOCKS = flags.DEFINE_integer("blocks", None, "--task=bpb: blocks spread over the split "
                               "(default: all)")
_LABELS = flags.DEFINE_string("labels", None, "PIQA labels file (*-labels.lst), if separate")
_MODEL = flags.DEFINE_string("model", None, "Hugging Face directory, parameter export or training workdir")
_TOKENIZER = flags.DEFINE_string("tokenizer", None, "directory with tokenizer.json "
                                 "(default: --model)")
_OUTPUT = flags.DEFINE_string("output", None, "output file (--workdir) or directory (--task)")
_MODE = flags.DEFINE_string("mode", None,
                            "forward mode (default exact for --workdir; for --task=bpb every "
                            "view): parallel, exact or a training schedule (jacobi, "
                            "interleaved, chunked, multi_refine, or one a --user_module "
                            "registers). exact is the true recurrence; a training mode gives "
                            "its training view")
_CHAT = flags.DEFINE_bool("chat", False, "wrap prompts in the tokenizer's chat template")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 512, "generation length limit")
_BATCH = flags.DEFINE_integer("batch_size", 8, "prompts (or scoring requests) per batch")
_LIMIT = flags.DEFINE_integer("limit", None, "evaluate only the first N examples")
_PROMPT_CF = flags.DEFINE_integer("prompt_control_flow", 1, "1: prompt non-recurrent (SFT "
                                  "models, official generate); 2: recurrent (pretrained)")
_BOS = flags.DEFINE_bool("add_bos", False, "prepend the tokenizer's BOS token")


def evaluate_checkpoint(workdir, step=None, mode="exact") -> dict:
  """The training task's own evaluation of a workdir's checkpoint (latest step by default)
  in `mode`: {step, task, mode, **metrics}, the numbers the trainer logs."""
  ckpt = Checkpointer(workdir, read_only=True)
  step = ckpt.latest_step() if step is None else step
  ckpt.manager.close()
  if step is None:
    raise ValueError(f"no checkpoint found under {workdir}/checkpoints")
  config = checkpoint.load_config(workdir, step)
  cfg, params = checkpoint.load(workdir, step)
  task = get_task(config)
  results = run_eval(task, config, params, cfg, task.eval_batches(config), mode)
  return {"step": step, "task": config.data.task, "mode": mode, **results}


def _trained_tokenizer_hash(model: str):
  """The tokenizer hash of the prepared dataset a training workdir learned from (None
  when the model is not such a workdir or the dataset is not readable here)."""
  config_file = os.path.join(model, "config.json")
  if not os.path.isdir(os.path.join(model, "checkpoints")) or not os.path.isfile(config_file):
    return None
  with open(config_file) as f:
    data = json.load(f).get("data", {})
  if data.get("task") != "lm" or not data.get("path"):
    return None
  try:
    return lm.read_manifest(data["path"])["tokenizer"]["sha256"]
  except (ValueError, OSError):
    return None


def views_for(cfg) -> list[str]:
  """parallel, the training view and exact for a recurrent model; parallel otherwise."""
  rec = getattr(cfg, "recurrence", None)
  if rec is None:
    return ["parallel"]
  return ["parallel", rec.default_schedule, "exact"]


def evaluate_bpb_task(data: str, model: str, *, split: str = "validation",
                      blocks=None, modes=None, batch_size: int = 8) -> dict:
  """Bits per byte of a model on a prepared dataset's split, in each view."""
  manifest = lm.read_manifest(data)
  cfg, params = loading.load_model(model, field="--model")
  block, vocab = manifest["block_size"], manifest["tokenizer"]["vocab_size"]
  if block > cfg.max_seq_len:
    raise ValueError(f"--data block size {block} is larger than the model's max_seq_len="
                     f"{cfg.max_seq_len}")
  if vocab > cfg.vocab_size:
    raise ValueError(f"--data tokenizer has {vocab} tokens, the model only {cfg.vocab_size}")
  trained = _trained_tokenizer_hash(model)
  if trained is not None and trained != manifest["tokenizer"]["sha256"]:
    raise ValueError(f"--data {data!r} was tokenized with another tokenizer than the one "
                     f"{model!r} was trained with (sha256 {trained[:12]}…)")
  examples = lm.spread(lm.BlockSource(data, split), blocks)
  batches = stack_batches(examples, block, batch_size)
  token_bytes = lm.token_bytes(data)
  views = {m: evaluate_bpb(params, cfg, batches, token_bytes, mode=m)
           for m in (modes or views_for(cfg))}
  return {"data": data, "split": split, "blocks": len(examples), "views": views}


def evaluate_downstream(task, data, model, tokenizer_dir=None, *, limit=None, chat=False,
                        max_new_tokens=512, batch_size=8, prompt_control_flow=1,
                        add_bos=False, labels=None):
  """Score a model (any source `loading` opens) on a downstream task: generation
  tasks (GSM8K-style `###` answers) by greedy decoding, multiple-choice tasks by the
  summed log-likelihood of each choice. Returns the task's metrics dict."""
  cfg, params, found = loading.load_model_and_tokenizer(model, tokenizer=tokenizer_dir,
                                                        field="--model")
  tokenizer = found.tokenizer
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
  """`python -m t2mlr_jax.evaluate`: the flags above, results printed and written as JSON."""
  del argv
  quiet_absl_logs()
  if _MODE.value is not None and _MODE.value not in mode_names():
    raise ValueError(f"--mode={_MODE.value!r} is invalid: allowed one of {mode_names()}")
  if _TASK.value == "bpb":
    if not _DATA.value or not _MODEL.value:
      raise app.UsageError("--task=bpb needs --data and --model")
    results = evaluate_bpb_task(_DATA.value, _MODEL.value, split=_SPLIT.value,
                                blocks=_BLOCKS.value,
                                modes=[_MODE.value] if _MODE.value else None,
                                batch_size=_BATCH.value)
    if _OUTPUT.value:
      paths.write_text(_OUTPUT.value, json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))
    _wrote(_OUTPUT.value)
    return
  if _TASK.value:
    if not _DATA.value or not _MODEL.value:
      raise app.UsageError("--task needs --data and --model")
    summary, per_example = evaluate_downstream(
        _TASK.value, _DATA.value, _MODEL.value, _TOKENIZER.value, limit=_LIMIT.value,
        chat=_CHAT.value, max_new_tokens=_MAX_NEW.value, batch_size=_BATCH.value,
        prompt_control_flow=_PROMPT_CF.value, add_bos=_BOS.value, labels=_LABELS.value)
    if _OUTPUT.value:
      out = paths.resolve(_OUTPUT.value)
      out.mkdir(parents=True, exist_ok=True)
      paths.write_text(out / "summary.json", json.dumps(summary, indent=2))
      paths.write_text(out / "predictions.jsonl",
                       "".join(json.dumps(row) + "\n" for row in per_example))
    print(json.dumps(summary, indent=2))
    if _OUTPUT.value:
      _wrote(f"{out / 'summary.json'} and {out / 'predictions.jsonl'}")
    return
  if not _WORKDIR.value:
    if _MODEL.value or _DATA.value:
      raise app.UsageError(f"--model/--data need --task: allowed bpb, "
                           f"{', '.join(downstream.GENERATION_TASKS + downstream.MC_TASKS)}")
    raise app.UsageError("give --workdir (a training run) or --task/--data/--model")
  results = evaluate_checkpoint(_WORKDIR.value, _STEP.value, _MODE.value or "exact")
  out = _OUTPUT.value or paths.resolve(_WORKDIR.value) / f"eval_step{results['step']}.json"
  paths.write_text(out, json.dumps(results, indent=2))
  print(json.dumps(results, indent=2))
  _wrote(out)


def _wrote(where) -> None:
  """Where the results went (stderr: stdout stays the JSON alone)."""
  if where:
    print(f"wrote {where}", file=sys.stderr)


if __name__ == "__main__":
  cli.run(main)
