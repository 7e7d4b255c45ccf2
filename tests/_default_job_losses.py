"""The default job's first 50 per-step training losses, for a guard of its numerics and data.

`tests/fixtures/default_job_losses.json` holds the losses of steps 1..50 of
`python -m t2mlr_jax.main --config=configs/s5_retrieval.py` (run as a user runs it: one
CPU device, the environment's XLA flags without the test suite's). `.ci/run`'s last step
compares the default job's first logged mean loss (steps 1-50) with their mean
(`experiments/s5_default_job.py --check`), within `RTOL`, a tolerance that holds
across x86 CPUs (XLA:CPU compiles for the host's vector units, so the last digits differ
between machines) but not across a change to the model's numerics or to the data stream
(see the fixture's `margins`).

    python tests/_default_job_losses.py --check   # rerun the 50 steps and compare (a minute)
    python tests/_default_job_losses.py           # regenerate, only when a change is meant
                                                  # to move them (say why in the commit)
"""

import json
import os
import subprocess
import sys
import tempfile
import time

import _xla_flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURE = os.path.join(ROOT, "tests", "fixtures", "default_job_losses.json")
CONFIG = os.path.join(ROOT, "configs", "s5_retrieval.py")
STEPS = 50
# Relative tolerance per step, from the fixture's measured margins (max relative change of
# the 50 losses): XLA:CPU generating code for AVX2 / AVX / SSE4.2 instead of this host's
# ISA moves them by at most 6e-7, fast-math by 8e-7; a 5% change of the init std moves
# them by 7e-3, the previous data stream (a Z2-only stage) by 3e-2.
RTOL = 1e-4


def user_env() -> dict:
  """The environment a user's run has: the suite's compile-speed XLA flags removed."""
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  flags = _xla_flags.split(env.get("XLA_FLAGS", ""))[1]
  if flags:
    env["XLA_FLAGS"] = flags
  else:
    env.pop("XLA_FLAGS", None)
  return env


def first_losses(*overrides: str, env=None) -> list[float]:
  """Per-step losses of the default job's first STEPS steps (a subprocess, as users run
  it), with optional extra `--config.x=y` overrides."""
  with tempfile.TemporaryDirectory() as wd:
    cmd = [sys.executable, "-m", "t2mlr_jax.main", f"--config={CONFIG}", f"--workdir={wd}",
           "--progress=false", f"--config.train.stop_after_steps={STEPS}",
           "--config.train.log_every=1", *overrides]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900,
                         env=user_env() if env is None else env)
    if out.returncode != 0:
      raise RuntimeError(out.stderr[-3000:])
    records = [json.loads(line) for line in open(os.path.join(wd, "metrics.jsonl"))]
  losses = [r["loss"] for r in records if r.get("kind") == "train"]
  if len(losses) != STEPS:
    raise RuntimeError(f"expected {STEPS} train records, got {len(losses)}")
  return losses


def _max_rel(a, b):
  return max(abs(x - y) / abs(y) for x, y in zip(a, b))


def _with_xla_flag(flag: str) -> dict:
  env = user_env()
  env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + flag).strip()
  return env


def check() -> int:
  """Rerun the first STEPS steps; 0 if every loss is the committed one within RTOL."""
  import numpy as np
  want = json.load(open(FIXTURE))["losses"]
  got = first_losses()
  moved = [(i + 1, g, w) for i, (g, w) in enumerate(zip(got, want))
           if abs(g - w) > RTOL * abs(w)]
  for step, g, w in moved:
    print(f"step {step}: loss {g:.7g} vs committed {w:.7g}")
  print(f"{STEPS - len(moved)} of {STEPS} losses as committed (largest relative change "
        f"{float(np.max(np.abs(np.subtract(got, want)) / np.abs(want))):.2g}, tolerance {RTOL})")
  return 1 if moved else 0


def main():
  if sys.argv[1:] == ["--check"]:
    sys.exit(check())
  if sys.argv[1:]:
    sys.exit(f"usage: python {sys.argv[0]} [--check]")
  import jax
  sys.path.insert(0, os.path.join(ROOT, "experiments"))
  from s5_default_job import machine
  losses = first_losses()
  # What another x86 CPU does to the numbers, emulated: XLA:CPU generating code for an
  # older instruction set; then changes the guard must catch.
  margins = {}
  for isa in ("AVX2", "AVX", "SSE4_2"):
    margins[f"xla_cpu_max_isa={isa}"] = _max_rel(
        first_losses(env=_with_xla_flag(f"--xla_cpu_max_isa={isa}")), losses)
  margins["xla_cpu_enable_fast_math=true"] = _max_rel(
      first_losses(env=_with_xla_flag("--xla_cpu_enable_fast_math=true")), losses)
  margins["model.init_std=0.021 (the init moved)"] = _max_rel(
      first_losses("--config.model.init_std=0.021"), losses)
  margins["data.group_curriculum=Z2:2000 (the data stream moved)"] = _max_rel(
      first_losses("--config.data.group_curriculum=Z2:2000"), losses)
  with open(FIXTURE, "w") as f:
    json.dump({"what": __doc__.split("\n\n")[0], "steps": STEPS, "rtol": RTOL,
               "losses": losses, "margins": margins,
               "made": {"date": time.strftime("%Y-%m-%d"), **machine(), "jax": jax.__version__}},
              f, indent=1)
  print(json.dumps(margins, indent=1))


if __name__ == "__main__":
  main()
