"""One benchmark at two commits, side by side in one run: whether a change moved a number.

Each commit is checked out in a git worktree of its own (under --trees), and the
benchmark script of that commit runs there with that commit's library first on the
path, the commits alternating round by round (base, head; then head, base; ...). Every
numeric field the two JSON outputs share is reported as its median over the rounds, for
each commit, and head / base. Results are written after every run; a rerun with the same
commits and command resumes at the first run not recorded.

    python experiments/bench_commits.py --base 9f32c71 \\
        --bench "bench_decode.py --no-hf --batch 1,8 --repeats 3" --out bench_commits_decode.json
    python experiments/bench_commits.py --base 9f32c71 \\
        --bench "bench_train.py --parts step --shape s5 --repeats 3" --out bench_commits_train.json
    python experiments/bench_commits.py --out bench_commits_decode.json --table
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as bc  # noqa: E402

SKIPPED = ("machine", "date", "raw_seconds")    # per-run noise and headers, not results


def _git(*args) -> str:
  return subprocess.run(["git", *args], cwd=bc.ROOT, check=True, capture_output=True,
                        text=True).stdout.strip()


def _tree(trees: str, sha: str) -> str:
  """A worktree of `sha` (made once, reused by later runs)."""
  path = os.path.join(trees, sha[:12])
  if not os.path.isdir(path):
    _git("worktree", "add", "--detach", path, sha)
  return path


def numeric_fields(payload, prefix="") -> dict:
  """{dotted key: number} of a benchmark's JSON, headers and raw samples left out."""
  out = {}
  for key, value in payload.items() if isinstance(payload, dict) else ():
    if key in SKIPPED:
      continue
    name = f"{prefix}{key}"
    if isinstance(value, dict):
      out.update(numeric_fields(value, name + "."))
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
      out[name] = float(value)
  return out


def summary(record: dict) -> dict:
  """{key: {base, head, ratio}}: medians over the rounds of the fields both commits have."""
  runs = {side: [numeric_fields(p) for p in record["runs"][side]] for side in ("base", "head")}
  if not runs["base"] or not runs["head"]:
    return {}
  keys = sorted(set.intersection(*(set(r) for rs in runs.values() for r in rs)))
  out = {}
  for key in keys:
    base = statistics.median(r[key] for r in runs["base"])
    head = statistics.median(r[key] for r in runs["head"])
    out[key] = {"base": base, "head": head, "ratio": head / base if base else None}
  return out


def table(record: dict) -> str:
  base, head = record["base"][:7], record["head"][:7]
  rows = [f"| field | {base} | {head} | {head} / {base} |", "|---|---|---|---|"]
  for key, v in summary(record).items():
    ratio = "–" if v["ratio"] is None else f"{v['ratio']:.3f}"
    rows.append(f"| {key} | {v['base']:.4g} | {v['head']:.4g} | {ratio} |")
  return "\n".join(rows)


def _run(tree: str, bench: list, out: str) -> dict:
  """The benchmark of the commit checked out at `tree`, with its library on the path."""
  env = dict(os.environ, PYTHONPATH=tree)
  cmd = [sys.executable, os.path.join(tree, "experiments", bench[0]), *bench[1:], "--out", out]
  start = time.time()
  proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
  if proc.returncode:
    raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
  with open(out) as f:
    payload = json.load(f)
  print(f"  {os.path.basename(tree)}: {time.time() - start:.0f} s", flush=True)
  return payload


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--base", help="the commit to compare against")
  p.add_argument("--head", default="HEAD")
  p.add_argument("--bench", help="a script under experiments/ and its arguments (no --out)")
  p.add_argument("--rounds", type=int, default=2, help="runs of each commit")
  p.add_argument("--trees", default=os.path.join(tempfile.gettempdir(), "t2mlr_bench_trees"))
  p.add_argument("--out", required=True, help="results file (name under experiments/results)")
  p.add_argument("--table", action="store_true", help="print the recorded summary and exit")
  args = p.parse_args()
  if args.table:
    print(table(bc.read_json(args.out)))
    return
  if not args.base or not args.bench:
    p.error("--base and --bench are required (or --table)")
  bench = shlex.split(args.bench)
  if "--out" in bench or not os.path.isfile(os.path.join(bc.ROOT, "experiments", bench[0])):
    p.error(f"--bench={args.bench!r} is invalid: allowed a script under experiments/ and "
            "its arguments, without --out")
  base, head = _git("rev-parse", args.base), _git("rev-parse", args.head)
  record = bc.read_json(args.out, default={})
  same = (record.get("base"), record.get("head"), record.get("bench")) == (base, head, bench)
  if not same:
    record = {"base": base, "head": head, "bench": bench, "runs": {"base": [], "head": []}}
  os.makedirs(args.trees, exist_ok=True)
  trees = {"base": _tree(args.trees, base), "head": _tree(args.trees, head)}
  for r in range(args.rounds):
    for side in (("base", "head") if r % 2 == 0 else ("head", "base")):
      if len(record["runs"][side]) > r:
        continue                                   # recorded by an earlier run
      print(f"round {r + 1}/{args.rounds}: {side} ({record[side][:7]})", flush=True)
      out = os.path.join(args.trees, f"{side}_{r}.json")
      record["runs"][side].append(_run(trees[side], bench, out))
      record["summary"] = summary(record)
      bc.write_json(args.out, record)
  print(table(record))


if __name__ == "__main__":
  main()
