"""Pretraining on a prepared dataset end to end: the `lm` task, bits per byte in three
views, resuming mid-epoch, `evaluate --task=bpb`, and bad data configs."""

import importlib.util
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from t2mlr_jax import checkpoint
from t2mlr_jax.data import prepare
from t2mlr_jax.eval.jobs import evaluate_bpb_task
from t2mlr_jax.train import loop
from t2mlr_jax.train.metrics import read_metrics

from _util import REPO_ROOT

ROOT = REPO_ROOT
TEXT = ["Full fathom five thy father lies; of his bones are coral made. " * 3,
        "Those are pearls that were his eyes: nothing of him that doth fade, " * 2,
        "But doth suffer a sea-change into something rich and strange.",
        "Sea-nymphs hourly ring his knell: Ding-dong. Hark! now I hear them. " * 4]


def _module(name):
  spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "configs",
                                                                   f"{name}.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _config(data, **train):
  c = _module("lm_gutenberg").get_config("tiny")
  c.data.path = data
  c.train.update(**train)
  return c


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  d = tmp_path_factory.mktemp("corpus")
  (d / "train.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXT))
  (d / "valid.jsonl").write_text(json.dumps({"text": "Come unto these yellow sands, and "
                                                     "then take hands: curtsied when you "
                                                     "have and kiss'd the wild waves whist."})
                                 + "\n")
  out = str(d / "prepared")
  prepare.prepare(str(d / "train.jsonl"), out, validation=str(d / "valid.jsonl"),
                  block_size=32, progress=False)
  return out


def _same_params(a, b):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.slow       # an LM training run; the lrt_pretraining notebook and this run in the slow step
def test_train_resume_and_bits_per_byte_in_three_views(data, tmp_path):
  """A run stopped after 2 steps and resumed (Grain state from the checkpoint: the next
  unseen blocks) ends with the parameters of an uninterrupted run; evaluations report
  bits per byte exactly, with zero memory and in the Jacobi view; evaluate --task=bpb
  reproduces the final numbers."""
  straight, split = str(tmp_path / "straight"), str(tmp_path / "split")
  loop.train(_config(data), straight, progress=False)
  loop.train(_config(data, stop_after_steps=2), split, progress=False)
  loop.train(_config(data), split, progress=False)
  _same_params(checkpoint.load(straight)[1], checkpoint.load(split)[1])
  final = read_metrics(straight, "eval")[-1]
  assert final["step"] == 4 and set(final) >= {"bpb", "loss", "parallel", "jacobi"}
  for view in ("parallel", "jacobi"):
    assert np.isfinite(final[view]["bpb"]) and final[view]["bytes"] == final["bytes"]
  result = evaluate_bpb_task(data, straight, blocks=8)
  assert list(result["views"]) == ["parallel", "jacobi", "exact"]
  assert result["views"]["exact"]["bpb"] == pytest.approx(final["bpb"], rel=1e-5)
  assert result["views"]["parallel"]["bpb"] == pytest.approx(final["parallel"]["bpb"],
                                                             rel=1e-5)
  assert result["views"]["jacobi"]["bpb"] == pytest.approx(final["jacobi"]["bpb"], rel=1e-5)


@pytest.mark.slow       # an LM run and an evaluate process
def test_multi_refine_on_a_stream_is_scored_per_pass(data, tmp_path):
  """Blocks read as one stream (data.documents="stream", the LRT release's) train under
  multi_refine; evals add every pass's bits per byte (the last = the mode's), and
  `evaluate --task=bpb --mode=multi_refine,exact` reproduces them."""
  wd = str(tmp_path / "run")
  c = _config(data)
  c.data.update(documents="stream", mask_documents=False)
  c.train.mode = "multi_refine"
  c.model.schedule_options.refine_passes = 2
  loop.train(c, wd, progress=False)
  final = read_metrics(wd, "eval")[-1]["multi_refine"]
  assert len(final["pass_bpb"]) == 3 and final["pass_bpb"][-1] == final["bpb"]
  out = subprocess.run([sys.executable, "-m", "t2mlr_jax.evaluate", "--task=bpb",
                        f"--data={data}", f"--model={wd}", "--mode=multi_refine,exact",
                        "--blocks=8"],
                       cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  views = json.loads(out.stdout)["views"]
  assert list(views) == ["multi_refine", "exact"]
  np.testing.assert_allclose(views["multi_refine"]["pass_bpb"], final["pass_bpb"], rtol=1e-5)
  bad = subprocess.run([sys.executable, "-m", "t2mlr_jax.evaluate", "--task=bpb",
                        f"--data={data}", f"--model={wd}", "--mode=exact,sideways"],
                       cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
  assert bad.returncode != 0 and "--mode='exact,sideways' is invalid" in bad.stderr


@pytest.mark.parametrize("edit,match", [
    (lambda c: c.model.update(max_seq_len=16), "model.max_seq_len=16.*block size 32"),
    (lambda c: c.train.update(seq_len=16), "train.seq_len=16.*32, the block size"),
    (lambda c: c.data.update(path="/nonexistent"), "data.path=.*not a prepared dataset"),
    (lambda c: c.model.update(vocab_size=100), "model.vocab_size=100.*>= 259"),
    (lambda c: c.data.update(eval_split="test"), "data.eval_split=.*'train', 'validation'"),
])
def test_bad_data_configs_name_the_field(data, tmp_path, edit, match):
  c = _config(data)
  edit(c)
  with pytest.raises(ValueError, match=match):
    loop.train(c, str(tmp_path / "run"), progress=False)
  assert not os.path.exists(tmp_path / "run" / "checkpoints")


@pytest.mark.parametrize("name,reference,arms", [
    ("lm_gutenberg", "transformer",
     ("t2mlr", "t2mlr_all", "lrt", "lrt_shared", "lrt_layerwise")),
    ("fineweb_135m", "transformer", ("", "all_layers")),
])
def test_pretraining_arms_are_parameter_matched(name, reference, arms):
  """Every variant validates; the comparison's arms are within 2% of the transformer's
  parameters (LRT's value embeddings would count: the Gutenberg arm has none)."""
  from t2mlr_jax.train.config import validate
  module = _module(name)
  for variant in module.VARIANTS:
    validate(module.get_config(variant))
  base = validate(module.get_config(reference)).num_params()
  for arm in arms:
    assert abs(validate(module.get_config(arm)).num_params() / base - 1) < 0.02, arm
