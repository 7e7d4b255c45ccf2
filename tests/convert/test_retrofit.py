"""Retrofit: a pretrained HF model + T2MLR, fine-tuned by main on SFT data, evaluated, exported;
LRT and a user's type added to an HF or GGUF model keep its function at step 0."""

import json
import os
import sys

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from t2mlr_jax import LRTConfig, checkpoint, forward, registry  # noqa: E402
from t2mlr_jax.convert import gguf, hf  # noqa: E402
from t2mlr_jax.convert.__main__ import main as convert_main  # noqa: E402
from t2mlr_jax.convert.pretrained import load_pretrained  # noqa: E402
from t2mlr_jax.data.pipeline import make_iterator  # noqa: E402
from t2mlr_jax.data.tokenizer import load_tokenizer  # noqa: E402
from t2mlr_jax.eval.jobs import evaluate_downstream  # noqa: E402
from t2mlr_jax.losses import cross_entropy  # noqa: E402
from t2mlr_jax.train import tasks  # noqa: E402
from t2mlr_jax.train.config import model_config  # noqa: E402
from t2mlr_jax.train.loop import train  # noqa: E402
from t2mlr_jax.train.metrics import read_metrics  # noqa: E402

from _gguf_fixtures import write_tiny_gguf  # noqa: E402
from _hf_fixtures import gsm8k_aug_records, make_llama_dir, make_tokenizer_dir  # noqa: E402
from _util import REPO_ROOT, forget_modules
from test_user_module import EXAMPLES, user_type_file  # noqa: E402

sys.path.insert(0, os.path.join(REPO_ROOT, "configs"))
import retrofit_smollm2_1p7b_gsm8k as retrofit  # noqa: E402


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
  root = tmp_path_factory.mktemp("pretrained")
  model_dir = str(root / "model")
  make_tokenizer_dir(model_dir)
  make_llama_dir(model_dir, load_tokenizer(model_dir).vocab_size)
  data = root / "train.jsonl"
  data.write_text("\n".join(json.dumps(r) for r in gsm8k_aug_records(40)))
  test = root / "test.jsonl"
  test.write_text("\n".join(json.dumps({"question": r["question"], "answer": r["answer"]})
                            for r in gsm8k_aug_records(6, seed=1)))
  return model_dir, str(data), str(test)


def _config(model_dir, data):
  c = retrofit.get_config("tiny")
  c.model.init_from = model_dir
  c.data.path = data
  return c


def test_retrofit_config_requires_a_model():
  c = retrofit.get_config("tiny")
  c.model.init_from = None           # the tiny variant names a generated base model
  with pytest.raises(ValueError, match="model.init_from"):
    train(c, "/tmp/never-created", progress=False)
  paper = retrofit.get_config()
  r, o = paper.model.recurrence, paper.model.schedule_options
  assert (r.l_start, r.l_end, o.d_forward, o.d_backward, r.gate_gain) == (4, -5, 16, 8, 1e-2)
  assert paper.optimizer.recurrence_lr_mult == 100 and paper.optimizer.b2 == 0.99


def test_convert_cli_export_roundtrip(pretrained, tmp_path):
  model_dir, _, _ = pretrained
  out = str(tmp_path / "export")
  convert_main(["--from-hf", model_dir, "--to", out, "--l_start", "1", "--l_end", "-2"])
  cfg, params = checkpoint.load(out)
  ref_cfg, ref = hf.from_hf(model_dir)
  assert cfg.span == (1, 2)
  assert cfg.recurrence.gate_gain == 1e-2
  tokens = np.arange(12, dtype=np.int32)[None]
  np.testing.assert_allclose(forward(params, cfg, tokens, mode="exact"),
                             forward(ref, ref_cfg, tokens, mode="parallel"), atol=1e-5)
  assert os.path.isfile(os.path.join(out, "tokenizer.json"))


def _logits_agree(cfg, params, base_cfg, base, tokens, exact=True):
  """Step 0 of a retrofit: parallel mode equals the base model, exact mode to 1e-5."""
  want = np.asarray(forward(base, base_cfg, tokens, mode="parallel"))
  np.testing.assert_array_equal(np.asarray(forward(params, cfg, tokens, mode="parallel")), want)
  if exact:
    assert np.abs(np.asarray(forward(params, cfg, tokens, mode="exact")) - want).max() <= 1e-5


def test_lrt_added_to_a_pretrained_model_keeps_its_function(pretrained, tmp_path):
  """LRT's retrofit (init="identity") into an HF Llama and a GGUF file: the base model's
  logits in parallel and exact modes; its export loads back with or without LRT; the
  release's init is refused before anything is read."""
  model_dir, _, _ = pretrained
  tokens = np.arange(12, dtype=np.int32)[None]
  base_cfg, base = hf.from_hf(model_dir)
  out = str(tmp_path / "lrt")
  convert_main(["--from-hf", model_dir, "--to", out, "--recurrence=lrt",
                "--recurrence_field", "init=identity", "--recurrence_field", "source_layer=-2"])
  cfg, params = checkpoint.load(out)
  assert cfg.recurrence == LRTConfig(init="identity", source_layer=-2)
  assert "memory" in params["layers"]
  _logits_agree(cfg, params, base_cfg, base, tokens)
  again_cfg, again = load_pretrained(out, recurrence=cfg.recurrence)    # its own weights
  jax.tree.map(np.testing.assert_array_equal, again, params)
  plain_cfg, plain = load_pretrained(out, recurrence=None)
  assert plain_cfg.recurrence is None and "memory" not in plain["layers"]
  with pytest.raises(ValueError, match=r"from_hf: recurrence=LRTConfig is invalid: "
                                       r"recurrence.init='official' is invalid: allowed "
                                       r"'identity'"):
    hf.from_hf(str(tmp_path / "nowhere"), recurrence=LRTConfig())
  path = str(tmp_path / "tiny.gguf")
  write_tiny_gguf(path, n_layers=2, d_model=32)
  base_cfg, base, _ = gguf.from_gguf(path)
  cfg, params, _ = gguf.from_gguf(path, recurrence=LRTConfig(init="identity"))
  # the same retrofit as from_hf's (exact mode checked above): its weights all start at 0
  assert not any(np.any(leaf) for leaf in jax.tree.leaves(params["layers"]["memory"]))
  _logits_agree(cfg, params, base_cfg, base, tokens, exact=False)


def test_a_users_type_through_the_convert_command(pretrained, tmp_path):
  """`convert --user_module` adds a user's type that declares `retrofit` (echo, α = 0):
  the export records the file and loads as the base model; a type without the
  declaration, or a field of the wrong type, is refused."""
  model_dir, _, _ = pretrained
  mine = user_type_file(tmp_path / "mine", stem="retrofit_echo", name="retrofit_echo",
                        retrofit=True)
  out = str(tmp_path / "export")
  had = set(registry.RECURRENCES.names())
  try:
    convert_main(["--from-hf", model_dir, "--to", out, f"--user_module={mine}",
                  "--recurrence=retrofit_echo", "--l_start=1", "--l_end=2"])
    assert json.load(open(os.path.join(out, "model.json")))["user_modules"][-1] == mine
    cfg, params = checkpoint.load(out)
    assert cfg.recurrence.type == "retrofit_echo" and cfg.span == (1, 2)
    base_cfg, base = hf.from_hf(model_dir)
    _logits_agree(cfg, params, base_cfg, base, np.arange(12, dtype=np.int32)[None])
    with pytest.raises(ValueError, match=r"recurrence=EchoConfig is invalid: allowed None or "
                                         r"a type that declares .* \['lrt', 't2mlr', 'retrofit_echo'\]"):
      convert_main(["--from-hf", model_dir, "--to", str(tmp_path / "echo"),
                    f"--user_module={EXAMPLES}/echo.py", "--recurrence=echo"])
    with pytest.raises(ValueError, match=r"--recurrence_field source_layer='one' is "
                                         "invalid: allowed an int"):
      convert_main(["--from-hf", model_dir, "--to", str(tmp_path / "bad"),
                    "--recurrence=lrt", "--recurrence_field", "source_layer=one"])
  finally:
    for name in {"retrofit_echo", "echo"} - had:
      registry.RECURRENCES.unregister(name)
    forget_modules(EXAMPLES)
    forget_modules(tmp_path)


@pytest.mark.slow       # the chat_and_retrofit notebook covers it too; slow step
def test_finetune_from_pretrained_then_evaluate_and_export(pretrained, tmp_path):
  model_dir, data, test = pretrained
  config = _config(model_dir, data)
  wd = str(tmp_path / "run")
  train(config, wd, progress=False)
  # step 1's loss was computed by the retrofitted model = the pretrained model (γ = 0)
  cfg = model_config(config)
  task = tasks.get_task(config)
  batch = next(make_iterator(task.train_source(config, 8), global_batch=8,
                             seq_len=config.train.seq_len))
  base_cfg, base = hf.from_hf(model_dir)
  logits = forward(base, base_cfg, batch["input_ids"], mode="parallel",
                   positions=batch["positions"], segment_ids=batch["segment_ids"],
                   control_flow=batch["control_flow"])
  expected = float(cross_entropy(logits, batch["target_ids"])[0])
  assert read_metrics(wd)[0]["loss"] == pytest.approx(expected, abs=1e-5)
  assert cfg.recurrence is not None and read_metrics(wd, "eval")[-1]["num_examples"] == 8
  # downstream evaluation of the fine-tuned run
  summary, rows = evaluate_downstream("gsm8k", test, wd, model_dir, max_new_tokens=8,
                                      batch_size=4)
  assert summary["num_examples"] == 6 and len(rows) == 6
  assert 0.0 <= summary["exact_match"] <= 1.0
  # export to HF: transformers loads the base weights
  out = str(tmp_path / "hf")
  convert_main(["--from", wd, "--to-hf", out])
  loaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
  tuned_cfg, tuned = checkpoint.load(wd)
  tokens = np.arange(10, dtype=np.int32)[None]
  with torch.no_grad():
    theirs = loaded(torch.as_tensor(tokens, dtype=torch.long)).logits.numpy()
  np.testing.assert_allclose(forward(tuned, tuned_cfg, tokens, mode="parallel"), theirs,
                             atol=1e-4)


@pytest.mark.slow
def test_variable_assignment_retrofit_arms_start_from_the_same_model(pretrained, tmp_path):
  """configs/retrofit_smollm2_135m_va.py: the T2MLR and no-recurrence arms see the same
  first batch with the same (pretrained) function, so their first losses agree."""
  from t2mlr_jax.data import variable_assignment as va
  sys.path.insert(0, os.path.join(REPO_ROOT, "configs"))
  import retrofit_smollm2_135m_va as va_config
  model_dir, _, _ = pretrained
  data = str(tmp_path / "va.jsonl")
  va.write_sft_jsonl(data, 16, seed=0)
  paper = va_config.get_config()
  r, o = paper.model.recurrence, paper.model.schedule_options
  assert (o.d_forward, o.d_backward, r.gate_gain) == (8, 4, 1e-2)
  assert paper.optimizer.recurrence_lr_mult == 100 and paper.data.chat
  first = {}
  for variant in ("tiny", "tiny_transformer"):
    c = va_config.get_config(variant)
    c.model.init_from, c.data.path = model_dir, data
    wd = str(tmp_path / variant)
    train(c, wd, progress=False)
    cfg, _ = checkpoint.load(wd)
    assert (cfg.recurrence is None) == (variant == "tiny_transformer")
    first[variant] = read_metrics(wd)[0]["loss"]
  assert first["tiny"] == pytest.approx(first["tiny_transformer"], abs=1e-5)
  with pytest.raises(ValueError, match="allowed"):
    va_config.get_config("big")
