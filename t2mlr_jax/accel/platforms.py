"""Which JAX platforms a process uses, decided without importing JAX: the command-line
tools choose before JAX loads (their argument errors print first), and the choice holds
whether or not JAX is imported by then."""

from __future__ import annotations

import glob
import os
import sys

TPU_DEVICE_FILES = ("/dev/accel*", "/dev/vfio/[0-9]*")   # a TPU VM's chips


def host_has_tpu_chips() -> bool:
  """Whether this host is a TPU VM (its chips appear as device files)."""
  return any(glob.glob(pattern) for pattern in TPU_DEVICE_FILES)


def chosen() -> str:
  """The platforms set so far (JAX_PLATFORMS or JAX's config), '' when none was."""
  jax = sys.modules.get("jax")
  from_config = getattr(jax.config, "jax_platforms", None) if jax is not None else None
  return os.environ.get("JAX_PLATFORMS") or from_config or ""


def use(platforms: str) -> None:
  """Make JAX use `platforms` ("cpu", "cuda,cpu"): through JAX_PLATFORMS before JAX is
  imported (it reads the variable then), through its config after."""
  jax = sys.modules.get("jax")
  if jax is None:
    os.environ["JAX_PLATFORMS"] = platforms
  else:
    jax.config.update("jax_platforms", platforms)
