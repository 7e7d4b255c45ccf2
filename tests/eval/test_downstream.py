"""Downstream evaluation: log-likelihood multiple choice and generation accounting."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("transformers")

from t2mlr_jax import ModelConfig, T2MLRConfig, init_params  # noqa: E402
from t2mlr_jax.data import prosqa, sft  # noqa: E402
from t2mlr_jax.data.multiple_choice import MCExample  # noqa: E402
from t2mlr_jax.data.tokenizer import load_tokenizer  # noqa: E402
from t2mlr_jax.eval import answers, downstream  # noqa: E402

from _hf_fixtures import gsm8k_aug_records, make_tokenizer_dir  # noqa: E402
from _util import prosqa_distractor_response  # noqa: E402


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
  return load_tokenizer(make_tokenizer_dir(str(tmp_path_factory.mktemp("tok"))))


def _hand_built(tok, favourite: str):
  """A model that predicts `favourite` after every token: layers write nothing, every
  embedding shares one direction, and only `favourite`'s head row reads it."""
  cfg = ModelConfig(vocab_size=tok.vocab_size, d_model=16, n_layers=2, n_heads=2, d_ff=32,
                    max_seq_len=128, recurrence=T2MLRConfig(l_start=0, l_end=0))
  params = init_params(cfg, jax.random.PRNGKey(0))
  params["layers"]["attn"]["o"]["kernel"] = jnp.zeros_like(params["layers"]["attn"]["o"]["kernel"])
  params["layers"]["mlp"]["down"]["kernel"] = jnp.zeros_like(
      params["layers"]["mlp"]["down"]["kernel"])
  emb = np.asarray(params["embed"]["embedding"]).copy()
  emb[:, 0] = 1.0
  params["embed"]["embedding"] = jnp.asarray(emb)
  head = np.zeros((16, tok.vocab_size), np.float32)
  head[0, tok.encode(favourite)[0]] = 8.0
  params["lm_head"] = {"kernel": jnp.asarray(head)}
  return cfg, params


def test_multiple_choice_picks_the_preferred_choice(tok):
  cfg, params = _hand_built(tok, "7")
  examples = [MCExample("question : how many ?", ["3", "7", "9"], 1),
              MCExample("what is it ?", ["7 7", "3 4"], 0),
              MCExample("so total", ["5", "6"], 1)]      # no 7: both equally unlikely
  summary, rows = downstream.evaluate_multiple_choice("arc_easy", params, cfg, tok, examples,
                                                      batch_size=4)
  assert [r["pred"] for r in rows[:2]] == [1, 0]
  assert rows[0]["logliks"][1] > rows[0]["logliks"][0] + 5
  assert summary["num_examples"] == 3 and summary["acc"] == pytest.approx(2 / 3)


def test_loglik_equals_forward(tok):
  cfg, params = _hand_built(tok, "7")
  ctx, cont = tok.encode("how many is 3 + 4 ?"), tok.encode("7 .")
  got = downstream.sequence_logliks(params, cfg, [(ctx, cont)], batch_size=2)[0]
  from t2mlr_jax import forward
  seq = np.asarray([ctx + cont], np.int32)
  logp = jax.nn.log_softmax(forward(params, cfg, seq, mode="exact"), -1)[0]
  want = sum(float(logp[len(ctx) - 1 + i, t]) for i, t in enumerate(cont))
  assert got == pytest.approx(want, abs=1e-4)


def test_generation_accounting(tok):
  cfg = ModelConfig(vocab_size=tok.vocab_size, d_model=16, n_layers=2, n_heads=2, d_ff=32,
                    max_seq_len=128, recurrence=T2MLRConfig(l_start=0, l_end=1))
  params = init_params(cfg, jax.random.PRNGKey(1))
  records = gsm8k_aug_records(4)
  prompts = [r["question"] + "\n\n" for r in records]
  texts = downstream.generate_texts(params, cfg, tok, prompts, max_new_tokens=6, batch_size=3)
  # make half of the golds agree with what the model will extract
  for i, r in enumerate(records):
    r["answer"] = answers.extract_gsm8k(texts[i]) if i % 2 == 0 else "123456"
  summary, rows = downstream.evaluate_generation("gsm8k", params, cfg, tok, records,
                                                 max_new_tokens=6, batch_size=3)
  assert [row["completion"] for row in rows] == texts
  expected = np.mean([answers.gsm8k_match(t, r["answer"])["spec"] for t, r in zip(texts, records)])
  assert summary["exact_match"] == pytest.approx(expected)
  assert {"strict_match", "flexible_match"} <= set(summary)


def test_multiple_choice_perfect_wrong_and_half(tok):
  """acc and acc_norm of the model that always prefers "7": 1 when every label is the
  "7" choice, 0 when no label is, 1/2 for one of each (choices of equal length: acc_norm
  picks as acc)."""
  cfg, params = _hand_built(tok, "7")
  right = [MCExample("how many ?", ["3", "7"], 1), MCExample("what is it ?", ["7", "9"], 0)]
  wrong = [MCExample("how many ?", ["3", "7"], 0), MCExample("what is it ?", ["7", "9"], 1)]
  for examples, want in ((right, 1.0), (wrong, 0.0), ([right[0], wrong[1]], 0.5)):
    summary, rows = downstream.evaluate_multiple_choice("arc_easy", params, cfg, tok, examples,
                                                        batch_size=4)
    assert (summary["acc"], summary["acc_norm"]) == (want, want)
    assert [r["pred"] for r in rows] == [1, 0]


def test_prosqa_is_prompted_as_trained_and_scored_by_answer_and_chain(tok, tmp_path,
                                                                     monkeypatch):
  """`prosqa` records (a Coconut-layout JSON list) are prompted in the GSM8K-Aug layout as
  their SFT records train (chat template when asked); a completion equal to the gold
  response scores 1 on answer and chain, the distractor's answer 0 on the answer, a walk
  through a fact the question lacks 0 on the chain."""
  examples = [prosqa.generate_example(i, num_concepts=8, depth_min=2, depth_max=3)
              for i in range(4)]
  path = tmp_path / "prosqa_test.json"
  path.write_text(json.dumps([prosqa.sft_record(ex) for ex in examples]))
  records = prosqa.read_prosqa(str(path))
  seen = {}

  def fake(params, cfg, tokenizer, prompts, **kwargs):
    seen.update(prompts=prompts, kwargs=kwargs)
    return [prosqa.response_text(examples[0]), prosqa.response_text(examples[1]),
            prosqa_distractor_response(examples[2]),
            "Every nothing is a thing.\n" + prosqa.response_text(examples[3])]
  monkeypatch.setattr(downstream, "generate_texts", fake)
  summary, rows = downstream.evaluate_generation("prosqa", None, None, tok, records, chat=True,
                                                 max_new_tokens=9)
  assert seen["prompts"] == [sft.prompt_and_response(r, "gsm8k_aug", tok, True)[0]
                             for r in records]
  assert seen["kwargs"] == {"max_new_tokens": 9}
  assert summary == {"task": "prosqa", "num_examples": 4, "answer_acc": 0.75,
                     "path_valid_acc": 0.75}
  assert [(r["answer_correct"], r["path_valid"]) for r in rows] == [
      (True, True), (True, True), (False, True), (True, False)]
