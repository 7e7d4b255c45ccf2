"""How the command-line tools fail: one line naming what is wrong and exit status 2 for a
bad config value, a misspelled field, a missing file or an empty workdir; the traceback
only with --verbose. Training that diverges exits 3 (train.loop.NonFiniteLossError)."""

from __future__ import annotations

import errno
import importlib
import importlib.util
import os
import re
import sys
from typing import Callable, Optional, Sequence

from absl import app, flags, logging

from t2mlr_jax import paths, registry
from t2mlr_jax.accel import platforms
from t2mlr_jax.config import unknown_field

USAGE_ERRORS = (ValueError, TypeError, KeyError, AttributeError, LookupError, OSError)


def one_line(error: BaseException, args: Sequence[str] = ()) -> str:
  """The error's message on one line (config_dict's and config_flags' span several); a
  misspelled config field is named as the command line gave it."""
  if isinstance(error, OSError) and error.errno == errno.ENOENT and error.filename:
    return f"no such file or directory: {error.filename}"
  text = str(error.args[0]) if len(error.args) == 1 else str(error)
  text = " ".join(text.replace("\\n", "\n").replace("\\'", "'").split())
  missing = re.search(r"No such file or directory: '([^']+)'", text)
  if missing:
    return f"no such file or directory: {missing.group(1)}"
  typo = re.search(r"'(\w+)'.*Did you mean \"(\w+)\"", text)
  if typo:
    wrong, right = typo.groups()
    given = next((a.split("=")[0] for a in args if a.startswith("--config.")
                  and a.split("=")[0].endswith("." + wrong)), wrong)
    return f"unknown config field {given}: did you mean {right}?"
  missing = re.fullmatch(r"\"?'(\w+)'\"?", text)   # config_dict's KeyError: a field it lacks
  given = missing and next((a for a in args if a.startswith("--config.")
                            and a.split("=")[0].endswith("." + missing.group(1))), None)
  if given:
    return unknown_field(given.split("=")[0][len("--config."):], given.partition("=")[2])
  return text


def _verbose(args: Sequence[str]) -> bool:
  return any(a in ("--verbose", "--verbose=true", "--verbose=True") for a in args) or \
      os.environ.get("T2MLR_VERBOSE") == "1"


def _report(e: BaseException, args: Sequence[str]) -> None:
  # config_flags wraps a missing config file's error: report the innermost cause
  cause = e
  while cause.__cause__ is not None or cause.__context__ is not None:
    cause = cause.__cause__ or cause.__context__
  shown = cause if isinstance(cause, OSError) and cause.filename else e
  print(f"error: {one_line(shown, args)} (--verbose for the traceback)", file=sys.stderr)
  sys.exit(2)


_FLAG_TYPES = (("invalid literal for int()", "an integer"),
               ("could not convert string to float", "a number"),
               ("Non-boolean argument to boolean flag", "true or false"))


def _config_file_error(value: str, text: str) -> str:
  """A config file's get_config error (ml_collections gives its whole traceback) as its
  last line; an unknown variant names the file and the allowed variants."""
  lines = [line.strip() for line in text.splitlines() if line.strip()]
  last = re.sub(r"^[\w.]*(Error|Exception): ", "", lines[-1]) if lines else text
  path = value.strip("'\"").partition(":")[0]
  unknown = re.match(r"unknown variant ('[^']*')[:,]? allowed (.*)$", last)
  if not unknown:
    return f"{path}: {last}"
  names = re.findall(r"'([^']*)'", unknown.group(2))
  allowed = ", ".join(n for n in names if n) + (" or none" if "" in names else "")
  return f"unknown variant {unknown.group(1)} for {path}: allowed {allowed}"


def _flag_error(error: BaseException) -> str:
  """absl's flag error on one line; a value of the wrong type says what is allowed
  ('--config.train.num_steps='abc' is invalid: allowed an integer')."""
  raw = str(error)
  parsing = re.match(r"flag --[\w.]+=(.*?): Error whilst parsing config file:", raw)
  if parsing:
    return _config_file_error(parsing.group(1), raw)
  text = " ".join(raw.split())
  bad = re.match(r"flag (--[\w.]+)=(.*?): (.*)$", text)
  if bad:
    name, value, why = bad.groups()
    if "must have a value other than None" in why:     # mark_flags_as_required
      return f"{name} is required (--helpshort lists the flags)"
    allowed = next((a for key, a in _FLAG_TYPES if key in why), None)
    return f"{name}={value!r} is invalid: " + (f"allowed {allowed}" if allowed else why)
  return text[:1].lower() + text[1:]


def _parse_flags(argv: Sequence[str]):
  """absl's flag parsing with a bad flag or flag value reported as one line, exit 2
  (absl itself prints two lines and exits 1)."""
  try:
    return flags.FLAGS(list(argv))
  except flags.Error as e:
    if _verbose(argv):
      raise
    message = _flag_error(e)
    if "--helpshort" not in message and "Error whilst parsing config file" not in str(e):
      message += " (--helpshort lists the flags)"
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def config_value(holder):
  """The experiment config a `config_flags` flag holds. ml_collections keeps a config
  file's load error (a missing file, a failing get_config) until the config is first
  read: read it here, so the error comes before the library loads."""
  config = holder.value
  config.keys()
  return config


def import_user_modules(args: Sequence[str]) -> list[str]:
  """Import the files a command line names with --user_module (fairseq's --user-dir):
  each registers its recurrence types and schedules before the config file, which may
  name them, is read. Returns their paths."""
  paths = registry.user_modules_in(args)
  for path in paths:
    registry.import_user_module(path)
  return paths


def skip_absent_tpu() -> Optional[str]:
  """With libtpu installed (jax[tpu], for compiling) on a host without TPU chips, JAX
  would try the TPU backend first and print libtpu's initialisation errors before
  falling back. Unless JAX_PLATFORMS is set, leave it out: the platforms this host has
  (the CUDA plugin's, then the CPU). Returns the platforms chosen, or None (untouched).
  Compiling for TPUs needs no TPU backend: the compile tool's devices are libtpu's
  compile-only ones."""
  if platforms.chosen():
    return None
  if importlib.util.find_spec("libtpu") is None:
    return None
  if platforms.host_has_tpu_chips():
    return None
  cuda = any(importlib.util.find_spec(m) is not None
             for m in ("jax_cuda12_plugin", "jax_cuda13_plugin"))
  choice = "cuda,cpu" if cuda else "cpu"
  platforms.use(choice)
  return choice


def run(main: Callable, argv: Optional[Sequence[str]] = None) -> None:
  """absl's app.run(main) with usage errors reported as one line (exit 2); --verbose (or
  T2MLR_VERBOSE=1) keeps the traceback. --user_module=FILE.py[,...] is imported first.
  A host without TPU chips skips the TPU backend even with libtpu installed."""
  skip_absent_tpu()
  if "verbose" not in flags.FLAGS:
    flags.DEFINE_bool("verbose", False, "show the full traceback of an error")
  if "user_module" not in flags.FLAGS:
    flags.DEFINE_string("user_module", None, "comma-separated Python files imported first; "
                        "they register their own recurrence types and schedules "
                        "(docs/design.md, docs/examples/)")
  args = list(sys.argv if argv is None else argv)

  def one_line_usage(argv):
    quiet_absl_logs()      # no library INFO lines (Orbax's) before a one-line error
    try:
      return main(argv)
    except app.UsageError as e:        # absl would print the whole usage and exit 1
      raise ValueError(str(e)) from None

  try:
    import_user_modules(args)
    app.run(one_line_usage, argv=args, flags_parser=_parse_flags)
  except USAGE_ERRORS as e:
    if _verbose(args):
      raise
    _report(e, args)


def guard(main: Callable[[], None], argv: Optional[Sequence[str]] = None) -> None:
  """main() of an argparse tool, its usage errors reported as `run` does (give the parser
  a --verbose flag). A host without TPU chips skips the TPU backend, as `run`."""
  skip_absent_tpu()
  try:
    main()
  except USAGE_ERRORS as e:
    args = list(sys.argv if argv is None else argv)
    if _verbose(args):
      raise
    _report(e, args)


def require_extra(modules: Sequence[str], command: str, needs: str, extra: str) -> None:
  """Exit 2 with one line naming the extra to install when an optional dependency of
  `command` is missing (checked first: --help too, before the library loads)."""
  for name in modules:
    try:
      importlib.import_module(name)
    except ImportError as e:
      print(f"error: {e}: {command} needs {needs}: pip install -e \".[{extra}]\"",
            file=sys.stderr)
      sys.exit(2)


def check_step(workdir: str, step: Optional[int], flag: str = "--step") -> None:
  """A --step the training workdir has not saved: ValueError listing the steps it has,
  before the library loads (no steps saved, or no workdir: left to the loader)."""
  saved = paths.saved_steps(workdir) if step is not None else []
  if saved and step not in saved:
    raise ValueError(f"{flag}={step} is not saved in {workdir}: allowed one of {saved}")


def quiet_absl_logs() -> None:
  """Orbax logs every checkpoint step at INFO: keep command-line runs to warnings
  unless --verbosity was given."""
  if "verbosity" in flags.FLAGS and not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
