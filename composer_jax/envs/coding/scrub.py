"""Scrubbing the visible workspace and the final leak scan.

Closes the doors seen at scale: bytecode and type-checker caches from earlier runs, build
artefacts and installed copies, compiled extensions, git history (a fresh single commit with
fixed identity and dates), and prose (README/docs/PKG-INFO) that restates the API. The leak scan
reads every remaining file — binaries and decompressed git objects included — for the deleted
symbols' names and source lines; any hit rejects the task.
"""

import os
import re
import shutil
import subprocess
import zlib
from pathlib import Path

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


def scrub(ws: Path) -> list[str]:
  """Deletes caches, build outputs, compiled files, VCS data and prose; returns what went."""
  removed = []
  for dirpath, dirnames, filenames in os.walk(ws, topdown=True):
    for d in list(dirnames):
      top = Path(dirpath) == Path(ws) and d in _TOP_SCRUB_DIRS
      if d in _SCRUB_DIRS or top or d.endswith(".egg-info"):
        shutil.rmtree(Path(dirpath) / d)
        dirnames.remove(d)
        removed.append(os.path.relpath(Path(dirpath) / d, ws))
    for f in filenames:
      p = Path(dirpath) / f
      top_prose = Path(dirpath) == Path(ws) and f.endswith((".md", ".rst", ".txt"))
      if _SCRUB_FILES.search(f) or p.is_symlink() or (top_prose and "requirements" not in f):
        p.unlink()
        removed.append(os.path.relpath(p, ws))
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
  shutil.rmtree(ws / ".git" / "hooks", ignore_errors=True)
  git("add", "-A")
  git("commit", "-q", "-m", "Initial commit")
  return git("rev-parse", "HEAD")


def leak_lines(code: list[str], revealed: str = "") -> list[str]:
  """Distinctive source lines of removed code (stripped, >= MIN_LEAK_LINE chars).

  Lines of `revealed` text (the problem statement's signatures and docstrings) are excluded:
  finding them elsewhere discloses nothing the task does not already say.
  """
  shown = {ln.strip() for ln in revealed.splitlines()}
  out = set()
  for block in code:
    for line in block.splitlines():
      s = line.strip()
      if len(s) >= MIN_LEAK_LINE and s not in shown and not s.startswith("#"):
        out.add(s)
  return sorted(out)


def leak_scan(ws: Path, names: list[str], code: list[str], revealed: str = "") -> list[str]:
  """Every (file, needle) hit of a removed name (as an identifier) or source line."""
  pats = [
    (n, re.compile(rb"(?<![A-Za-z0-9_])" + re.escape(n.encode()) + rb"(?![A-Za-z0-9_])"))
    for n in names
  ]
  lines = [ln.encode() for ln in leak_lines(code, revealed)]
  hits = []
  for dirpath, _, filenames in os.walk(ws):
    for f in filenames:
      p = Path(dirpath) / f
      data = p.read_bytes() if not p.is_symlink() else os.readlink(p).encode()
      if "/.git/objects/" in p.as_posix():
        try:
          data = zlib.decompress(data)
        except zlib.error:
          pass
      rel = os.path.relpath(p, ws)
      hits += [f"{rel}: name {n!r}" for n, pat in pats if pat.search(data)]
      hits += [f"{rel}: line {ln.decode()[:60]!r}" for ln in lines if ln in data]
  return hits
