"""Command-line errors: one line naming what is wrong, exit status 2; the traceback only
with --verbose."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "configs", "s5_retrieval.py") + ":tiny"


def _run(*args, cwd):
  return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True,
                        cwd=cwd, timeout=300, env=dict(os.environ, JAX_PLATFORMS="cpu"))


@pytest.mark.parametrize("args,message", [
    (("t2mlr_jax.main", f"--config={TINY}", "--config.train.num_stepz=5"),
     "error: unknown config field --config.train.num_stepz: did you mean num_steps?"),
    (("t2mlr_jax.main", "--config=configs/nope.py"),
     "error: no such file or directory: configs/nope.py"),
    (("t2mlr_jax.main", f"--config={TINY}", "--config.train.num_steps=-1", "--workdir=wd"),
     "error: config field train.num_steps=-1 is invalid: allowed an integer >= 1"),
    (("t2mlr_jax.evaluate", "--workdir=empty"), "error: no checkpoint found under"),
    (("t2mlr_jax.convert", "--from=empty", "--to-hf=out"), "error: no checkpoint found under"),
    (("t2mlr_jax.main", f"--config={TINY}", "--config.train.num_steps=abc", "--workdir=wd"),
     "error: --config.train.num_steps='abc' is invalid: allowed an integer"),
    (("t2mlr_jax.main", f"--config={TINY}", "--bogus=1"),
     "error: unknown command line flag 'bogus'"),
    (("t2mlr_jax.chat", "--model=a_file"),
     "error: --model='a_file' is a file, not a model: allowed a GGUF file"),
    (("t2mlr_jax.evaluate",),
     "error: give --workdir (a training run) or --task/--data/--model"),
    (("t2mlr_jax.evaluate", "--model=a_file"), "error: --model/--data need --task: allowed bpb,"),
    (("t2mlr_jax.main", f"--config={TINY[:-5]}:huge"),
     f"error: unknown variant 'huge' for {TINY[:-5]}: allowed tiny, word, paper, v2"),
    (("t2mlr_jax.evaluate", "--task=foo", "--data=a_file", "--model=a_file"),
     "error: --task='foo' is invalid: allowed one of bpb, gsm8k, math500, hotpotqa, prosqa, arc_easy"),
    (("t2mlr_jax.evaluate", "--workdir=run", "--step=12345"),
     "error: --step=12345 is not saved in run: allowed one of [5, 10]"),
    (("t2mlr_jax.serve", "--model=run", "--step=12345"),
     "error: --step=12345 is not saved in run: allowed one of [5, 10]"),
    (("t2mlr_jax.serve", "--model=no_such_run"), "error: --model='no_such_run' does not exist"),
    (("t2mlr_jax.serve", "--model=run", "--port=abc"),
     "error: --port='abc' is invalid: allowed an integer"),
], ids=["misspelled-field", "missing-config", "bad-value", "evaluate-empty", "convert-empty",
        "flag-type", "unknown-flag", "chat-file", "evaluate-nothing", "evaluate-no-task",
        "unknown-variant", "evaluate-unknown-task", "evaluate-unsaved-step",
        "serve-unsaved-step", "serve-missing-model", "serve-bad-flag"])
def test_errors_are_one_line_with_exit_status_2(tmp_path, args, message):
  (tmp_path / "empty").mkdir()
  (tmp_path / "a_file").write_text("not a model\n")
  for step in (5, 10):                # a workdir's saved steps, as a listing sees them
    (tmp_path / "run" / "checkpoints" / str(step)).mkdir(parents=True)
  run = _run(*args, cwd=tmp_path)
  assert run.returncode == 2, run.stderr[-2000:]
  lines = [line for line in run.stderr.splitlines() if line.strip()]
  assert len(lines) == 1 and lines[0].startswith(message), run.stderr[-2000:]
  assert "Traceback" not in run.stderr


def test_flag_errors_say_what_is_allowed():
  """absl's flag errors as the one line `run` prints (the subprocess case above checks the
  line and the exit status end to end)."""
  from absl import flags

  from t2mlr_jax import cli
  for text, want in [
      ("flag --config.train.num_steps=abc: invalid literal for int() with base 10: 'abc'",
       "--config.train.num_steps='abc' is invalid: allowed an integer"),
      ("flag --progress=maybe: ('Non-boolean argument to boolean flag', 'maybe')",
       "--progress='maybe' is invalid: allowed true or false"),
      ("flag --config.optimizer.lr=fast: could not convert string to float: 'fast'",
       "--config.optimizer.lr='fast' is invalid: allowed a number"),
      ("Unknown command line flag 'bogus'", "unknown command line flag 'bogus'"),
      ("flag --topology=None: Flag --topology must have a value other than None.",
       "--topology is required (--helpshort lists the flags)")]:
    assert cli._flag_error(flags.Error(text)) == want


def test_verbose_keeps_the_traceback(tmp_path):
  run = _run("t2mlr_jax.main", f"--config={TINY}", "--config.train.num_steps=-1",
             "--workdir=wd", "--verbose", cwd=tmp_path)
  assert run.returncode != 0 and "Traceback" in run.stderr
  assert "train.num_steps=-1 is invalid" in run.stderr


def test_convert_refuses_an_existing_export_before_reading_the_source(tmp_path):
  (tmp_path / "out" / "params").mkdir(parents=True)
  # the source does not exist: refusing the output first means it is never opened
  run = _run("t2mlr_jax.convert", "--from-gguf", "missing.gguf", "--to", "out", cwd=tmp_path)
  assert run.returncode == 2, run.stderr[-2000:]
  assert "already exists: refusing to overwrite an export" in run.stderr


def test_a_script_beside_a_clone_named_t2mlr_jax_is_told_what_happened(tmp_path):
  """`import t2mlr_jax` from a script next to the clone finds the clone's folder first: it
  says so and loads the package inside the clone (not an empty namespace package)."""
  (tmp_path / "t2mlr_jax").symlink_to(ROOT, target_is_directory=True)
  (tmp_path / "script.py").write_text(
      "from t2mlr_jax import forward\nimport t2mlr_jax.data.s5_group as s5_group\n"
      "print(forward.__module__, s5_group.VOCAB_SIZE)\n")
  run = subprocess.run([sys.executable, "script.py"], capture_output=True, text=True,
                       cwd=tmp_path, timeout=120, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert run.returncode == 0, run.stderr[-2000:]
  assert run.stdout.split() == ["t2mlr_jax.model.modes", "188"]
  assert "'import t2mlr_jax' found" in run.stderr
  assert "the folder of a t2mlr_jax clone, not the package inside it" in run.stderr


@pytest.mark.slow       # a CLI run (~20 s); test_loop.py checks the non-finite stop in process
def test_a_diverging_run_says_so_once_and_exits_3(tmp_path):
  run = _run("t2mlr_jax.main", f"--config={TINY}", "--workdir=wd", "--progress=false",
             "--config.optimizer.lr=1e30", "--config.optimizer.grad_clip=0",
             "--config.train.num_steps=10", cwd=tmp_path)
  assert run.returncode == 3, run.stderr[-2000:]
  said = run.stdout + run.stderr
  assert said.count("non-finite loss or gradient") == 1, said[-3000:]
  assert "error: non-finite loss or gradient at step" in run.stderr


def _exit_of(argv, prelude=""):
  """A command run as `python -m argv[0] argv[1:]` after `prelude`, in a fresh process: its
  stdout says the exit status, whether JAX and whether the model package were imported."""
  code = (f"import runpy, sys\n{prelude}sys.argv = {argv!r}\n"
          "try:\n"
          f"  runpy.run_module({argv[0]!r}, run_name='__main__', alter_sys=True)\n"
          "except SystemExit as e:\n"
          "  print(e.code, 'jax' in sys.modules, 't2mlr_jax.model' in sys.modules)\n")
  return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                        cwd=ROOT, timeout=300, env=dict(os.environ, JAX_PLATFORMS="cpu"))


@pytest.mark.parametrize("hidden,argv,install", [
    ("fastapi", ["t2mlr_jax.serve", "--model=model.gguf"], '".[serve]"'),
    ("uvicorn", ["t2mlr_jax.serve", "--help"], '".[serve]"'),
    ("lm_eval", ["t2mlr_jax.lm_eval", "--help"], '".[eval]"')],
    ids=["serve", "serve-help", "lm_eval"])
def test_a_missing_extra_is_one_line_naming_its_install(hidden, argv, install):
  """A command whose optional extra is not installed says which, in one line (exit 2),
  before the library or JAX loads."""
  run = _exit_of(argv, f"sys.modules[{hidden!r}] = None\n")
  assert run.stdout.split() == ["2", "False", "False"], (run.stdout, run.stderr[-2000:])
  lines = run.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error:") and install in lines[0], lines


@pytest.mark.parametrize("args", [
    ("t2mlr_jax.main",), ("t2mlr_jax.main", "--config=configs/nope.py"),
    ("t2mlr_jax.main", "--bogus=1"), ("t2mlr_jax.evaluate",),
    ("t2mlr_jax.evaluate", "--task=gsm8k"), ("t2mlr_jax.chat",), ("t2mlr_jax.serve",),
    ("t2mlr_jax.compile", "--topology=v5e-4"),
    ("t2mlr_jax.compile", "--config=configs/nope.py", "--topology=v5e-4"),
    ("t2mlr_jax.convert", "--from-hf=x"), ("t2mlr_jax.convert", "--from=x")],
    ids=["main-nothing", "main-missing-config", "main-unknown-flag", "evaluate-nothing",
         "evaluate-no-data", "chat-no-model", "serve-no-model", "compile-no-config",
         "compile-missing-config", "convert-no-output", "convert-no-hf-output"])
def test_argument_errors_come_before_jax_loads(tmp_path, args):
  """A command's argument errors (a missing or unknown flag, a missing config file) print
  before the library and JAX load (seconds on a busy machine): exit 2, JAX not imported."""
  run = _exit_of(list(args))
  assert run.stdout.split() == ["2", "False", "False"], (run.stdout, run.stderr[-2000:])
  assert "error" in run.stderr and "Traceback" not in run.stderr, run.stderr[-2000:]


def test_a_run_names_its_workdir_first_and_each_variant_has_its_own(tmp_path):
  """Without --workdir a run goes to workdirs/<config stem>[_<variant>]: the first line it
  prints says where (here the run then stops at a bad value, before any training)."""
  from t2mlr_jax.main import default_workdir
  assert default_workdir("configs/s5_retrieval.py:tiny") == os.path.join(
      "workdirs", "s5_retrieval_tiny")
  assert default_workdir("configs/s5_retrieval.py") == os.path.join("workdirs", "s5_retrieval")
  assert default_workdir("/x/configs/lm_gutenberg.py:lrt_shared") == os.path.join(
      "workdirs", "lm_gutenberg_lrt_shared")
  run = _run("t2mlr_jax.main", f"--config={TINY}", "--config.train.num_steps=-1", cwd=tmp_path)
  assert run.returncode == 2, run.stderr[-2000:]
  first = run.stdout.splitlines()[0]
  assert first.startswith(f"workdir: {os.path.join('workdirs', 's5_retrieval_tiny')} "), first


def test_a_missing_tokenizer_names_the_flag(monkeypatch):
  """A workdir without a tokenizer, opened by a command (field --model): the hint names
  the command's flag, --tokenizer."""
  from ml_collections import config_dict

  from t2mlr_jax import checkpoint
  from t2mlr_jax.convert import loading
  monkeypatch.setattr(loading, "_source_format", lambda path, field: "workdir")
  monkeypatch.setattr(checkpoint, "load_config", lambda path, step=None: config_dict.ConfigDict(
      {"data": {"task": "s5_retrieval"}, "model": {"init_from": None}}))
  with pytest.raises(ValueError, match="pass --tokenizer=DIR"):
    loading.find_tokenizer("run", field="--model")
  with pytest.raises(ValueError, match="; pass tokenizer=DIR"):
    loading.find_tokenizer("run")


def test_the_eta_after_a_resume_counts_this_process_steps_only():
  """Resumed at step 5900 of 6000 at 2 steps/s: the ETA is about 50 s, whatever the
  steps before the resume or an evaluation in between took."""
  import io

  from t2mlr_jax.train.metrics import Progress
  now = [0.0]
  out = io.StringIO()
  bar = Progress(6000, 5900, stream=out, clock=lambda: now[0])
  now[0] += 30.0                  # the first step, compiling
  bar.compiled()
  now[0] += 4.5                   # 9 more steps at 2 steps/s
  bar.update(10, loss=1.0)
  with bar.paused():
    now[0] += 300.0               # an evaluation
  now[0] += 5.0
  bar.update(10, loss=0.9)
  lines = out.getvalue().splitlines()
  assert lines[0].endswith("(2 step/s, eta 45s)"), lines
  assert lines[1].endswith("(2 step/s, eta 40s)"), lines
