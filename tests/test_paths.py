"""Run directories through etils.epath: URLs kept whole, local paths absolute, whole-file
writes, and metrics written the object-store way (rewrite, never append)."""

import json
import os

from t2mlr_jax import paths
from t2mlr_jax.train import metrics as metrics_lib


def test_resolve_keeps_urls_and_absolutises_local_paths(tmp_path, monkeypatch):
  assert str(paths.resolve("gs://bucket/runs/s5") / "checkpoints") == "gs://bucket/runs/s5/checkpoints"
  assert paths.is_remote("gs://b/x") and not paths.is_remote("/tmp/x")
  monkeypatch.chdir(tmp_path)
  assert str(paths.resolve("run")) == os.path.join(str(tmp_path), "run")


def test_write_text_replaces_whole_files(tmp_path):
  target = tmp_path / "summary.json"
  paths.write_text(target, "one")
  paths.write_text(target, "two")
  assert target.read_text() == "two" and sorted(os.listdir(tmp_path)) == ["summary.json"]


def test_metrics_writer_on_an_object_store_rewrites_instead_of_appending(tmp_path, monkeypatch):
  local, remote = tmp_path / "local", tmp_path / "remote"
  for root in (local, remote):
    root.mkdir()
  appends = []
  monkeypatch.setattr(paths, "is_remote", lambda p: str(p).startswith(str(remote)))
  for root in (local, remote):
    w = metrics_lib.MetricsWriter(str(root))
    for step in (1, 2, 3):
      w.write(step, {"loss": 1.0 / step})
    w.truncate_after(2)
    w.write(3, {"loss": 0.25})
    w.close()
    appends.append(metrics_lib.read_metrics(str(root)))
  assert appends[0] == appends[1] == [{"step": 1, "kind": "train", "loss": 1.0},
                                      {"step": 2, "kind": "train", "loss": 0.5},
                                      {"step": 3, "kind": "train", "loss": 0.25}]
  # a resumed writer on the object store keeps what was there
  w = metrics_lib.MetricsWriter(str(remote))
  w.write(4, {"loss": 0.2})
  w.close()
  lines = (remote / "metrics.jsonl").read_text().splitlines()
  assert [json.loads(line)["step"] for line in lines] == [1, 2, 3, 4]
