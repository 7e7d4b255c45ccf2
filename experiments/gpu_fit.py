"""The GPU fit table: the accelerator configs compiled for the GPU nodes a user would rent,
on this host (the CUDA plugin's compile-only devices; no GPU, nothing runs). Per cell: per
device GiB (state sharded / replicated, temporaries, the total against what a JAX process
gets on the card), whether it fits, and where it does not, the smallest
`train.grad_accum_steps` that does (2, 4, 8, ... while the microbatch still splits over the
mesh's batch axes; each try a compile of its own), then, if none does, the config's
stronger `model.remat` policies with the same search.

    pip install "jax[cuda12]==$(python -c 'import jax; print(jax.__version__)')"
    JAX_PLATFORMS=cpu python experiments/gpu_fit.py        # every cell not yet in the JSON
    JAX_PLATFORMS=cpu python experiments/gpu_fit.py --cells=135m@a100-8 --redo
    python experiments/gpu_fit.py --table                  # the docs' table (docs/gpu.md)

Results accumulate in experiments/results/gpu_fit.json, written after every compile, so a
run resumes where it stopped: a finished cell is skipped, an unfinished one keeps the
compiles it recorded. A 135M-shape compile for an 8-GPU node takes about 25-60 s on a
2-core host. The FLOPs (the step time floor) are the library's FLOP model: XLA's count
misses the cuDNN and cuBLAS custom calls (and a compile without the card gives none).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "experiments"))
from bench_common import cells_command, read_json, write_json  # noqa: E402

OUT = os.path.join(ROOT, "experiments", "results", "gpu_fit.json")
MEM_FRACTION_ENV = "XLA_PYTHON_CLIENT_MEM_FRACTION"     # t2mlr_jax.accel.topologies reads it

# name -> (config, topology, overrides, why this cell)
CELLS = {
    "135m@h100-8": ("configs/fineweb_135m.py", "h100-8", (),
                    "T2MLR Jacobi 16/4 at SmolLM2-135M's shape, the paper's global batch "
                    "(256 × 2048) on one 8×H100 node"),
    "135m@a100-8": ("configs/fineweb_135m.py", "a100-8", (),
                    "the same on one 8×A100 (80 GB) node"),
    "lrt_d20@h100-8": ("configs/lrt_nanochat.py:d20", "h100-8", (),
                       "LRT nanochat d20 at nanochat's batch (524,288 tokens a step) on "
                       "nanochat's speedrun node"),
    "retrofit_1p7b@h100-8": ("configs/retrofit_smollm2_1p7b_gsm8k.py", "h100-8",
                             ("--config.model.init_from=smollm2-1.7b",),
                             "the 1.7B retrofit (Jacobi 16/8, T 4096, full remat) from the "
                             "preset's shape"),
    "quickstart@t4-1": ("configs/s5_retrieval.py", "t4-1", ("--config.model.attention=auto",),
                        "notebooks/quickstart.ipynb's job (the default S5-Retrieval run, "
                        "attention auto) on Colab's free T4"),
}
ACCUM_TRIES = (2, 4, 8, 16, 32, 64)
REMAT_ORDER = ("none", "dots", "full")       # weakest to strongest (config.REMAT_POLICIES)


def _compile(config, topology, overrides, accum=None, remat=None) -> dict:
  """One compile through the tool (a subprocess: memory freed after each); the tool's JSON
  report, or {"error", "command", "exit"} when it failed."""
  with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "r.json")
    cmd = [sys.executable, "-m", "t2mlr_jax.compile", f"--config={config}",
           f"--topology={topology}", f"--output={out}", *overrides]
    if accum:
      cmd.append(f"--config.train.grad_accum_steps={accum}")
    if remat:
      cmd.append(f"--config.model.remat={remat}")
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}   # the plugin never looks for a GPU
    t0 = time.time()
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    shown = "python -m t2mlr_jax.compile " + " ".join(
        c for c in cmd[3:] if not c.startswith("--output"))
    if p.returncode not in (0, 3) or not os.path.exists(out):
      return {"error": (p.stderr.strip().splitlines() or ["?"])[-1], "command": shown,
              "exit": p.returncode}
    report = read_json(out)
  report["command"] = shown
  report["wall_seconds"] = round(time.time() - t0, 1)
  return report


def _summary(report: dict) -> dict:
  """The table's numbers of one compile."""
  train = report["steps"][0]
  g = lambda n: None if n is None else round(n / 2 ** 30, 3)
  out = {"fits": report["fits"], "grad_accum_steps": report["grad_accum_steps"],
         "remat": report.get("remat"),
         "state_gib": g(report["state_bytes_per_device"]),
         "state_sharded_gib": g(report["state_sharded_bytes_per_device"]),
         "state_replicated_gib": g(report["state_replicated_bytes"]),
         "budget_gib": g(report["hbm_bytes_per_device"]), "attention": report["attention"],
         "mesh": report["mesh"], "devices": report["devices"],
         "command": report.get("command"), "wall_seconds": report.get("wall_seconds")}
  if "error" in train:
    out["error"] = train["error"]
  else:
    out.update(temp_gib=g(train["temp_bytes"]), total_gib=g(train["total_bytes"]),
               kernels=train["kernels"], collectives=train["collectives"],
               compile_seconds=train["compile_seconds"],
               model_flops_per_device=train["model_flops_per_device"],
               step_seconds_floor=train["step_seconds_floor"])
  return out


def _stronger_remats(own) -> list:
  own = own if own in REMAT_ORDER else "none"
  return list(REMAT_ORDER[REMAT_ORDER.index(own) + 1:])


def run_cell(name: str, compile_fn=_compile, save=lambda entry: None,
             previous: dict | None = None) -> dict:
  """Compile a cell: the config as it is, then, if it does not fit, gradient accumulation
  (2, 4, 8, ... while the global batch splits into microbatches the mesh's batch axes
  divide), then the stronger remat policies the same way (from 1 microbatch) until one
  fits. `save(entry)` after each compile; `previous`: the cell's unfinished entry, whose
  recorded compiles are reused."""
  config, topology, overrides, why = CELLS[name]
  prev = previous if previous and "default" in previous else None
  if prev is None:
    first = compile_fn(config, topology, overrides)
    if "steps" not in first:
      return {"cell": name, "config": config, "topology": topology, "why": why,
              "error": first["error"], "command": first["command"], "complete": True}
    entry = {"cell": name, "config": config, "topology": topology, "why": why,
             "command": first["command"], "default": _summary(first),
             "num_params": first["num_params"], "mode": first["mode"],
             "batch_size": first["batch_size"], "seq_len": first["seq_len"],
             "complete": False}
    save(entry)
  else:
    entry = {**prev, "tries": list(prev.get("tries", ())), "complete": False}
  if entry["default"]["fits"]:
    entry["complete"] = True
    return entry
  entry.setdefault("tries", [])
  recorded = {(t["grad_accum_steps"], t.get("remat")): t for t in entry["tries"]}
  mesh = entry["default"]["mesh"]
  divisor = mesh.get("data", 1) * mesh.get("fsdp", 1)
  own_remat = entry["default"].get("remat") or "none"
  plans = [(own_remat, ACCUM_TRIES)] + [(r, (1,) + ACCUM_TRIES)
                                        for r in _stronger_remats(own_remat)]
  for remat, ks in plans:
    for k in ks:
      B = entry["batch_size"]
      if B % k or (B // k) % divisor:
        break
      key = (k, remat)
      if key not in recorded:
        r = compile_fn(config, topology, overrides, accum=k if k > 1 else None,
                       remat=None if remat == own_remat else remat)
        if "steps" in r:
          t = _summary(r)
        else:                  # the compiler itself failed: say so, go on
          t = {"grad_accum_steps": k, "remat": remat, "fits": None, "error": r["error"],
               "command": r["command"]}
        t["remat"] = remat
        recorded[key] = t
        entry["tries"].append(t)
        save(entry)
      t = recorded[key]
      if t["fits"]:
        entry["smallest_fitting_grad_accum_steps"] = k
        entry["fitting_remat"] = remat
        entry["fitting_command"] = t["command"]
        entry["complete"] = True
        return entry
  entry["smallest_fitting_grad_accum_steps"] = None       # none tried fits
  entry["complete"] = True
  return entry


def _gib(x) -> str:
  return "-" if x is None else f"{x:.2f}"


def _floor(d: dict) -> str:
  s = d.get("step_seconds_floor")
  return "-" if s is None else f"{s:.3g} s" if s >= 1 else f"{s * 1e3:.3g} ms"


def table(results: dict) -> str:
  """The docs' markdown table of the recorded cells, in CELLS order."""
  rows = ["| config | node (devices) | mode, batch | state per device GiB | temporaries GiB "
          "| total / budget GiB | fits | smallest fitting `grad_accum_steps` (total GiB) | "
          "compile s (as is / fitting) | cuDNN attention calls | step floor (FLOP model) |",
          "|---|---|---|---|---|---|---|---|---|---|---|"]
  for name in CELLS:
    e = results["cells"].get(name)
    if e is None:
      continue
    if "default" not in e:
      rows.append(f"| {CELLS[name][0]} | {CELLS[name][1]} | | | | | error: {e['error']} | "
                  "| | | |")
      continue
    d = e["default"]
    config = f"`{e['config'].replace('configs/', '')}`" + "".join(
        f", `{o.replace('--config.', '')}`" for o in CELLS[name][2])
    if "error" in d:
      temp, total = "-", f"- / {_gib(d['budget_gib'])} ({d['error']})"
    else:
      temp, total = _gib(d["temp_gib"]), f"{_gib(d['total_gib'])} / {_gib(d['budget_gib'])}"
    k, remat = e.get("smallest_fitting_grad_accum_steps"), e.get("fitting_remat")
    seconds = [f"{d['compile_seconds']:.0f}" if d.get("compile_seconds") else "-"]
    if d["fits"]:
      fit = "1 (fits as is)"
    elif k:
      t = next(x for x in e["tries"]
               if x.get("grad_accum_steps") == k and x.get("remat") == remat)
      own = d.get("remat") or "none"
      fit = f"{k}" + (f" with `remat={remat}`" if remat != own else "") + \
          f" ({_gib(t.get('total_gib'))})"
      seconds.append(f"{t['compile_seconds']:.0f}" if t.get("compile_seconds") else "-")
    elif e.get("complete"):
      fit = "none tried fits (" + ", ".join(
          f"{x['grad_accum_steps']}" + (f" {x['remat']}" if x.get("remat") else "")
          for x in e.get("tries", ())) + ")"
    else:
      fit = "unfinished"
    calls = (d.get("kernels") or {}).get("fused_attention", "-")
    rows.append(f"| {config} | {e['topology']} ({d['devices']}) | {e['mode']}, "
                f"{e['batch_size']} × {e['seq_len']} | {_gib(d['state_gib'])} | {temp} | "
                f"{total} | {'yes' if d['fits'] else 'no'} | {fit} | "
                f"{' / '.join(seconds)} | {calls} | {_floor(d)} |")
  return "\n".join(rows)


def run(names, results: dict, write, compile_fn=_compile, redo: bool = False) -> dict:
  """Compile the named cells into `results["cells"]`, calling `write(results)` after every
  compile (the file is never a compile behind). A finished cell is skipped unless `redo`;
  an unfinished one resumes from the compiles it recorded."""
  def save(entry):
    entry["recorded"] = time.strftime("%Y-%m-%d %H:%M")
    results["cells"][entry["cell"]] = entry
    write(results)

  for name in names:
    previous = results["cells"].get(name)
    if previous is not None and previous.get("complete", True) and not redo:
      continue
    print(f"[{time.strftime('%H:%M:%S')}] {name}", flush=True)
    entry = run_cell(name, compile_fn, save, previous=None if redo else previous)
    save(entry)
    d = entry.get("default", {})
    print(json.dumps({"fits": d.get("fits"), "total_gib": d.get("total_gib"),
                      **{k: entry.get(k) for k in ("smallest_fitting_grad_accum_steps",
                                                   "fitting_remat", "error")}}), flush=True)
  return results


def main():
  parsed = cells_command(__doc__.split("\n\n")[0], CELLS, OUT, table)
  if parsed is None:
    return
  names, results, redo = parsed
  from importlib import metadata

  import jax
  try:
    plugin = metadata.version("jax-cuda12-plugin")
  except metadata.PackageNotFoundError:
    sys.exit('error: the CUDA plugin is missing: pip install "jax[cuda12]=='
             f'{jax.__version__}"')
  results["host"] = {"platform": platform.platform(), "cpus": os.cpu_count(),
                     "jax": jax.__version__, "jax_cuda12_plugin": plugin,
                     MEM_FRACTION_ENV: os.environ.get(MEM_FRACTION_ENV, "default (0.75)")}

  run(names, results, lambda r: write_json(OUT, r, indent=2, stamp=False), redo=redo)


if __name__ == "__main__":
  main()
