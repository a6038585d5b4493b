"""Layout of a Python project tree: source modules, test files, runner configuration, archives.

Paths are POSIX strings relative to the project root throughout the package.
"""

import base64
import gzip
import io
import re
import tarfile
from pathlib import Path

from composer_jax.codetasks import trees

_TEST_DIRS = frozenset({"tests", "test", "testing"})
_SKIP_DIRS = frozenset(
  {
    ".git",
    ".hg",
    ".tox",
    ".venv",
    "venv",
    "build",
    "dist",
    "docs",
    "doc",
    "__pycache__",
    ".eggs",
    "node_modules",
  }
)
# Files that configure how pytest runs; restored from the original at grading time.
RUNNER_CONFIGS = frozenset(
  {"pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml", ".coveragerc", "conftest.py"}
)
# Files that change interpreter start-up; never allowed in a graded workspace.
STARTUP_HOOKS = re.compile(r"(^|/)(sitecustomize\.py|usercustomize\.py|[^/]*\.pth)$")


def is_test_file(rel: str) -> bool:
  parts = rel.split("/")
  name = parts[-1]
  if not name.endswith(".py"):
    return any(p in _TEST_DIRS for p in parts[:-1])
  return (
    name.startswith("test_")
    or name.endswith("_test.py")
    or name == "conftest.py"
    or any(p in _TEST_DIRS for p in parts[:-1])
  )


def is_protected(rel: str) -> bool:
  """Test files and runner configuration: reset to the original before grading."""
  return is_test_file(rel) or rel.split("/")[-1] in RUNNER_CONFIGS


def walk(root: Path, skip=_SKIP_DIRS, bounds: trees.Bounds = trees.DEFAULT):
  """Every regular file under root as a relative POSIX path, sorted, not entering directories
  named in `skip` (by default also `*.egg-info`; `skip=frozenset()`: every file); symlinks and
  other special files are left out. A tree outside `bounds` raises trees.TreeError (one line)."""
  eggs = skip is _SKIP_DIRS

  def skipped(rel: str) -> bool:
    d = rel.rpartition("/")[2]
    return d in skip or (eggs and d.endswith(".egg-info"))

  return list(trees.scan(root, bounds, skip=skipped).files)


def source_files(root: Path) -> list[str]:
  """Importable non-test modules: packages (dirs with __init__.py) and top-level modules.

  Looks in the root and in src/ (src layout).
  """
  out = []
  for base in (Path(root), Path(root) / "src"):
    if not base.is_dir():
      continue
    prefix = "" if base == Path(root) else "src/"
    for entry in sorted(base.iterdir()):
      if entry.is_file() and entry.suffix == ".py":
        rel = prefix + entry.name
        if not is_test_file(rel) and entry.name not in ("setup.py", "noxfile.py", "conftest.py"):
          out.append(rel)
      elif entry.is_dir() and (entry / "__init__.py").exists() and entry.name not in _TEST_DIRS:
        out.extend(
          prefix + entry.name + "/" + r
          for r in walk(entry)
          if r.endswith(".py") and not is_test_file(prefix + entry.name + "/" + r)
        )
  return out


def module_name(rel: str) -> str:
  """'src/pkg/sub/mod.py' -> 'pkg.sub.mod'; '__init__.py' maps to its package."""
  rel = rel[4:] if rel.startswith("src/") else rel
  parts = rel[:-3].split("/")
  if parts[-1] == "__init__":
    parts = parts[:-1]
  return ".".join(parts)


def pack(root: Path, files: list[str]) -> str:
  """Deterministic tar.gz (sorted, zero mtimes, fixed modes) as base64 text."""
  members = {rel: Path(root) / rel for rel in files}
  buf = io.BytesIO()
  with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz:
    with tarfile.open(fileobj=gz, mode="w") as tar:
      for rel in sorted(members):
        data = members[rel].read_bytes()
        info = tarfile.TarInfo(rel)
        info.size, info.mtime, info.mode = len(data), 0, 0o644
        tar.addfile(info, io.BytesIO(data))
  return base64.b64encode(buf.getvalue()).decode()


def blob_error(blob) -> str:
  """'' if `blob` is a pack() blob that `unpack` extracts, else why not (one line)."""
  if not isinstance(blob, str):
    return f"a packed project is base64 text, got {type(blob).__name__}"
  try:
    with tarfile.open(
      fileobj=io.BytesIO(base64.b64decode(blob, validate=True)), mode="r:gz"
    ) as tar:
      for m in tar.getmembers():
        if m.isfile():
          tarfile.data_filter(m, "/dest")  # what unpack's filter="data" refuses
  except (ValueError, tarfile.TarError, EOFError, OSError) as e:
    return f"not a packed project (base64 of a tar.gz of regular files): {type(e).__name__}: {e}"
  return ""


def unpack(blob: str, dest: Path) -> list[str]:
  """Extracts a pack() blob into dest (regular files only) and returns the member names."""
  dest.mkdir(parents=True, exist_ok=True)
  with tarfile.open(fileobj=io.BytesIO(base64.b64decode(blob)), mode="r:gz") as tar:
    members = [m for m in tar.getmembers() if m.isfile()]
    tar.extractall(dest, members=members, filter="data")
  return [m.name for m in members]
