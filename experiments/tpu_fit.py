"""The memory-fit table: the accelerator configs compiled for the TPU slices a user would
pick, on this host (libtpu's compile-only devices; nothing runs). Per cell: per-device
GiB (state sharded / replicated, temporaries), whether it fits, and where it does not, the
smallest `train.grad_accum_steps` that does (each try a compile of its own).

    pip install "jax[tpu]==$(python -c 'import jax; print(jax.__version__)')"
    python experiments/tpu_fit.py                  # every cell not yet in the JSON
    python experiments/tpu_fit.py --cells=135m@v5e-16 --redo

Results accumulate in experiments/results/tpu_fit.json (one entry per cell, written as
each finishes), so the run resumes where it stopped. A 135M-shape compile takes 2-8
minutes on a 2-core host.
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

OUT = os.path.join(ROOT, "experiments", "results", "tpu_fit.json")

# name -> (config, topology, overrides, why this cell)
CELLS = {
    "135m@v5e-256": ("configs/fineweb_135m.py", "v5e-256", (),
                     "the default's named slice: one 2048-token sequence a chip"),
    "135m@v5e-16": ("configs/fineweb_135m.py", "v5e-16", (),
                    "the same global batch on 16 chips: 16 sequences a chip"),
    "135m_transformer@v5e-16": ("configs/fineweb_135m.py:transformer", "v5e-16", (),
                                "the baseline arm at the same batch: what Jacobi costs"),
    "135m@v4-32": ("configs/fineweb_135m.py", "v4-32", (),
                   "16 v4 chips (32 GiB each) instead of 16 v5e chips (16 GiB)"),
    "135m@v6e-16": ("configs/fineweb_135m.py", "v6e-16", (), "16 v6e chips (32 GiB)"),
    "135m_all_layers@v5e-256": ("configs/fineweb_135m.py:all_layers", "v5e-256", (),
                                "T2MLR over all 30 layers: the sweeps cover every layer"),
    "360m@v5e-256": ("configs/fineweb_135m.py:360m", "v5e-256", (),
                     "SmolLM2-360M's shape on the default's slice"),
    "lrt_d12@v5e-16": ("configs/lrt_nanochat.py:d12", "v5e-16", (),
                       "LRT nanochat d12, interleaved S = 2"),
    "lrt_d12@v5e-256": ("configs/lrt_nanochat.py:d12", "v5e-256", (),
                        "LRT nanochat d12 at one sequence a chip"),
    "lrt_d20@v5p-64": ("configs/lrt_nanochat.py:d20", "v5p-64", (),
                       "LRT nanochat d20 on 32 v5p chips (95 GiB each)"),
    "lrt_d20@v5p-128": ("configs/lrt_nanochat.py:d20", "v5p-128", (),
                        "LRT nanochat d20 on 64 v5p chips"),
    "lrt_d20@v6e-16": ("configs/lrt_nanochat.py:d20", "v6e-16", (),
                       "LRT nanochat d20 on 16 v6e chips"),
    "retrofit_1p7b@v5p-64": ("configs/retrofit_smollm2_1p7b_gsm8k.py", "v5p-64",
                             ("--config.model.init_from=smollm2-1.7b",),
                             "the 1.7B retrofit (Jacobi 16/8, T 4096, full remat)"),
}
ACCUM_TRIES = (2, 4, 8, 16, 32, 64)


def _compile(config, topology, overrides, accum=None) -> dict:
  """One compile through the tool (a subprocess: memory freed after each)."""
  with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "r.json")
    cmd = [sys.executable, "-m", "t2mlr_jax.compile", f"--config={config}",
           f"--topology={topology}", f"--output={out}", *overrides]
    if accum:
      cmd.append(f"--config.train.grad_accum_steps={accum}")
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}
    t0 = time.time()
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if p.returncode not in (0, 3) or not os.path.exists(out):
      return {"error": (p.stderr.strip().splitlines() or ["?"])[-1], "command": cmd[2:],
              "exit": p.returncode}
    report = read_json(out)
  report["command"] = "python -m t2mlr_jax.compile " + " ".join(
      c for c in cmd[3:] if not c.startswith("--output"))
  report["wall_seconds"] = round(time.time() - t0, 1)
  return report


def _summary(report: dict) -> dict:
  """The table's numbers of one compile."""
  train = report["steps"][0]
  g = lambda n: None if n is None else round(n / 2 ** 30, 3)
  out = {"fits": report["fits"], "grad_accum_steps": report["grad_accum_steps"],
         "state_gib": g(report["state_bytes_per_device"]),
         "state_sharded_gib": g(report["state_sharded_bytes_per_device"]),
         "state_replicated_gib": g(report["state_replicated_bytes"]),
         "hbm_gib": g(report["hbm_bytes_per_device"]), "attention": report["attention"],
         "mesh": report["mesh"], "devices": report["devices"]}
  if "error" in train:
    out["error"] = train["error"]
  else:
    out.update(temp_gib=g(train["temp_bytes"]), total_gib=g(train["total_bytes"]),
               mosaic_kernels=train["mosaic_kernels"], collectives=train["collectives"],
               compile_seconds=train["compile_seconds"],
               step_seconds_floor=train["step_seconds_floor"])
  return out


def run_cell(name: str) -> dict:
  config, topology, overrides, why = CELLS[name]
  first = _compile(config, topology, overrides)
  if "error" in first and "steps" not in first:
    return {"cell": name, "why": why, "error": first["error"], "command": first["command"]}
  entry = {"cell": name, "config": config, "topology": topology, "why": why,
           "command": first["command"], "default": _summary(first),
           "num_params": first["num_params"], "mode": first["mode"],
           "batch_size": first["batch_size"], "seq_len": first["seq_len"]}
  if not first["fits"]:
    entry["tries"] = []
    divisor = first["mesh"]["data"] * first["mesh"]["fsdp"]
    for k in ACCUM_TRIES:
      if first["batch_size"] % k or (first["batch_size"] // k) % divisor:
        break
      r = _compile(config, topology, overrides, accum=k)
      if "steps" not in r:    # the compiler itself failed (a libtpu crash): say so, go on
        crash = "crashed (signal {})".format(-r["exit"] if r["exit"] < 0 else r["exit"] - 128)
        entry["tries"].append({"grad_accum_steps": k, "fits": None,
                               "error": f"libtpu's compiler {crash}"})
        continue
      entry["tries"].append(_summary(r))
      if r["fits"]:
        entry["smallest_fitting_grad_accum_steps"] = k
        entry["fitting_command"] = r["command"]
        break
  return entry


def _gib(x) -> str:
  return "-" if x is None else f"{x:.2f}"


def table(results: dict) -> str:
  """The docs' markdown table of the recorded cells, in CELLS order."""
  sys.path.insert(0, ROOT)
  from t2mlr_jax.accel import topologies
  rows = ["| config | slice (devices) | mode, batch | state per chip: sharded + replicated "
          "GiB | temporaries GiB | total / HBM GiB | fits | smallest fitting "
          "`grad_accum_steps` |", "|---|---|---|---|---|---|---|---|"]
  for name in CELLS:
    e = results["cells"].get(name)
    if e is None:
      continue
    if "default" not in e:
      rows.append(f"| {CELLS[name][0]} | {CELLS[name][1]} | | | | | error: {e['error']} | |")
      continue
    d = e["default"]
    config = e["config"].replace("configs/", "")
    if "error" in d:          # the compiler's own count: "63.31G of 15.75G hbm"
      used = d["error"].split("needs ")[-1].split(" per")[0].split()
      temp, total = "-", f"{used[0].rstrip('G')} / {used[2].rstrip('G')} (compiler)"
    else:
      hbm = topologies.resolve(e["topology"]).hbm_bytes / 2 ** 30   # the compiler's limit
      temp, total = _gib(d["temp_gib"]), f"{_gib(d['total_gib'])} / {_gib(hbm)}"
    mem = f"{_gib(d['state_sharded_gib'])} + {_gib(d['state_replicated_gib'])}"
    k = e.get("smallest_fitting_grad_accum_steps")
    crashed = [str(x["grad_accum_steps"]) for x in e.get("tries", ())
               if "crashed" in (x.get("error") or "")]
    if d["fits"]:
      fit = "1 (fits as is)"
    elif k:
      t = next(x for x in e["tries"] if x.get("grad_accum_steps") == k)
      fit = f"{k} ({_gib(t.get('total_gib'))} GiB)"
    else:
      fit = "none tried fits"
    if crashed:
      fit += f"; libtpu crashed compiling k = {', '.join(crashed)}"
    rows.append(f"| `{config}` | {e['topology']} ({d['devices']}) | {e['mode']}, "
                f"{e['batch_size']} × {e['seq_len']} | {mem} | {temp} | {total} | "
                f"{'yes' if d['fits'] else 'no'} | {fit} |")
  return "\n".join(rows)


def main():
  parsed = cells_command(__doc__.split("\n\n")[0], CELLS, OUT, table)
  if parsed is None:
    return
  names, results, redo = parsed
  from importlib import metadata

  import jax
  results["host"] = {"platform": platform.platform(), "cpus": os.cpu_count(),
                     "jax": jax.__version__, "libtpu": metadata.version("libtpu")}
  for name in names:
    if name in results["cells"] and not redo:
      continue
    print(f"[{time.strftime('%H:%M:%S')}] {name}", flush=True)
    entry = run_cell(name)
    entry["recorded"] = time.strftime("%Y-%m-%d %H:%M")
    results["cells"][name] = entry
    write_json(OUT, results, indent=2, stamp=False)          # never a half-written table
    print(json.dumps({k: entry.get(k) for k in ("default", "smallest_fitting_grad_accum_steps",
                                                  "error")}), flush=True)


if __name__ == "__main__":
  main()
