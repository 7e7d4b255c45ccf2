"""XLA:CPU options against the plain 135M training step and transformers' PyTorch Llama.

Runs `bench_train.py --parts=hf_step` (ours and HF alternated in one process, same
weights) once per XLA_FLAGS setting and records each run's step times, their ratio and
our loss (an option that changes the numerics shows there):

    python experiments/xla_cpu_flags.py      # -> experiments/results/xla_cpu_flags.json

The ratio is what to compare across settings: each run measures both sides itself.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import bench_common as bc

SETTINGS = {
    "default": "",
    "onednn": "--xla_cpu_use_onednn=true",
    "onednn_custom_call": "--xla_cpu_experimental_onednn_custom_call=true",
    "xnnpack": "--xla_cpu_use_xnnpack=true",
    "fast_math": "--xla_cpu_enable_fast_math=true",
    "no_multi_thread_eigen": "--xla_cpu_multi_thread_eigen=false",
    "legacy_runtime": "--xla_cpu_use_thunk_runtime=false",
}


def run(name: str, flags: str, repeats: int) -> dict:
  out = f"_xla_flags_{name}.json"
  env = dict(os.environ, XLA_FLAGS=flags)
  start = time.perf_counter()
  proc = subprocess.run([sys.executable, os.path.join(bc.ROOT, "experiments", "bench_train.py"),
                         "--parts=hf_step", f"--repeats={repeats}", f"--out={out}"],
                        env=env, capture_output=True, text=True, cwd=bc.ROOT)
  row = {"xla_flags": flags, "wall_s": round(time.perf_counter() - start, 1)}
  path = bc.results_path(out)
  if proc.returncode != 0 or not os.path.exists(path):
    row["error"] = (proc.stderr or proc.stdout).strip().splitlines()[-1:]
    return row
  hf = bc.read_json(path)["hf_step"]
  os.remove(path)
  row.update(ms_per_step=hf["ms_per_step"], ours_over_hf=hf["ours_over_hf"],
             loss_ours=hf["loss"]["ours"], loss_hf=hf["loss"]["hf_pytorch"])
  return row


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--settings", default=",".join(SETTINGS))
  p.add_argument("--repeats", type=int, default=5)
  args = p.parse_args()
  rows = {}
  for name in args.settings.split(","):
    rows[name] = run(name, SETTINGS[name], args.repeats)
    print(name, rows[name], flush=True)
  result = {"what": "plain smollm2-135m train step (B=1, T=256, fp32) per XLA:CPU option; "
                    "ours and transformers' PyTorch Llama alternated within each run",
            "machine": bc.machine_info(), "date": time.strftime("%Y-%m-%d %H:%M"),
            "runs": rows}
  print("wrote", bc.write_json("xla_cpu_flags.json", result))


if __name__ == "__main__":
  main()
