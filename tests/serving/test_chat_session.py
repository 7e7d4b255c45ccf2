"""Streaming generation and the chat session/CLI (on the tiny GGUF model the tests write)."""

import re
import subprocess
import sys

import jax
import numpy as np
import pytest

from t2mlr_jax import ModelConfig, T2MLRConfig, generate, init_params, stream
from t2mlr_jax.convert.loading import load_model_and_tokenizer
from t2mlr_jax.data.s5_group import S5Tokenizer
from t2mlr_jax.serving.chat_session import ChatSession

from _gguf_fixtures import write_tiny_gguf
from _util import REPO_ROOT, active_params, random_tokens, tiny_cfg

ROOT = REPO_ROOT


@pytest.mark.parametrize("kw", [pytest.param(dict(temperature=0.8, top_k=10,
                                                  rng=jax.random.PRNGKey(3)), marks=pytest.mark.slow),
                                dict(prompt_control_flow=1, eos_id=5)])   # greedy: below
def test_stream_yields_generates_tokens(kw):
  cfg = tiny_cfg(vocab_size=40)
  params = active_params(cfg)
  prompt = random_tokens(cfg, 2, 6)
  want = np.asarray(generate(params, cfg, prompt, max_new_tokens=8, prompt_lengths=[6, 4],
                             **kw))
  got = np.stack(list(stream(params, cfg, prompt, max_new_tokens=8, prompt_lengths=[6, 4],
                             cache_len=32, **kw)), 1)
  n = got.shape[1]
  np.testing.assert_array_equal(got, want[:, :n])
  if n < 8:                                     # stopped early: every row ended
    assert (want[:, n:] == kw["eos_id"]).all()
  with pytest.raises(ValueError, match="cache_len=10 is invalid"):
    next(stream(params, cfg, prompt, max_new_tokens=8, cache_len=10))


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
  path = tmp_path_factory.mktemp("chat") / "tiny.gguf"
  write_tiny_gguf(path)
  return str(path)


def test_chat_session_streams_the_greedy_answer_and_keeps_history(tiny_gguf):
  cfg, params, found = load_model_and_tokenizer(tiny_gguf)
  tok = found.tokenizer
  session = ChatSession(cfg, params, tok, max_new_tokens=12)
  pieces = []
  info = session.reply("To be, or not to be", pieces.append)
  assert "".join(pieces) == info["answer"]
  prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": "To be, or not to be"}]))
  want = np.asarray(generate(params, cfg, np.array([prompt]), max_new_tokens=12,
                             eos_id=tok.eos_id, prompt_control_flow=1))[0].tolist()
  want = want[:want.index(tok.eos_id)] if tok.eos_id in want else want
  assert info["answer"] == tok.decode(want) and info["tokens"] == len(want)
  assert info["compile_s"] > 0 and info["prompt_bucket"] == 64
  again = session.reply("again", lambda s: None)
  assert again["compile_s"] == 0.0            # same prompt bucket and cache: compiled once
  assert [m["role"] for m in session.messages] == ["user", "assistant"] * 2
  history = list(session.messages)
  with pytest.raises(ValueError, match="at most .* fit before the 12 new tokens"):
    session.reply("word " * 200)
  assert session.messages == history           # a refused message loses nothing


def test_a_task_vocabulary_without_a_newline_chats_in_its_own_text():
  """A model of a task with its own vocabulary (S5's: no newline, no chat template) takes
  each turn as typed, joined by the tokenizer's separator, and answers."""
  tok = S5Tokenizer()
  cfg = ModelConfig(vocab_size=tok.vocab_size, d_model=32, n_layers=2, n_heads=2, d_ff=64,
                    max_seq_len=64, recurrence=T2MLRConfig(l_start=0, l_end=0))
  session = ChatSession(cfg, init_params(cfg, jax.random.PRNGKey(0)), tok, max_new_tokens=4)
  first = "ab|cd|<A_21345>"
  assert session._prompt_ids([{"role": "user", "content": first}]) == tok.encode(first)
  info = session.reply(first)
  assert info["tokens"] <= 4 and session.messages[-1]["content"] == info["answer"]
  following = session._prompt_ids(session.messages + [{"role": "user", "content": "<A_12354>"}])
  assert following == tok.encode(first + info["answer"] + "<A_12354>")


def test_chat_cli_one_shot(tiny_gguf):
  out = subprocess.run([sys.executable, "-m", "t2mlr_jax.chat", f"--model={tiny_gguf}",
                        "--prompt=To be", "--max_new_tokens=4", "--stats"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  compiled, timings = out.stdout.strip().splitlines()[-2:]
  assert re.fullmatch(r"\[compiled in [0-9.]+ s: prefill of a 64-token prompt bucket, "
                      r"decode step of a \d+-token cache\]", compiled), compiled
  assert re.fullmatch(r"\[\d+ prompt tokens, \d+ new; first token \d+ ms, "
                      r"(decode [0-9.]+ tokens/s|no decode step)\]", timings), timings
  missing = subprocess.run([sys.executable, "-m", "t2mlr_jax.chat", "--model=/nonexistent"],
                           cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert missing.returncode != 0 and "does not exist" in missing.stderr
