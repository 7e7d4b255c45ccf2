"""The suite's compile-speed XLA flags, which conftest.py sets before JAX loads: the test
programs are tiny, so their time goes to compiling. Skipping LLVM's optimisations and
taking XLA:CPU's loop emitters for fusions instead of its newer fusion emitters compiles a
tiny model's jacobi, exact and parallel gradients in 2.2-2.7 s instead of 5.6 s (the first
flag alone). Not for real models: SmolLM2's serving programs compile 2.3 times slower
with the loop emitters (docs/serving.md)."""

COMPILE_SPEED = ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false")


def _name(flag: str) -> str:
  return flag.split("=", 1)[0]


def added(xla_flags: str) -> str:
  """`xla_flags` with each compile-speed flag it does not set already."""
  given = {_name(f) for f in xla_flags.split()}
  return " ".join([*xla_flags.split(), *(f for f in COMPILE_SPEED if _name(f) not in given)])


def split(xla_flags: str) -> tuple[str, str]:
  """(the compile-speed flags in `xla_flags`, the others): what a user's run has is the
  second."""
  speed = {_name(f) for f in COMPILE_SPEED}
  flags = xla_flags.split()
  return (" ".join(f for f in flags if _name(f) in speed),
          " ".join(f for f in flags if _name(f) not in speed))
