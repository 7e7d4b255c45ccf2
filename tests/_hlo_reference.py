"""The optimized XLA:CPU programs of the training steps and decode steps, for a refactor
guard: the plain, Jacobi 16/4 and LRT interleaved S = 2 train steps (as the trainer builds
them, one device) and T2MLR's and LRT's decode steps, each at one fixed small shape.

`canonical(text)` strips what does not change the program (op names, metadata, source
locations); `tests/fixtures/hlo/NAME.hlo.gz` hold the programs as of commit 5f36796
(compiled again under the suite's flags when tests/_xla_flags.py took XLA:CPU's loop
emitters; the code had not changed them) and `test_hlo_reference.py` asks for equality,
so a refactor that changes what XLA runs is seen (and then timed side by side and
explained).

The programs are XLA's: a new jax / jaxlib changes them too (regenerate with it, saying
so). Regenerate (only when a change is meant to change the programs):
    python tests/_hlo_reference.py tests/fixtures/hlo
"""

import gzip
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import conftest  # noqa: E402,F401  (the suite's XLA flags and matmul precision)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from t2mlr_jax import LRTConfig, ModelConfig, T2MLRConfig, init_params, sharding  # noqa: E402
from t2mlr_jax.model import decode  # noqa: E402
from t2mlr_jax.train.config import base_config  # noqa: E402
from t2mlr_jax.train.optimizer import make_optimizer  # noqa: E402
from t2mlr_jax.train.step import abstract_state, make_train_step, state_shardings  # noqa: E402

B, T = 4, 32
BASE = dict(vocab_size=40, d_model=32, n_layers=4, n_heads=4, n_kv_heads=2, d_ff=64,
            max_seq_len=64)
CONFIGS = {
    "plain": (ModelConfig(**BASE), "parallel"),
    "jacobi_16_4": (ModelConfig(**BASE, recurrence=T2MLRConfig(l_start=1, l_end=2),
                                schedule_options=dict(d_forward=16, d_backward=4)),
                    "jacobi"),
    "interleaved_2": (ModelConfig(**BASE, recurrence=LRTConfig(gate_channels=16),
                                  schedule_options=dict(passes=2)),
                      "interleaved"),
}
DECODERS = ("jacobi_16_4", "interleaved_2")


_DEF = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = ")
_HEADER = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) \((.*)\) -> .*\{$")
_PARAM = re.compile(r"([\w.\-]+): ")


def canonical(text: str) -> str:
  """The program without what names or locates its ops: the module's name, the stack-frame
  tables (FileNames ... StackFrames), metadata={...} (op_name, source_file, source_line),
  and every computation, parameter and instruction name, renamed in order of definition
  (a renamed Python argument or field renames XLA's parameters; the program is the same)."""
  text = re.sub(r"^HloModule \S+", "HloModule m", text, flags=re.M)
  lines, kept, skipping = text.splitlines(), [], False
  for line in lines:
    if line == "FileNames":
      skipping = True
    elif skipping and _HEADER.match(line):
      skipping = False
    if not skipping:
      kept.append(re.sub(r",? metadata=\{[^{}]*\}", "", line))
  names = {}
  for line in kept:
    header = _HEADER.match(line)
    if header:
      for name in [header.group(1)] + _PARAM.findall(header.group(2)):
        names.setdefault(name, f"n{len(names)}")
    else:
      d = _DEF.match(line)
      if d:
        names.setdefault(d.group(1), f"n{len(names)}")
  if not names:
    return "\n".join(kept)
  pattern = re.compile(r"(?<![\w.\-])%?(" + "|".join(
      re.escape(n) for n in sorted(names, key=len, reverse=True)) + r")(?![\w.\-])")
  return "\n".join(pattern.sub(lambda m: names[m.group(1)], line) for line in kept)


def _train_step_text(cfg, mode):
  mesh = sharding.make_mesh({"data": 1}, devices=jax.devices()[:1])
  tx, schedule = make_optimizer(base_config().optimizer, 10)
  step = make_train_step(cfg, tx, schedule, mode, mesh)
  state = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                       abstract_state(cfg, tx), state_shardings(cfg, tx, mesh))
  batch = {k: jax.ShapeDtypeStruct((B, T), jnp.int32, sharding=sharding.batch_sharding(mesh))
           for k in ("input_ids", "target_ids", "control_flow")}
  return step.lower(state, batch).compile().as_text()


def _decode_step_text(cfg):
  params = init_params(cfg, jax.random.PRNGKey(0))
  prompt = np.zeros((B, 8), np.int32)
  lengths = np.full((B,), 8, np.int32)
  _, state = decode._prefill_left_padded(params, cfg, prompt, lengths, T, np.full_like(prompt, 2),
                                         True, "exact", None)
  step = jax.jit(lambda p, s, tok: decode.decode_step(p, cfg, s, tok))
  return step.lower(params, state, jnp.zeros((B,), jnp.int32)).compile().as_text()


def programs() -> dict:
  """{name: canonical optimized HLO} of every guarded step."""
  out = {f"train_{name}": canonical(_train_step_text(cfg, mode))
         for name, (cfg, mode) in CONFIGS.items()}
  out.update({f"decode_{name}": canonical(_decode_step_text(CONFIGS[name][0]))
              for name in DECODERS})
  return out


def read(directory: str, name: str) -> str:
  with gzip.open(os.path.join(directory, f"{name}.hlo.gz"), "rt") as f:
    return f.read()


if __name__ == "__main__":
  os.makedirs(sys.argv[1], exist_ok=True)
  for name, text in programs().items():
    # mtime=0: the same program gives the same file
    with open(os.path.join(sys.argv[1], f"{name}.hlo.gz"), "wb") as raw:
      with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as f:
        f.write(text.encode())
    print(f"wrote {name}.hlo.gz ({len(text)} characters)")
