"""RESULTS.md can be looked up: a current-numbers table at the top whose every row links an
entry, superseded entries linking what replaces them, and every link into it (from itself,
BUILD.md and README.md) landing on an anchor that exists."""

import os
import re

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def _read(name):
  with open(os.path.join(REPO, name)) as f:
    return f.read()


def test_current_numbers_table_links_existing_entries():
  text = _read("RESULTS.md")
  anchors = set(re.findall(r'<a id="([^"]+)"></a>\n### ', text))
  table = text.split("## Current numbers\n", 1)[1].split("\n## ", 1)[0]
  header = "| metric | value | yardstick | hardware | date | entry |"
  rows = [r for r in table.splitlines() if r.startswith("| ") and r != header]
  assert header in table and len(rows) >= 10
  for row in rows:
    cells = [c.strip() for c in row.strip("|").split(" | ")]
    assert len(cells) == 6 and re.fullmatch(r"\d{4}-\d\d-\d\d", cells[4]), row
    (link,) = re.findall(r"\]\(#([^)]+)\)", cells[5])
    assert link in anchors, row
  # The dated entries start with today's empty section, kept for the lead's entries.
  assert (
    text.index("## Current numbers") < text.index("## 2026-12-08") < text.index("## 2026-12-07")
  )


def test_superseded_entries_and_links_land_on_anchors():
  text = _read("RESULTS.md")
  anchors = set(re.findall(r'<a id="([^"]+)"></a>', text))
  superseded = re.findall(r"\n\*\*Superseded\*\* in part or whole: (.*)", text)
  assert len(superseded) >= 15 and all("](#" in s for s in superseded)
  for link in re.findall(r"\]\(#([^)]+)\)", text):
    assert link in anchors, link
  for doc in ("BUILD.md", "README.md"):
    for link in re.findall(r"RESULTS\.md#([\w-]+)", _read(doc)):
      assert link in anchors, (doc, link)
