"""Evaluations `python -m t2mlr_jax.evaluate` runs, callable from Python: a downstream
benchmark, bits per byte on a prepared dataset (a training run's checkpoint on its own
task is train.tasks.evaluate_checkpoint)."""

from __future__ import annotations

import json
import os

from t2mlr_jax.convert import loading
from t2mlr_jax.data import hotpotqa, lm, multiple_choice as mc, prosqa, sft
from t2mlr_jax.data.pipeline import stack_batches
from t2mlr_jax.eval import downstream, runner
from t2mlr_jax.eval.bpb import evaluate_bpb


def _trained_data(model: str) -> dict:
  """The `data` group of the `lm` run a training workdir is ({} for anything else)."""
  config_file = os.path.join(model, "config.json")
  if not os.path.isdir(os.path.join(model, "checkpoints")) or not os.path.isfile(config_file):
    return {}
  with open(config_file) as f:
    data = json.load(f).get("data", {})
  return data if data.get("task") == "lm" else {}


def _trained_tokenizer_hash(model: str):
  """The tokenizer hash of the prepared dataset a training workdir learned from (None
  when the model is not such a workdir or the dataset is not readable here)."""
  data = _trained_data(model)
  if not data.get("path"):
    return None
  try:
    return lm.read_manifest(data["path"])["tokenizer"]["sha256"]
  except (ValueError, OSError):
    return None


def evaluate_bpb_task(data: str, model: str, *, split: str = "validation",
                      blocks=None, modes=None, batch_size: int = 8) -> dict:
  """Bits per byte of a model on a prepared dataset's split, in each mode (`eval_modes`;
  the result's key is "views", as the results files have it). A training workdir's blocks
  are read as it trained on them (data.documents, data.mask_documents)."""
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
  trained = _trained_data(model)
  source = lm.BlockSource(data, split, mask_documents=trained.get("mask_documents", True),
                          documents=trained.get("documents", "separate"))
  examples = lm.spread(source, blocks)
  batches = stack_batches(examples, block, batch_size)
  token_bytes = lm.token_bytes(data)
  by_mode = {m: evaluate_bpb(params, cfg, batches, token_bytes, mode=m)
             for m in (modes or runner.eval_modes(cfg))}
  return {"data": data, "split": split, "blocks": len(examples), "views": by_mode}


def evaluate_downstream(task, data, model, tokenizer_dir=None, *, limit=None, chat=False,
                        max_new_tokens=512, batch_size=8, prompt_control_flow=1,
                        add_bos=False, labels=None, own=None):
  """Score a model (any source `loading` opens) on a downstream task: generation
  tasks (GSM8K-style `###` answers) by greedy decoding, multiple-choice tasks by the
  summed log-likelihood of each choice. Returns the task's metrics dict. `own`: a training
  workdir's task vocabulary, as `loading.find_tokenizer` takes it."""
  cfg, params, found = loading.load_model_and_tokenizer(model, tokenizer=tokenizer_dir,
                                                        field="--model", own=own)
  tokenizer = found.tokenizer
  if task in downstream.GENERATION_TASKS:
    if task == "hotpotqa":
      records = hotpotqa.read_hotpotqa(data, limit)     # its JSON list
    elif task == "prosqa":
      records = prosqa.read_prosqa(data)[:limit]        # Coconut's JSON list, or JSONL
    else:
      records = sft.read_records(data)[:limit]          # JSONL or tfds:NAME:SPLIT
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
