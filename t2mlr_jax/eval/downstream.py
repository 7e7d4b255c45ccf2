"""Downstream benchmarks with the exact recurrence: GSM8K, MATH500, HotpotQA and ProsQA by
batched greedy generation, zero-shot multiple choice (ARC, HellaSwag, PIQA) by log-likelihood.

Prompts are batched longest-first and left-padded to a multiple of `bucket`
tokens, so the compiled generate/forward are reused across batches.
"""

from __future__ import annotations

from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from t2mlr_jax.data import hotpotqa as hotpotqa_data, multiple_choice as mc, prosqa, sft
from t2mlr_jax.eval import answers, hotpotqa
from t2mlr_jax.losses import token_nll
from t2mlr_jax.model.decode import generate
from t2mlr_jax.model.modes import forward

GENERATION_TASKS = ("gsm8k", "math500", "hotpotqa", "prosqa")
MC_TASKS = tuple(mc.TASK_READERS)


def _round_up(n: int, k: int) -> int:
  return -(-n // k) * k


def generate_texts(params, cfg, tokenizer, prompts: Sequence[str], *, max_new_tokens: int = 256,
                   batch_size: int = 8, prompt_control_flow: int = 1, bucket: int = 32,
                   add_bos: bool = False) -> list[str]:
  """Greedy completions (text up to EOS) of each prompt, in the prompts' order."""
  encoded = []
  for p in prompts:
    ids = tokenizer.encode(p)
    if add_bos and tokenizer.bos_id is not None:
      ids = [tokenizer.bos_id] + ids
    encoded.append(ids)
  order = sorted(range(len(prompts)), key=lambda i: -len(encoded[i]))
  pad_id = tokenizer.pad_id if tokenizer.pad_id is not None else 0
  out: list[Optional[str]] = [None] * len(prompts)
  for start in range(0, len(order), batch_size):
    idx = order[start:start + batch_size]
    P = _round_up(max(len(encoded[i]) for i in idx), bucket)
    if P + max_new_tokens > cfg.max_seq_len:
      raise ValueError(f"a prompt of {P} tokens (bucketed) + max_new_tokens={max_new_tokens} "
                       f"exceeds max_seq_len={cfg.max_seq_len}")
    rows = np.full((batch_size, P), pad_id, np.int32)
    lengths = np.ones(batch_size, np.int32)
    for r, i in enumerate(idx):
      rows[r, P - len(encoded[i]):] = encoded[i]
      lengths[r] = len(encoded[i])
    rows[len(idx):, -1] = pad_id            # filler rows: one padding token as prompt
    new = np.asarray(generate(params, cfg, rows, max_new_tokens=max_new_tokens,
                              eos_id=tokenizer.eos_id, prompt_lengths=lengths,
                              prompt_control_flow=prompt_control_flow))
    for r, i in enumerate(idx):
      ids = new[r].tolist()
      if tokenizer.eos_id is not None and tokenizer.eos_id in ids:
        ids = ids[:ids.index(tokenizer.eos_id)]
      out[i] = tokenizer.decode(ids)
  return out


def evaluate_generation(task: str, params, cfg, tokenizer, records: Sequence[dict], *,
                        chat: bool = False, **gen_kwargs) -> tuple[dict, list[dict]]:
  """(summary, per-example predictions) for gsm8k, math500, hotpotqa or prosqa records.

  gsm8k records: {question, answer} (answer: the number, or a GSM8K solution
  ending in '#### N'); math500 records: {problem, answer}; prosqa records: {question,
  answer} as data.prosqa writes them (Coconut's files).
  """
  if task not in GENERATION_TASKS:
    raise ValueError(f"task={task!r} is invalid: allowed {GENERATION_TASKS}")
  if task == "hotpotqa":
    return _evaluate_hotpotqa(params, cfg, tokenizer, records, chat=chat, **gen_kwargs)
  if task == "prosqa":
    return _evaluate_prosqa(params, cfg, tokenizer, records, chat=chat, **gen_kwargs)
  prompts = []
  for n, r in enumerate(records):
    question = r.get("question") if task == "gsm8k" else r.get("problem")
    if question is None or "answer" not in r:
      need = "{question, answer}" if task == "gsm8k" else "{problem, answer}"
      raise ValueError(f"record {n} has keys {sorted(r)}: {task} needs {need}")
    prompts.append(sft.prompt_and_response({"question": question, "answer": ""}, "gsm8k_aug",
                                           tokenizer, chat)[0])
  texts = generate_texts(params, cfg, tokenizer, prompts, **gen_kwargs)
  predictions, totals = [], {}
  for r, prompt, text in zip(records, prompts, texts):
    gold = str(r["answer"])
    if task == "gsm8k":
      scores = answers.gsm8k_match(text, gold)
      pred = answers.extract_gsm8k(text)
    else:
      scores = {"exact_match": answers.math_match(text, gold)}
      pred = answers.last_boxed(text)
    for k, v in scores.items():
      totals[k] = totals.get(k, 0) + int(v)
    predictions.append({"prompt": prompt, "completion": text, "prediction": pred,
                        "gold": gold, **scores})
  n = max(len(records), 1)
  names = {"spec": "exact_match", "strict": "strict_match", "flexible": "flexible_match"}
  summary = {names.get(k, k): v / n for k, v in totals.items()}
  return {"task": task, "num_examples": len(records), **summary}, predictions


def _evaluate_hotpotqa(params, cfg, tokenizer, records, *, chat=False, **gen_kwargs):
  """HotpotQA records (the public files' layout) scored by the official EM/F1 on the first
  line the model writes after the prompt's "Answer:" (eval/hotpotqa.py)."""
  prompts = []
  for r in records:
    prompt = hotpotqa_data.format_prompt(r)
    if chat:
      prompt = tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                             add_generation_prompt=True)
    prompts.append(prompt)
  texts = generate_texts(params, cfg, tokenizer, prompts, **gen_kwargs)
  metrics, predictions = hotpotqa.HotpotQAMetrics(), []
  for r, prompt, text in zip(records, prompts, texts):
    pred = hotpotqa.extract_answer(text)
    scores = metrics.update(pred, r["answer"])
    predictions.append({"id": r["_id"], "prompt": prompt, "completion": text,
                        "prediction": pred, "gold": r["answer"], **scores})
  return {"task": "hotpotqa", **metrics.result()}, predictions


def _evaluate_prosqa(params, cfg, tokenizer, records, *, chat=False, **gen_kwargs):
  """ProsQA records prompted as they are trained (the GSM8K-Aug layout: question, then the
  chain and `### <entity> is a <concept>.`), scored by data.prosqa.score_response: the
  answer line (answer_acc) and the chain walked through the question's facts
  (path_valid_acc)."""
  prompts = [sft.prompt_and_response({"question": r["question"], "answer": ""}, "gsm8k_aug",
                                     tokenizer, chat)[0] for r in records]
  texts = generate_texts(params, cfg, tokenizer, prompts, **gen_kwargs)
  predictions, right, valid = [], 0, 0
  for r, prompt, text in zip(records, prompts, texts):
    scores = prosqa.score_response(r, text)
    right += int(scores["answer_correct"])
    valid += int(scores["path_valid"])
    predictions.append({"prompt": prompt, "completion": text, "gold": r["answer"], **scores})
  n = max(len(records), 1)
  return ({"task": "prosqa", "num_examples": len(records), "answer_acc": right / n,
           "path_valid_acc": valid / n}, predictions)


def sequence_logliks(params, cfg, requests: Sequence[tuple[list[int], list[int]]], *,
                     batch_size: int = 16, bucket: int = 32, control_flow: int = 2) -> list[float]:
  """sum log p(continuation | context) for each (context ids, continuation ids) pair,
  with the exact recurrence; every token has control flow `control_flow`."""
  lengths = [len(c) + len(k) for c, k in requests]
  order = sorted(range(len(requests)), key=lambda i: -lengths[i])
  out = [0.0] * len(requests)
  for start in range(0, len(order), batch_size):
    idx = order[start:start + batch_size]
    T = _round_up(max(lengths[i] for i in idx), bucket)
    if T > cfg.max_seq_len:
      raise ValueError(f"a scoring request has {max(lengths[i] for i in idx)} tokens > "
                       f"max_seq_len={cfg.max_seq_len}")
    tokens = np.zeros((batch_size, T), np.int32)
    cf = np.zeros((batch_size, T), np.int32)
    target = np.full((batch_size, T), -1, np.int32)
    for r, i in enumerate(idx):
      ctx, cont = requests[i]
      seq = list(ctx) + list(cont)
      tokens[r, :len(seq)] = seq
      cf[r, :len(seq)] = control_flow
      # position t predicts token t+1: score the continuation's tokens
      target[r, len(ctx) - 1:len(seq) - 1] = cont
    scores = np.asarray(_loglik(params, cfg, jnp.asarray(tokens), jnp.asarray(cf),
                                jnp.asarray(target)))
    for r, i in enumerate(idx):
      out[i] = float(scores[r])
  return out


@jax.jit
def _gather_loglik(logits, target):
  return -jnp.sum(token_nll(logits, target)[0], axis=-1)


def _loglik(params, cfg, tokens, cf, target):
  return _gather_loglik(forward(params, cfg, tokens, mode="exact", control_flow=cf), target)


def evaluate_multiple_choice(task: str, params, cfg, tokenizer, examples: Sequence[mc.MCExample],
                             *, add_bos: bool = False, **kwargs) -> tuple[dict, list[dict]]:
  """acc / acc_norm (lm-eval conventions) and per-example scores."""
  requests = []
  for ex in examples:
    ctx = tokenizer.encode(ex.context)
    if add_bos and tokenizer.bos_id is not None:
      ctx = [tokenizer.bos_id] + ctx
    for _, cont_text in mc.scoring_requests(ex):
      requests.append((ctx, tokenizer.encode(cont_text)))
  logliks = sequence_logliks(params, cfg, requests, **kwargs)
  per_example, right, right_norm = [], 0, 0
  at = 0
  for ex in examples:
    ll = logliks[at:at + len(ex.choices)]
    at += len(ex.choices)
    picked = mc.score_choices(ll, ex.choices)
    right += int(picked["pred"] == ex.label)
    right_norm += int(picked["pred_norm"] == ex.label)
    per_example.append({"context": ex.context, "label": ex.label, "logliks": ll, **picked})
  n = max(len(examples), 1)
  return ({"task": task, "num_examples": len(examples), "acc": right / n,
           "acc_norm": right_norm / n}, per_example)
