"""Hugging Face interop on tiny random models the tests create with transformers."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from t2mlr_jax import T2MLRConfig, checkpoint, forward, generate  # noqa: E402
from t2mlr_jax.convert import hf  # noqa: E402

V = 61


def _llama(tmp_path, name="llama", tied=False, rope=None, **kw):
  torch.manual_seed(0)
  config = transformers.LlamaConfig(
      vocab_size=V, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
      num_key_value_heads=2, intermediate_size=64, max_position_embeddings=128,
      tie_word_embeddings=tied, rope_parameters=rope or {"rope_type": "default",
                                                        "rope_theta": 5000.0}, **kw)
  model = transformers.LlamaForCausalLM(config).eval()
  path = str(tmp_path / name)
  model.save_pretrained(path)
  return model, path


def _qwen2(tmp_path):
  torch.manual_seed(1)
  config = transformers.Qwen2Config(
      vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
      num_key_value_heads=2, intermediate_size=64, max_position_embeddings=128,
      tie_word_embeddings=True)
  model = transformers.Qwen2ForCausalLM(config).eval()
  with torch.no_grad():      # make the q/k/v biases matter
    for layer in model.model.layers:
      for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
        proj.bias.normal_(0, 0.5)
  path = str(tmp_path / "qwen2")
  model.save_pretrained(path)
  return model, path


def _torch_logits(model, tokens):
  with torch.no_grad():
    return model(torch.as_tensor(tokens, dtype=torch.long)).logits.float().numpy()


TOKENS = np.random.RandomState(0).randint(0, V, (2, 20)).astype(np.int32)


@pytest.mark.parametrize("tied", [False, True])
def test_llama_parity(tmp_path, tied):
  model, path = _llama(tmp_path, tied=tied)
  cfg, params = hf.from_hf(path)
  assert cfg.tie_embeddings == tied and cfg.n_kv_heads == 2 and cfg.rope_theta == 5000.0
  ours = np.asarray(forward(params, cfg, TOKENS, mode="parallel"))
  np.testing.assert_allclose(ours, _torch_logits(model, TOKENS), atol=1e-4, rtol=0)


def test_llama3_rope_scaling_parity_and_4x_config_form(tmp_path):
  rope = {"rope_type": "llama3", "rope_theta": 5000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 8}
  model, path = _llama(tmp_path, rope=rope)
  cfg, params = hf.from_hf(path)
  assert cfg.rope_scaling is not None and cfg.rope_scaling.factor == 8.0
  np.testing.assert_allclose(np.asarray(forward(params, cfg, TOKENS, mode="parallel")),
                             _torch_logits(model, TOKENS), atol=1e-4, rtol=0)
  # the transformers 4.x form of the same config.json reads the same
  with open(os.path.join(path, "config.json")) as f:
    c = json.load(f)
  params_5x = c.pop("rope_parameters")
  c["rope_theta"] = params_5x.pop("rope_theta")
  c["rope_scaling"] = params_5x
  assert hf.config_from_hf(c) == cfg


def test_qwen2_parity(tmp_path):
  model, path = _qwen2(tmp_path)
  cfg, params = hf.from_hf(path)
  assert cfg.qkv_bias and cfg.tie_embeddings
  np.testing.assert_allclose(np.asarray(forward(params, cfg, TOKENS, mode="parallel")),
                             _torch_logits(model, TOKENS), atol=1e-4, rtol=0)


def test_sharded_and_bf16_checkpoints(tmp_path):
  model, path = _llama(tmp_path)
  sharded = str(tmp_path / "sharded")
  model.save_pretrained(sharded, max_shard_size="20KB")
  assert os.path.exists(os.path.join(sharded, hf.WEIGHTS_INDEX))
  cfg, params = hf.from_hf(sharded)
  np.testing.assert_allclose(np.asarray(forward(params, cfg, TOKENS, mode="parallel")),
                             _torch_logits(model, TOKENS), atol=1e-4, rtol=0)
  bf16 = str(tmp_path / "bf16")
  model.to(torch.bfloat16).save_pretrained(bf16)
  cfg16, params16 = hf.from_hf(bf16)
  np.testing.assert_array_equal(params16["embed"]["embedding"],
                                model.model.embed_tokens.weight.detach().float().numpy())


def test_to_hf_roundtrip_and_retrofit(tmp_path):
  model, path = _llama(tmp_path)
  rec = T2MLRConfig(l_start=1, l_end=1, gate_gain=1e-2)
  cfg, params = hf.from_hf(path, recurrence=rec)
  base_cfg, base_params = hf.from_hf(path)
  # retrofit: γ = 0, so every mode is the pretrained model
  base = np.asarray(forward(base_params, base_cfg, TOKENS, mode="parallel"))
  np.testing.assert_array_equal(np.asarray(forward(params, cfg, TOKENS, mode="parallel")), base)
  assert np.abs(np.asarray(forward(params, cfg, TOKENS, mode="exact")) - base).max() <= 1e-5
  # give the recurrence something to do, export, re-import: same numbers
  params["recurrence"]["gamma_rec"] = np.float32(0.7)
  out = str(tmp_path / "export")
  hf.to_hf(cfg, params, out)
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
  np.testing.assert_allclose(_torch_logits(reloaded, TOKENS), base, atol=1e-4, rtol=0)
  cfg2, params2 = hf.from_hf(out)
  assert cfg2.recurrence == cfg.recurrence
  np.testing.assert_array_equal(
      np.asarray(forward(params2, cfg2, TOKENS, mode="exact")),
      np.asarray(forward(params, cfg, TOKENS, mode="exact")))
  hf.to_hf(cfg, params, str(tmp_path / "export16"), dtype="bfloat16")
  assert json.load(open(tmp_path / "export16" / "config.json"))["torch_dtype"] == "bfloat16"


def test_to_hf_interrupted_leaves_no_loadable_partial_export(tmp_path, monkeypatch):
  model, path = _llama(tmp_path)
  cfg, params = hf.from_hf(path, recurrence=T2MLRConfig(l_start=1, l_end=1))
  real_save = hf.save_file                 # safetensors.flax.save_file, as hf imports it

  def fail_on_recurrence(tensors, filename):
    real_save(tensors, filename)           # the bytes land, then the process "dies"
    if "recurrence" in filename:
      raise OSError("No space left on device")
  monkeypatch.setattr(hf, "save_file", fail_on_recurrence)
  out = tmp_path / "export"
  with pytest.raises(OSError, match="No space"):
    hf.to_hf(cfg, params, str(out))
  # no config.json (what from_pretrained / from_hf look for) and no half-named files
  assert sorted(os.listdir(out)) == [hf.WEIGHTS]
  monkeypatch.undo()
  hf.to_hf(cfg, params, str(out))          # a retry completes the directory
  assert sorted(os.listdir(out)) == sorted(
      ["config.json", hf.WEIGHTS, hf.RECURRENCE_WEIGHTS, hf.RECURRENCE_CONFIG])
  cfg2, _ = hf.from_hf(str(out))
  assert cfg2.recurrence == cfg.recurrence


def test_an_export_keeps_its_schedule_options_old_layout_too(tmp_path):
  """The recurrence's config file holds the schedules' options under their own key; one
  written when they were recurrence fields (beside l_start ...) loads them the same."""
  _, path = _llama(tmp_path)
  cfg, params = hf.from_hf(path, recurrence=T2MLRConfig(l_start=1, l_end=1))
  cfg = cfg.replace(schedule_options=dict(d_forward=5, d_backward=2))
  out = str(tmp_path / "export")
  hf.to_hf(cfg, params, out)
  assert hf.from_hf(out)[0].schedule_options == cfg.schedule_options
  rec_file = os.path.join(out, hf.RECURRENCE_CONFIG)
  with open(rec_file) as f:
    saved = json.load(f)
  saved.update(saved.pop("schedule_options"))             # the layout before the move
  with open(rec_file, "w") as f:
    json.dump(saved, f)
  old, _ = hf.from_hf(out)
  assert old.recurrence == cfg.recurrence and old.schedule_options == cfg.schedule_options


def test_greedy_generation_matches_transformers(tmp_path):
  model, path = _llama(tmp_path)
  cfg, params = hf.from_hf(path)
  prompt = TOKENS[:, :6]
  ours, logits = generate(params, cfg, prompt, max_new_tokens=10, return_logits=True)
  with torch.no_grad():
    theirs = model.generate(torch.as_tensor(prompt, dtype=torch.long), max_new_tokens=10,
                            do_sample=False, min_new_tokens=10)[:, 6:].numpy()
  top2 = np.sort(np.asarray(logits), -1)[..., -2:]
  decisive = (top2[..., 1] - top2[..., 0]) > 1e-4
  for b in range(2):
    upto = 10 if decisive[b].all() else int(np.argmin(decisive[b]))
    np.testing.assert_array_equal(np.asarray(ours)[b, :upto], theirs[b, :upto])
    assert upto >= 3


def test_bad_checkpoints(tmp_path):
  _, path = _llama(tmp_path)
  with open(os.path.join(path, "model.safetensors"), "r+b") as f:
    f.truncate(200)
  with pytest.raises(ValueError, match="safetensors"):
    hf.from_hf(path)
  os.remove(os.path.join(path, "model.safetensors"))
  with pytest.raises(ValueError, match="model.safetensors"):
    hf.from_hf(path)
  with pytest.raises(ValueError, match="config.json"):
    hf.from_hf(str(tmp_path / "nowhere"))
  base = {"vocab_size": V, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
          "intermediate_size": 64}
  with pytest.raises(ValueError, match="architecture"):
    hf.config_from_hf({**base, "architectures": ["GPT2LMHeadModel"]})
  with pytest.raises(ValueError, match="yarn"):
    hf.config_from_hf({**base, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
  with pytest.raises(ValueError, match="hidden_act"):
    hf.config_from_hf({**base, "hidden_act": "gelu"})


def test_models_a_llama_config_cannot_hold_are_refused(tmp_path):
  """to_hf writes nothing for backbone options or recurrence types the HF Llama format
  cannot express; the loaders refuse LRT before reading any weights."""
  from t2mlr_jax import LRTConfig, ModelConfig, init_params
  from t2mlr_jax.convert import gguf, hf
  for cfg, field in ((ModelConfig(qk_norm=True), "qk_norm"),
                     (ModelConfig(logit_softcap=15.0), "logit_softcap"),
                     (ModelConfig(rope_theta=None), "NoPE"),
                     (ModelConfig(recurrence=LRTConfig()), "LRTConfig")):
    params = init_params(cfg, jax.random.PRNGKey(0))
    with pytest.raises(ValueError, match=field):
      hf.to_hf(cfg, params, str(tmp_path / field))
    assert not (tmp_path / field).exists()
  # the command line refuses before its tokenizer note, leaving no directory
  nope = ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=2, d_ff=64, rope_theta=None)
  checkpoint.export(nope, init_params(nope, jax.random.PRNGKey(0)), str(tmp_path / "nope"))
  run = subprocess.run([sys.executable, "-m", "t2mlr_jax.convert", f"--from={tmp_path / 'nope'}",
                        f"--to-hf={tmp_path / 'nope_hf'}"], capture_output=True, text=True,
                       timeout=300, env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert run.returncode == 2 and "NoPE" in run.stderr, run.stderr[-2000:]
  assert run.stdout == "" and not (tmp_path / "nope_hf").exists()
  for load in (lambda: hf.from_hf(str(tmp_path), recurrence=LRTConfig()),
               lambda: gguf.from_gguf(str(tmp_path / "none.gguf"), recurrence=LRTConfig())):
    with pytest.raises(ValueError, match="recurrence=LRTConfig is invalid"):
      load()


def test_a_context_longer_than_the_pretrained_one_is_logged(tmp_path, caplog):
  import logging

  from t2mlr_jax.convert.pretrained import pretrained_config
  (tmp_path / "config.json").write_text(json.dumps(dict(
      architectures=["LlamaForCausalLM"], hidden_size=32, num_attention_heads=2,
      num_hidden_layers=2, intermediate_size=64, vocab_size=64,
      max_position_embeddings=128)))
  with caplog.at_level(logging.WARNING):
    assert pretrained_config(str(tmp_path), max_seq_len=64).max_seq_len == 64
  assert "exceeds the pretrained model's context" not in caplog.text
  with caplog.at_level(logging.WARNING):
    assert pretrained_config(str(tmp_path), max_seq_len=512).max_seq_len == 512
  assert "model.max_seq_len=512 exceeds the pretrained model's context of 128" in caplog.text
