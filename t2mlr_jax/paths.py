"""Run directories on any filesystem Orbax reads: local paths or URLs (gs://, s3://)
through etils.epath, so the trainer's files (checkpoints, metrics, config, eval JSON)
go where the checkpoints go."""

from __future__ import annotations

from etils import epath


def is_remote(path) -> bool:
  return "://" in str(path)


def resolve(path) -> epath.Path:
  """An epath.Path: local paths made absolute, URLs kept as they are."""
  p = epath.Path(path)
  return p if is_remote(path) else p.resolve()


def write_text(path, text: str) -> None:
  """Write a whole file (a temporary sibling renamed into place on local disks)."""
  p = epath.Path(path)
  if is_remote(p):
    p.write_text(text)        # object stores write whole objects
    return
  tmp = p.with_name(p.name + ".tmp")
  tmp.write_text(text)
  tmp.replace(p)


def saved_steps(workdir) -> list[int]:
  """The steps a training workdir has saved: the directories under workdir/checkpoints
  named by a number (Orbax's unfinished *.orbax-checkpoint-tmp ones are not), listed
  without loading the library; [] when there are none."""
  root = resolve(workdir) / "checkpoints"
  if not root.is_dir():
    return []
  return sorted(int(p.name) for p in root.iterdir() if p.is_dir() and p.name.isdigit())
