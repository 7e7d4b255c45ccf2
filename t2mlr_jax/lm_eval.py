"""`python -m t2mlr_jax.lm_eval ARGS`: lm-eval's own command line with every model of the
library registered as `t2mlr_jax` (t2mlr_jax.eval.lm_harness, whose docstring lists the
model_args).

    python -m t2mlr_jax.lm_eval --model t2mlr_jax --model_args path=WORKDIR --tasks hellaswag

Every lm-eval flag passes through as given (lm-eval 0.4.13's CLI cannot find a model class
outside its package).
"""

import sys

from t2mlr_jax import cli, registry


def main(argv=None) -> None:
  """`python -m t2mlr_jax.lm_eval ARGS`: lm-eval's command line (`lm-eval ARGS`) with the
  `t2mlr_jax` model registered; `--user_module=FILE.py` (ours, taken out before lm-eval
  reads the rest) is imported first, for a model of a type it registers."""
  # the optional extra `eval`: one line without it, before anything loads
  cli.require_extra(("lm_eval",), "python -m t2mlr_jax.lm_eval", "lm-eval", "eval")
  from lm_eval.__main__ import cli_evaluate

  from t2mlr_jax.eval.lm_harness import T2MLRLM  # registers `t2mlr_jax`
  from t2mlr_jax.train import tasks
  T2MLRLM.own_tokenizer = staticmethod(tasks.own_tokenizer)   # a task workdir's vocabulary
  args = list(sys.argv[1:] if argv is None else argv)
  for path in registry.user_modules_in(args):
    registry.import_user_module(path)
  rest, skip = [], False
  for a in args:
    if skip:
      skip = False
    elif a == "--user_module":
      skip = True
    elif not a.startswith("--user_module="):
      rest.append(a)
  sys.argv = [sys.argv[0]] + rest
  cli_evaluate()


if __name__ == "__main__":
  main()
