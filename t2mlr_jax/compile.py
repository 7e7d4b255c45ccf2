"""Compile a config's steps for a TPU slice or a GPU node on any host, before paying for
it: `python -m t2mlr_jax.compile --config=configs/fineweb_135m.py --topology=v5e-256`
(or `--topology=h100-8`, docs/gpu.md).

Builds the train step as the trainer does for that config (the same state shardings,
donated state, batch shapes, mode, gradient accumulation and kernel choice) over the
topology's compile-only devices (TPUs: libtpu, `pip install "jax[tpu]==<the installed
jax>"`; GPUs: JAX's CUDA plugin, `pip install "jax[cuda12]==<the installed jax>"`, no GPU
needed), runs the real TPU or GPU compiler, and prints per device (a chip, a core on
v2 / v3, a GPU): the state (sharded and replicated parts), temporaries, outputs, their
total against the device's memory, the collectives and custom kernels in the program
(Mosaic; cuDNN fused attention and GEMMs), and the cost model's FLOPs with the step time
they take at the device's peak (a floor). `--steps=train,eval,decode` adds the exact eval
step and generate's decode step. Nothing is trained or written besides --output.

Exit status: 0 when every step fits, 3 when one does not (the TPU compiler's
out-of-memory error, or the total above the memory: a TPU's HBM, on a GPU what a JAX
process gets), 2 for a bad config or topology, or the compiler's package missing.
"""

from __future__ import annotations

import json
import os
import sys

from absl import flags
from ml_collections import config_flags

from t2mlr_jax import cli
from t2mlr_jax.accel import platforms

# several compiling processes may load libtpu at once (it locks /tmp/libtpu_lockfile)
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
if "JAX_PLATFORMS" not in os.environ:
  # compile-only devices come from libtpu / the CUDA plugin; the host computes nothing but
  # stays on CPU (libtpu's complaints about missing chips are then harmless, and the CUDA
  # plugin does not look for a GPU)
  platforms.use("cpu")

_CONFIG = config_flags.DEFINE_config_file("config", None, "experiment config file",
                                          lock_config=False)
_TOPOLOGY = flags.DEFINE_string("topology", None, "TPU slice: a name such as v5e-16, v4-32, "
                                "v5p-64, v6e-256 or JAX's GEN:AxB[xC] (e.g. v5e:4x4); GPU "
                                "node: h100-8, h200-8, h200-1, a100-8, l4-1, t4-1, or nodes: "
                                "h100-2x8")
_NUM_SLICES = flags.DEFINE_integer("num_slices", 1, "slices joined over DCN (mesh.data spans "
                                   "them)")
_STEPS = flags.DEFINE_string("steps", "train", "comma-separated: train, eval, decode")
_OUTPUT = flags.DEFINE_string("output", None, "write the report as JSON to this file")
flags.mark_flags_as_required(["config", "topology"])

EXIT_FITS, EXIT_USAGE, EXIT_DOES_NOT_FIT = 0, 2, 3


def main(argv):
  del argv
  config = cli.config_value(_CONFIG)     # a missing config file is an argument error
  # the library (and JAX) load once the flags parse: argument errors print at once
  from t2mlr_jax.accel import aot as compile_report
  steps = tuple(s.strip() for s in _STEPS.value.split(",") if s.strip())
  report = compile_report.compile_config(config, _TOPOLOGY.value, steps=steps,
                                         num_slices=_NUM_SLICES.value, log=_say)
  print(compile_report.format_report(report))
  if _OUTPUT.value:
    with open(_OUTPUT.value, "w") as f:
      json.dump(report, f, indent=2)
  sys.exit(EXIT_FITS if report["fits"] else EXIT_DOES_NOT_FIT)


def _say(message: str) -> None:
  print(message, file=sys.stderr, flush=True)


if __name__ == "__main__":
  cli.run(main)
