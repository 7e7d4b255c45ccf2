"""Checkpoints of the official LRT release (commit a133a67), written by its own code
(tests/golden/lrt_release_checkpoints/, made by make_lrt_release_checkpoints.py): import,
evaluation against the release's own numbers (per pass and sequential), export back
identical, the command line, and the `official` presets of configs/lrt_nanochat.py
against the release's multi-refine training loss (lrt_refine_official_small)."""

import json
import os
import sys

import jax
import numpy as np
import optax
import pytest
import torch

import t2mlr_jax
from t2mlr_jax import checkpoint
from t2mlr_jax.convert import __main__ as convert_cli
from t2mlr_jax.convert.official_lrt import (
  config_from_official,
  config_to_official,
  from_official_lrt,
  load_official_checkpoint,
  save_official_checkpoint,
  schedule_of_mode,
)
from t2mlr_jax.eval.bpb import evaluate_bpb
from t2mlr_jax.sharding import make_mesh
from t2mlr_jax.train.config import model_config, train_config
from t2mlr_jax.train.step import create_state, make_train_step

from _util import REPO_ROOT, TESTS_DIR

RELEASE = os.path.join(TESTS_DIR, "golden", "lrt_release_checkpoints")
SCHEDULES = ("multi_refine", "interleaved")
BPB = 2e-6          # relative: float32 sums over 135 bytes


@pytest.fixture(scope="module")
def release_eval():
  z = np.load(os.path.join(RELEASE, "eval.npz"))
  batch = {"input_ids": z["tokens"], "target_ids": z["targets"]}
  results = json.load(open(os.path.join(RELEASE, "release_eval.json")))["results"]
  return batch, z["token_bytes"], results


@pytest.mark.parametrize("name", SCHEDULES)
def test_release_checkpoint_evaluates_as_the_release(name, release_eval):
  """Exact-mode logits = the release's token-by-token recurrence's (2e-5), and its BPB =
  the release's sequential BPB; the schedule's BPB = its evaluate_bpb (multi_refine:
  every pass's; interleaved: the merged view)."""
  batch, token_bytes, results = release_eval
  cfg, params, schedule, meta = load_official_checkpoint(
      os.path.join(RELEASE, name), rope_table_dtype="float32")   # the driver's table
  assert schedule == name and meta["step"] == 3
  want = results[name]
  logits = t2mlr_jax.forward(params, cfg, batch["input_ids"], mode="exact")
  seq = np.load(os.path.join(RELEASE, "eval.npz"))[f"{name}/sequential_logits"]
  np.testing.assert_allclose(np.asarray(logits)[..., :seq.shape[-1]], seq, atol=2e-5, rtol=0)
  exact = evaluate_bpb(params, cfg, [batch], token_bytes, mode="exact")
  np.testing.assert_allclose(exact["bpb"], want["sequential_bpb"], rtol=BPB)
  ours = evaluate_bpb(params, cfg, [batch], token_bytes, mode=schedule)
  np.testing.assert_allclose(ours["bpb"], want["bpb"], rtol=BPB)
  if name == "multi_refine":
    assert cfg.recurrence.gate_channels == 0 and cfg.schedule_options.refine_passes == 2
    np.testing.assert_allclose(ours["pass_bpb"], want["per_pass_bpb"], rtol=BPB)
    assert ours["pass_bpb"][-1] == ours["bpb"] and len(ours["pass_loss"]) == 3
  else:
    assert cfg.recurrence.gate_channels == 16 and "pass_bpb" not in ours


@pytest.mark.parametrize("name", SCHEDULES)
def test_release_checkpoint_exports_back_identical(name, tmp_path):
  src = os.path.join(RELEASE, name)
  cfg, params, schedule, meta = load_official_checkpoint(src)
  save_official_checkpoint(cfg, params, str(tmp_path), meta["step"], schedule, meta)
  a = torch.load(os.path.join(src, "model_000003.pt"), weights_only=True)
  b = torch.load(tmp_path / "model_000003.pt", weights_only=True)
  assert a.keys() == b.keys()
  for k in a:
    assert torch.equal(a[k], b[k]), k
  assert (json.load(open(os.path.join(src, "meta_000003.json")))
          == json.load(open(tmp_path / "meta_000003.json")))


def test_command_line_round_trip(tmp_path, capsys):
  """--from-official-lrt -> an export (loads like any) -> --to-official-lrt: the same files."""
  src = os.path.join(RELEASE, "multi_refine")
  convert_cli.main(["--from-official-lrt", src, "--to", str(tmp_path / "export")])
  assert "trained with schedule multi_refine" in capsys.readouterr().out
  cfg, _ = checkpoint.load(str(tmp_path / "export"))
  assert cfg.schedule_options.refine_passes == 2
  convert_cli.main(["--from", str(tmp_path / "export"), "--to-official-lrt",
                    str(tmp_path / "back"), "--schedule", "multi_refine"])
  back = torch.load(tmp_path / "back" / "model_000000.pt", weights_only=True)
  orig = torch.load(os.path.join(src, "model_000003.pt"), weights_only=True)
  assert all(torch.equal(orig[k], back[k]) for k in orig) and orig.keys() == back.keys()
  meta = json.load(open(tmp_path / "back" / "meta_000000.json"))
  assert meta["model_config"] == json.load(open(os.path.join(src, "meta_000003.json")))[
      "model_config"]


def test_bad_checkpoints_and_configs_are_refused(tmp_path):
  with pytest.raises(ValueError, match="holds no release checkpoint"):
    load_official_checkpoint(str(tmp_path))
  with pytest.raises(ValueError, match=r"step=7 is invalid: allowed one of \[3\]"):
    load_official_checkpoint(os.path.join(RELEASE, "interleaved"), step=7)
  config = json.load(open(os.path.join(RELEASE, "interleaved", "meta_000003.json")))[
      "model_config"]
  with pytest.raises(ValueError, match="use_interleaved and use_multi_refine"):
    config_from_official({**config, "use_multi_refine": True}, 64)
  cfg, params, _, _ = load_official_checkpoint(os.path.join(RELEASE, "interleaved"))
  with pytest.raises(ValueError, match=r"schedule='chunked' is invalid: allowed one of"):
    config_to_official(cfg, "chunked")
  with pytest.raises(ValueError, match="train.mode='jacobi' has no counterpart"):
    schedule_of_mode(cfg, "jacobi")
  assert schedule_of_mode(cfg, "auto") == "interleaved"
  # e0d0f6e's configs (no a133a67 field) keep its gate width default, 32
  old = {k: v for k, v in config.items() if "multi_refine" not in k and k != "ve_gate_channels"}
  assert config_from_official(old, 64).recurrence.gate_channels == 32


def _lrt_nanochat(variant):
  sys.path.insert(0, os.path.join(REPO_ROOT, "configs"))
  import lrt_nanochat  # noqa: PLC0415  (configs/ is no package: on the path only here)
  return lrt_nanochat.get_config(variant)


def test_official_preset_trains_to_the_releases_loss():
  """configs/lrt_nanochat.py:tiny,official_multi_refine holds the release's defaults (the
  converter's reading of a133a67's GPTConfig defaults), and a train step under the
  preset (its mode, its microbatch averaging, two microbatches) on the golden batch and
  weights reports the release's multi-refinement loss (case k2_width0)."""
  config = _lrt_nanochat("tiny,official_multi_refine")
  preset = model_config(config)
  base = dict(np.load(os.path.join(TESTS_DIR, "golden", "lrt_official_small.npz")))
  base_meta = json.load(open(os.path.join(TESTS_DIR, "golden", "lrt_official_small.json")))
  z = dict(np.load(os.path.join(TESTS_DIR, "golden", "lrt_refine_official_small.npz")))
  case = json.load(open(os.path.join(TESTS_DIR, "golden", "lrt_refine_official_small.json")))[
      "cases"]["k2_width0"]
  release_defaults = {k: v for k, v in case["gpt_config"].items()
                      if k.startswith("multi_refine") or k == "ve_gate_channels"}
  assert release_defaults == {"ve_gate_channels": 0, "multi_refine_num_passes": 2,
                              "multi_refine_detach": False, "multi_refine_loss_weights": []}
  state = {e["name"]: base[e["name"]] for e in base_meta["state_dict"]}
  state.update({k.split("/param/", 1)[1]: v for k, v in z.items()
                if k.startswith("k2_width0/param/")})
  cfg, params = from_official_lrt(state, case["gpt_config"], rope_table_dtype="float32")
  assert preset.recurrence.gate_channels == cfg.recurrence.gate_channels == 0
  assert preset.schedule_options == cfg.schedule_options
  assert preset.rope_table_dtype == "bfloat16"     # the release's table (the golden: fp32)
  t = train_config(config)
  assert (t.mode, t.grad_accum_average) == ("multi_refine", "microbatches")
  mesh = make_mesh({"data": 1}, devices=jax.devices()[:1])
  tx = optax.sgd(0.0)
  step = make_train_step(cfg, tx, lambda s: 0.0, t.mode, mesh, grad_accum_steps=2,
                         grad_accum_average=t.grad_accum_average)
  state0 = create_state(cfg, tx, jax.random.PRNGKey(0), mesh)
  state0 = state0.replace(params=jax.tree.map(lambda a, b: np.asarray(b, a.dtype),
                                              state0.params, params))
  batch = {"input_ids": z["tokens"], "target_ids": z["targets"],
           "control_flow": np.full(z["tokens"].shape, 2, np.int32)}
  _, metrics = step(state0, batch)
  np.testing.assert_allclose(float(metrics["loss"]), case["loss"], atol=1e-5)
  np.testing.assert_allclose(np.asarray(metrics["per_pass_losses"]), case["per_pass_losses"],
                             atol=1e-5)


def test_presets_are_refused_by_name():
  with pytest.raises(ValueError, match="unknown preset 'offical'"):
    _lrt_nanochat("tiny,offical")
  config = _lrt_nanochat("d12,official")
  assert (config.data.task, config.data.documents, config.data.mask_documents) == (
      "lm", "stream", False)
