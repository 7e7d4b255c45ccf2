"""HotpotQA (distractor setting) as SFT data: the public JSON files read and checked, each
record made a {prompt, response} pair that `data.sft` trains on and `eval.hotpotqa` scores.

The public files (`hotpot_train_v1.1.json`, `hotpot_dev_distractor_v1.json`, from
hotpotqa.github.io) are one JSON list of records: `_id`, `question`, `answer`,
`supporting_facts` ([title, sentence index] pairs), `context` ([title, [sentences]]
pairs; a sentence carries its own leading space, so joining them with "" restores the
paragraph), `type` ("bridge"/"comparison") and `level`.

Prompt (ours): every context paragraph as "Title: {title}\\n{sentences joined with ''}",
paragraphs separated by a blank line, then "\\n\\nQuestion: {question}\\nAnswer:"; the
response is " " + answer. The leading space: `sft.tokenize_record` encodes prompt and
response apart, and a BPE tokenizer reads " Paris" as the word token that follows
"Answer:" in running text, while "Paris" would be a token the model rarely sees there.
`eval.hotpotqa.extract_answer` strips it again.

The release (princeton-pli/T2MLR 4510e81, scripts/hotpotqa/train_hotpotqa.sh) differs:
it reads columns `question` (prompt) and `output` (response), scores with
`--reward_mode exact` (literal match after strip), marks every token recurrent
(CONTROL_FLOW_ALL_RECURRENT=True) and names `--custom_dataset_preprocessing hotpotqa_cot`
and `--custom_dataset_postprocessing hotpotqa`, which its src/ does not register, so its
prompt text is not visible. By default it sets DO_TRAIN=False (eval only) and leaves
TRAIN_DATA_PATH/EVAL_DATA_PATH empty, so as shipped it cannot train or run. Our records
keep `prompt`/`response` keys, not `question`: `sft.detect_format` would read a record
with {question, answer} as GSM8K-Aug.
"""

from __future__ import annotations

import json
import os
from typing import Iterable, Optional

from absl import app, flags

from t2mlr_jax import cli, paths

__all__ = [
  "REQUIRED_KEYS",
  "read_hotpotqa",
  "supporting_sentences",
  "format_prompt",
  "sft_record",
  "write_sft_jsonl",
]

REQUIRED_KEYS = ("_id", "question", "answer", "supporting_facts", "context")


def _check_record(record, n: int, path: str) -> None:
  """A clear error for a record that is not the public format (n: its index in the file)."""
  if not isinstance(record, dict):
    raise ValueError(f"{path}: record {n} is a {type(record).__name__}, not an object")
  for key in REQUIRED_KEYS:
    if key not in record:
      raise ValueError(f"{path}: record {n} (_id={record.get('_id')!r}) has no {key!r} key: "
                       f"a HotpotQA record needs {list(REQUIRED_KEYS)}")
  for para in record["context"]:
    if (not isinstance(para, (list, tuple)) or len(para) != 2
        or not isinstance(para[1], (list, tuple))):
      raise ValueError(f"{path}: record {n} (_id={record['_id']!r}) has a context entry "
                       f"{str(para)[:80]!r}: allowed [title, [sentences]]")


def read_hotpotqa(path: str, limit: Optional[int] = None) -> list[dict]:
  """The records of a public HotpotQA JSON file (the first `limit` when given), checked."""
  if limit is not None and limit < 0:
    raise ValueError(f"limit={limit} is invalid: allowed None or >= 0")
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{os.path.basename(path)} not found at {os.path.abspath(path)}: "
                            "download it from hotpotqa.github.io and pass data.path")
  with open(path, encoding="utf-8") as f:
    try:
      records = json.load(f)
    except json.JSONDecodeError as e:
      raise ValueError(f"{path}: not valid JSON ({e})") from e
  if not isinstance(records, list):
    raise ValueError(f"{path} holds a {type(records).__name__}: a HotpotQA file is a JSON list "
                     "of records")
  if limit is not None:
    records = records[:limit]
  for n, record in enumerate(records):
    _check_record(record, n, path)
  return records


def supporting_sentences(record: dict) -> list[str]:
  """The sentences its `supporting_facts` point at, in their order (as in the dataset,
  leading space included); ValueError for a fact naming a missing title or sentence."""
  paragraphs: dict[str, list[str]] = {}
  for title, sentences in record["context"]:
    paragraphs.setdefault(title, list(sentences))
  out = []
  for title, index in record["supporting_facts"]:
    if title not in paragraphs:
      raise ValueError(f"record {record.get('_id')!r}: supporting fact [{title!r}, {index}] "
                       f"names a title not in its context {sorted(paragraphs)}")
    sentences = paragraphs[title]
    if not 0 <= index < len(sentences):
      raise ValueError(f"record {record.get('_id')!r}: supporting fact [{title!r}, {index}] "
                       f"points past the paragraph's {len(sentences)} sentences")
    out.append(sentences[index])
  return out


def format_prompt(record: dict, *, supporting_only: bool = False) -> str:
  """The prompt text: context paragraphs ("Title: t\\n" + sentences), a blank line
  between them, then "Question: q\\nAnswer:". `supporting_only` keeps only the
  paragraphs (whole, in context order) that a supporting fact cites."""
  context = record["context"]
  if supporting_only:
    supporting_sentences(record)             # every fact must point at a real sentence
    cited = {title for title, _ in record["supporting_facts"]}
    context = [(title, sentences) for title, sentences in context if title in cited]
  parts = [f"Title: {title}\n{''.join(sentences)}" for title, sentences in context]
  parts.append(f"Question: {record['question']}\nAnswer:")
  return "\n\n".join(parts)


def sft_record(record: dict, *, supporting_only: bool = False) -> dict:
  """{"prompt", "response" (" " + answer), "answer", "id"}: one SFT example of a record."""
  answer = record["answer"]
  return {"prompt": format_prompt(record, supporting_only=supporting_only),
          "response": " " + answer, "answer": answer, "id": record["_id"]}


def write_sft_jsonl(records: Iterable[dict], path: str, *, supporting_only: bool = False) -> int:
  """Write the `sft_record` of each HotpotQA record as one JSON line (ASCII, so any locale
  reads it back); returns the number written."""
  lines = [json.dumps(sft_record(r, supporting_only=supporting_only)) for r in records]
  paths.write_text(path, "".join(line + "\n" for line in lines))
  return len(lines)


def main(argv=None):
  """`python -m t2mlr_jax.data.hotpotqa --input=hotpot_train_v1.1.json
  --out=data/hotpotqa/train.jsonl`: a public file as SFT records (configs/hotpotqa.py)."""
  src = flags.DEFINE_string("input", None, "a public HotpotQA JSON file")
  out = flags.DEFINE_string("out", None, "the JSONL file to write")
  limit = flags.DEFINE_integer("limit", None, "the first N records only")
  supporting = flags.DEFINE_bool("supporting_only", False, "keep the cited paragraphs only")

  def run(argv):
    del argv
    if not src.value or not out.value:
      raise app.UsageError("give --input (a HotpotQA JSON file) and --out (a JSONL file)")
    n = write_sft_jsonl(read_hotpotqa(src.value, limit.value), out.value,
                        supporting_only=supporting.value)
    print(f"wrote {n} records to {out.value}")
  cli.run(run, argv)


if __name__ == "__main__":
  main()
