"""Seconds each test file takes (tests/fixtures/file_seconds.json), read by conftest.py to
hand whole files to the xdist workers longest first, so a run does not end on one worker
finishing a long file alone while the other waits.

Regenerate after adding or reshaping a long test file (the numbers only order the files;
a stale one costs a little time, never a result):
    python -m pytest tests --junitxml=/tmp/default.xml
    python -m pytest -m slow tests --junitxml=/tmp/slow.xml
    python tests/_file_seconds.py /tmp/default.xml /tmp/slow.xml
"""

import collections
import json
import os
import sys
import xml.etree.ElementTree as ET

FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures",
                       "file_seconds.json")


def load() -> dict:
  """{test file path (as pytest names it): seconds}."""
  with open(FIXTURE) as f:
    return json.load(f)


def from_junit(paths) -> dict:
  """Each file's summed test times (setup, call and teardown) in pytest's JUnit XML."""
  seconds = collections.defaultdict(float)
  for path in paths:
    for case in ET.parse(path).getroot().iter("testcase"):
      module = case.get("classname", "").split(".")
      while module and not module[-1].startswith("test_"):
        module.pop()             # a test class's name follows its module's
      seconds["/".join(module) + ".py"] += float(case.get("time", 0))
  return {k: round(v, 1) for k, v in sorted(seconds.items())}


if __name__ == "__main__":
  repo = os.path.dirname(os.path.dirname(os.path.dirname(FIXTURE)))
  merged = {k: v for k, v in {**load(), **from_junit(sys.argv[1:])}.items()
            if os.path.exists(os.path.join(repo, k))}      # the files still there
  with open(FIXTURE, "w") as f:
    json.dump(dict(sorted(merged.items())), f, indent=1)
    f.write("\n")
  print(f"wrote {FIXTURE}: {len(merged)} files")
