"""docs/api.md is generated from the docstrings (docs/gen_api.py) and must match them."""

import os

import t2mlr_jax

from _util import load_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _gen_api():
  return load_file("docs", "gen_api.py")


def test_api_md_is_up_to_date():
  text, _ = _gen_api().generate()
  with open(os.path.join(ROOT, "docs", "api.md"), encoding="utf-8") as f:
    on_disk = f.read()
  assert text == on_disk, (
      "docs/api.md is out of date with the docstrings: run python docs/gen_api.py --write")


def test_top_level_exports_are_documented():
  gen = _gen_api()
  top = dict((m, names) for m, names, _ in gen.MODULES)["t2mlr_jax"]
  missing = sorted(set(t2mlr_jax.__all__) - set(top) - {"__version__"})
  assert not missing, (f"t2mlr_jax.__all__ has {missing}, which docs/gen_api.py does not "
                       "list: add them to MODULES and run python docs/gen_api.py --write")
