"""lm-eval's `local-completions` backend against the server (its remote tokenizer
included) scores lm-eval's own arc_easy on local records as the in-process `t2mlr_jax`
adapter does: acc and acc_norm equal, per-choice log-likelihoods within 1e-5, for a T2MLR
with its recurrence on."""

import json

import jax
import numpy as np
import pytest
from eval.test_lm_harness import _arc_docs, _builtin_task, _lm, _task_manager

from serving.test_server import Running
from t2mlr_jax import T2MLRConfig, init_params
from t2mlr_jax.convert.loading import load_model_and_tokenizer
from t2mlr_jax.serving import server as serving

from _gguf_fixtures import write_tiny_gguf

lm_eval = pytest.importorskip("lm_eval")


def test_local_completions_scores_as_the_in_process_adapter(tmp_path):
  path = tmp_path / "tiny.gguf"
  write_tiny_gguf(path)
  cfg, params, found = load_model_and_tokenizer(str(path))
  cfg = cfg.replace(recurrence=T2MLRConfig(l_start=0, l_end=0), max_seq_len=128)
  params = {**params, "recurrence": dict(init_params(cfg, jax.random.PRNGKey(0))[
      "recurrence"], gamma_rec=np.float32(1.0), gamma_cur=np.float32(0.5))}
  tok = found.tokenizer
  _builtin_task(tmp_path, "arc_easy", _arc_docs(8))
  run = Running(serving.Server(cfg, params, tok, name="tiny", max_batch=4, max_len=128))
  try:
    served = lm_eval.simple_evaluate(
        model="local-completions", model_args={
            "base_url": f"{run.base}/v1/completions", "model": "tiny", "max_length": 128,
            "num_concurrent": 2, "max_retries": 1},
        tasks=["t29_arc_easy"], log_samples=True, task_manager=_task_manager(tmp_path))
  finally:
    run.stop()
  local = lm_eval.simple_evaluate(model=_lm(cfg, params, tok), tasks=["t29_arc_easy"],
                                  log_samples=True, task_manager=_task_manager(tmp_path))
  a, b = served["results"]["t29_arc_easy"], local["results"]["t29_arc_easy"]
  assert (a["acc,none"], a["acc_norm,none"]) == (b["acc,none"], b["acc_norm,none"])
  key = lambda s: s["doc_id"]
  for x, y in zip(sorted(served["samples"]["t29_arc_easy"], key=key),
                  sorted(local["samples"]["t29_arc_easy"], key=key)):
    assert x["arguments"][0][0] == y["arguments"][0][0]              # the same prompts
    np.testing.assert_allclose([r[0][0] for r in x["resps"]], [r[0][0] for r in y["resps"]],
                               atol=1e-5)
    assert json.dumps([r[0][1] for r in x["resps"]]) == json.dumps([r[0][1] for r in y["resps"]])
