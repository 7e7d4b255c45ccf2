"""Evaluate a model and print/write metrics as JSON.

A training run (its task's held-out set, exact recurrence):

    python -m t2mlr_jax.evaluate --workdir=workdirs/s5 [--step=N]

A downstream benchmark, from a training workdir or a Hugging Face directory:

    python -m t2mlr_jax.evaluate --task=gsm8k --data=test.jsonl --model=DIR [--tokenizer=DIR]
        [--chat] [--max_new_tokens=512] [--batch_size=8] [--output=OUTDIR]
    python -m t2mlr_jax.evaluate --task=arc_easy --data=ARC-Easy-Test.jsonl --model=DIR

Bits per byte on a prepared dataset's held-out blocks (t2mlr_jax.data.prepare), in the
modes parallel (recurrence off), the training mode (Jacobi / interleaved) and exact:

    python -m t2mlr_jax.evaluate --task=bpb --data=DATA_DIR --model=DIR [--split=validation]
        [--blocks=256] [--mode=exact] [--batch_size=8] [--output=FILE.json]

Tasks: gsm8k, math500 (greedy generation; strict/flexible/### extraction, last
\\boxed{}), hotpotqa (greedy generation on the public JSON files, e.g.
hotpot_dev_distractor_v1.json; the official EM and F1), prosqa (greedy generation on
Coconut's prosqa_test.json or data.prosqa's JSONL; answer_acc, path_valid_acc), arc_easy, arc_challenge, hellaswag, piqa (log-likelihood; acc and
acc_norm). The summary is printed; with --output, summary.json and
predictions.jsonl (one line per example) are written there.
"""

import json
import sys

from absl import app, flags

from t2mlr_jax import cli, paths

_WORKDIR = flags.DEFINE_string("workdir", None, "training run directory (its task's eval set)")
_STEP = flags.DEFINE_integer("step", None, "checkpoint step (default: latest)")
_TASK = flags.DEFINE_string("task", None, "bpb (bits per byte on a prepared dataset) or a "
                            "downstream task: gsm8k, math500, hotpotqa, prosqa, arc_easy, "
                            "arc_challenge, hellaswag, piqa")
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
                            "evaluation mode, or a comma-separated list): parallel, exact or a "
                            "training schedule (jacobi, interleaved, chunked, multi_refine, or "
                            "one a --user_module registers). exact is the true recurrence; a "
                            "training mode gives its training schedule's forward "
                            "(multi_refine: bits per byte of every pass too)")
_CHAT = flags.DEFINE_bool("chat", False, "wrap prompts in the tokenizer's chat template")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 512, "generation length limit")
_BATCH = flags.DEFINE_integer("batch_size", 8, "prompts (or scoring requests) per batch")
_LIMIT = flags.DEFINE_integer("limit", None, "evaluate only the first N examples")
_PROMPT_CF = flags.DEFINE_integer("prompt_control_flow", 1, "1: prompt non-recurrent (SFT "
                                  "models, official generate); 2: recurrent (pretrained)")
_BOS = flags.DEFINE_bool("add_bos", False, "prepend the tokenizer's BOS token")


def main(argv):
  """`python -m t2mlr_jax.evaluate`: the flags above, results printed and written as JSON."""
  del argv
  if _TASK.value and (not _DATA.value or not _MODEL.value):
    raise app.UsageError(f"--task={_TASK.value} needs --data and --model")
  if not (_TASK.value or _WORKDIR.value or _MODEL.value or _DATA.value):
    raise app.UsageError("give --workdir (a training run) or --task/--data/--model")
  if _WORKDIR.value and not _TASK.value:
    cli.check_step(_WORKDIR.value, _STEP.value)
  # the library (and JAX) load once the flags parse: argument errors print at once
  from t2mlr_jax.eval import downstream, jobs
  from t2mlr_jax.model.modes import mode_names
  from t2mlr_jax.train import tasks
  cli.quiet_absl_logs()
  modes = [m for m in (_MODE.value or "").split(",") if m] or None
  if modes and (any(m not in mode_names() for m in modes)
                or (len(modes) > 1 and _TASK.value != "bpb")):
    raise ValueError(f"--mode={_MODE.value!r} is invalid: allowed one of {mode_names()}"
                     " (with --task=bpb a comma-separated list of them)")
  tasks_allowed = ("bpb", *downstream.GENERATION_TASKS, *downstream.MC_TASKS)
  if _TASK.value and _TASK.value not in tasks_allowed:
    raise ValueError(f"--task={_TASK.value!r} is invalid: allowed one of "
                     f"{', '.join(tasks_allowed)}")
  if _TASK.value == "bpb":
    results = jobs.evaluate_bpb_task(_DATA.value, _MODEL.value, split=_SPLIT.value,
                                     blocks=_BLOCKS.value,
                                     modes=modes,
                                     batch_size=_BATCH.value)
    if _OUTPUT.value:
      paths.write_text(_OUTPUT.value, json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))
    _wrote(_OUTPUT.value)
    return
  if _TASK.value:
    summary, per_example = jobs.evaluate_downstream(
        _TASK.value, _DATA.value, _MODEL.value, _TOKENIZER.value, limit=_LIMIT.value,
        chat=_CHAT.value, max_new_tokens=_MAX_NEW.value, batch_size=_BATCH.value,
        prompt_control_flow=_PROMPT_CF.value, add_bos=_BOS.value, labels=_LABELS.value,
        own=tasks.own_tokenizer)
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
    raise app.UsageError(f"--model/--data need --task: allowed {', '.join(tasks_allowed)}")
  results = tasks.evaluate_checkpoint(_WORKDIR.value, _STEP.value, _MODE.value or "exact")
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
