"""Scrubbing the visible workspace and the final leak scan.

Closes the doors seen at scale: bytecode and type-checker caches from earlier runs, build
artefacts and installed copies, compiled extensions, git history (a fresh single commit with
fixed identity and dates), and prose (README/docs/PKG-INFO) that restates the API. A package
that reads its own metadata (`importlib.metadata.version`) keeps it: the `*.egg-info` of an
importable root (the workspace, src/) is cut to identifying headers, entry points and
requirements, so the workspace imports as the validated tree did. The leak scan
reads every remaining file — binaries and decompressed git objects included — for the deleted
symbols' names and source lines; any hit rejects the task. What the task shows anyway is no
leak: a source line that kept code also contains, and in text files a name that the problem
statement or kept code already uses (a deleted `call` or `text` is a common word elsewhere);
names the task never shows (removed private helpers) count everywhere, and in binary files
(compiled code, caches) every name counts.
"""

import os
import re
import subprocess
import zlib
from pathlib import Path

from composer_jax.codetasks import trees

_SCRUB_DIRS = frozenset(
  {
    "__pycache__",
    ".mypy_cache",
    ".pytype",
    ".pyre",
    ".ruff_cache",
    ".pytest_cache",
    ".tox",
    ".venv",
    ".eggs",
    ".hypothesis",
    ".nox",
    ".git",
    ".hg",
    ".svn",
    ".cj-coverage",
  }
)
_TOP_SCRUB_DIRS = frozenset({"build", "dist", "docs", "doc", "venv"})  # only at the root
_SCRUB_FILES = re.compile(
  r"(\.py[cod]|\.so|\.pyd|\.dll|\.dylib|\.o|\.a|\.class|\.jar|\.whl|\.egg|\.pth)$|"
  r"^(\.coverage.*|coverage\.xml|PKG-INFO|sitecustomize\.py|usercustomize\.py)$|"
  r"^(README|CHANGELOG|CHANGES|HISTORY|NEWS|AUTHORS|CONTRIBUTING)"
)
# Prose at the root whatever its case and extension (semantic_version's `ChangeLog`).
_TOP_PROSE = re.compile(
  r"(?i)(readme|changelog|changes|history|news|authors|contributing)(\.(md|rst|txt|markdown))?$"
)
_GIT_ENV = {
  "GIT_AUTHOR_NAME": "task",
  "GIT_AUTHOR_EMAIL": "task@localhost",
  "GIT_COMMITTER_NAME": "task",
  "GIT_COMMITTER_EMAIL": "task@localhost",
  "GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z",
  "GIT_COMMITTER_DATE": "2000-01-01T00:00:00Z",
  "GIT_CONFIG_NOSYSTEM": "1",
  "HOME": "/nonexistent",
  "PATH": "/usr/bin:/bin",
}
MIN_LEAK_LINE = 24  # shorter source lines ("return result") are too generic to scan for


# What a package may read of its own installed metadata (importlib.metadata: its version, entry
# points, requirements), kept in an importable root's `*.egg-info`; PKG-INFO keeps only these
# headers (its description restates the README).
_METADATA_FILES = frozenset({"PKG-INFO", "entry_points.txt", "requires.txt", "top_level.txt"})
_METADATA_HEADERS = frozenset(
  {"metadata-version", "name", "version", "requires-python", "requires-dist", "provides-extra"}
)


def _reduce_metadata(info: Path) -> list[str]:
  """Leaves in an `*.egg-info` directory only what importlib.metadata serves a package about
  itself (the module comment above); returns what went."""
  listing = trees.scan(info)
  removed = [rel for rel in [*listing.odd, *listing.files] if rel not in _METADATA_FILES]
  for rel in removed:
    (info / rel).unlink()
  for rel in listing.dirs:
    if not trees.remove(info / rel):
      removed.append(rel)
  removed.sort()
  pkg_info = info / "PKG-INFO"
  if pkg_info.is_file():
    head = pkg_info.read_text(encoding="utf-8", errors="replace").split("\n\n", 1)[0]
    keep = [
      ln
      for ln in head.splitlines()
      if ln.split(":", 1)[0].strip().lower() in _METADATA_HEADERS and ":" in ln
    ]
    pkg_info.write_text("\n".join(keep) + "\n", encoding="utf-8")
  return removed


def scrub(ws: Path) -> list[str]:
  """Deletes caches, build outputs, compiled files, VCS data and prose, and reduces the package
  metadata of the importable roots (the workspace and src/) to what imports read; returns what
  went."""
  pruned = []

  def prune(rel: str) -> bool:  # directories that go whole, or are reduced
    parent, _, d = rel.rpartition("/")
    drop = d in _SCRUB_DIRS or (not parent and d in _TOP_SCRUB_DIRS) or d.endswith(".egg-info")
    if drop:
      pruned.append(rel)
    return drop

  ws = Path(ws)
  listing = trees.scan(ws, skip=prune)
  removed = []
  for rel in pruned:
    parent, _, d = rel.rpartition("/")
    if d.endswith(".egg-info") and parent in ("", "src"):
      removed += [f"{rel}/{r}" for r in _reduce_metadata(ws / rel)]
    elif not trees.remove(ws / rel):
      removed.append(rel)
  for rel in [*listing.files, *listing.odd]:
    parent, _, f = rel.rpartition("/")
    top_prose = not parent and (f.endswith((".md", ".rst", ".txt")) or _TOP_PROSE.match(f))
    if rel in listing.odd or _SCRUB_FILES.search(f) or (top_prose and "requirements" not in f):
      (ws / rel).unlink()
      removed.append(rel)
  return sorted(removed)


def fresh_git(ws: Path) -> str:
  """A new repository with exactly one deterministic commit of the workspace; returns its id."""

  def git(*args):
    return subprocess.run(
      ["git", "-c", "init.defaultBranch=main", "-c", "core.hooksPath=/dev/null", *args],
      cwd=ws,
      env=_GIT_ENV,
      check=True,
      capture_output=True,
      text=True,
    ).stdout.strip()

  git("init", "-q")
  trees.remove(ws / ".git" / "hooks")
  git("add", "-A")
  git("commit", "-q", "-m", "Initial commit")
  return git("rev-parse", "HEAD")


def leak_lines(code: list[str], revealed: str = "") -> list[str]:
  """Distinctive source lines of removed code (stripped, >= MIN_LEAK_LINE chars).

  Lines that occur in `revealed` text (the problem statement's signatures and docstrings, the
  kept code), whole or as part of a longer line, are excluded: finding them elsewhere discloses
  nothing the task does not already show.
  """
  out = set()
  for block in code:
    for line in block.splitlines():
      s = line.strip()
      if len(s) >= MIN_LEAK_LINE and s not in revealed and not s.startswith("#"):
        out.add(s)
  return sorted(out)


def _name_pattern(name: str) -> re.Pattern:
  return re.compile(rb"(?<![A-Za-z0-9_])" + re.escape(name.encode()) + rb"(?![A-Za-z0-9_])")


def _is_text(data: bytes) -> bool:
  try:
    data.decode("utf-8")
  except UnicodeDecodeError:
    return False
  return b"\0" not in data


def leak_scan(ws: Path, names: list[str], code: list[str], revealed: str = "") -> list[str]:
  """Every (file, needle) hit of a removed name (as an identifier) or source line (module
  docstring: what counts where). Git objects are read decompressed, as text: they hold the
  workspace's own files, which are scanned as they are."""
  pats = [(n, _name_pattern(n)) for n in names]
  shown = {n for n, pat in pats if pat.search(revealed.encode())}
  lines = [ln.encode() for ln in leak_lines(code, revealed)]
  hits = []
  listing = trees.scan(ws)
  for rel in sorted([*listing.files, *listing.odd]):
    p = Path(ws) / rel
    if rel not in listing.files and not p.is_symlink():
      continue  # a FIFO or device holds nothing to find
    data = p.read_bytes() if rel in listing.files else os.readlink(p).encode()
    git_object = rel.startswith(".git/objects/") or "/.git/objects/" in rel
    text = git_object or _is_text(data)
    if git_object:
      try:
        data = zlib.decompress(data)
      except zlib.error:
        pass
    hits += [
      f"{rel}: name {n!r}" for n, pat in pats if not (text and n in shown) and pat.search(data)
    ]
    hits += [f"{rel}: line {ln.decode()[:60]!r}" for ln in lines if ln in data]
  return hits
