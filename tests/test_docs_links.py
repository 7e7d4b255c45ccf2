"""Every relative link in README.md and docs/*.md leads somewhere: to a file of the clone
and, with a #anchor, to a heading of that file (GitHub's anchors)."""

import glob
import os
import re

import pytest

from _util import REPO_ROOT

PAGES = [os.path.join(REPO_ROOT, "README.md"),
         *sorted(glob.glob(os.path.join(REPO_ROOT, "docs", "*.md")))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~)")


def slug(heading: str) -> str:
  """GitHub's anchor of a heading: lowercase, punctuation but hyphens and spaces dropped,
  spaces as hyphens (markdown emphasis and code marks dropped with it)."""
  text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
  text = re.sub(r"[^\w\- ]", "", text)
  return text.replace(" ", "-")


def anchors(path: str) -> set:
  """The anchors of a markdown file's headings (repeated ones numbered -1, -2, ...)."""
  seen, out, fenced = {}, set(), False
  with open(path) as f:
    for line in f:
      if FENCE.match(line):
        fenced = not fenced
      heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
      if heading and not fenced:
        base = slug(heading.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
  return out


def links(path: str) -> list:
  """The relative links of a markdown file, outside code blocks and code spans."""
  found, fenced = [], False
  with open(path) as f:
    for number, line in enumerate(f, 1):
      if FENCE.match(line):
        fenced = not fenced
        continue
      if fenced:
        continue
      for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
        if not re.match(r"^[a-z][a-z0-9+.-]*:", target):     # http:, mailto:, ...
          found.append((number, target))
  return found


def test_slugs_follow_github():
  assert slug("S5-Retrieval: the default job") == "s5-retrieval-the-default-job"
  assert slug("Schedules × types") == "schedules--types"
  assert slug("`forward` and `generate`") == "forward-and-generate"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: os.path.relpath(p, REPO_ROOT))
def test_relative_links_resolve(page):
  broken = []
  for number, target in links(page):
    file, _, anchor = target.partition("#")
    dest = os.path.normpath(os.path.join(os.path.dirname(page), file)) if file else page
    if not os.path.exists(dest):
      broken.append(f"line {number}: {target} (no file {os.path.relpath(dest, REPO_ROOT)})")
    elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
      broken.append(f"line {number}: {target} (no heading #{anchor})")
  assert not broken, "\n".join(broken)
