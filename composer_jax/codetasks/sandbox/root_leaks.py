"""The leak scan of everything a sandboxed command can read besides its workspace.

A task is only as hidden as its deleted code: the sandbox root (bwrap.visible(): programs,
libraries, the Python runtime and the grader's read-only files) must not hold a copy of it,
installed, vendored or zipped, or the code is importable — or printable by the agent's `run`
tool and pasted back as a clean-looking diff. `index()` reads every regular file of those trees
once per process (text files line by line, zip/wheel members too; binaries are skipped) into a
sorted array of hashed stripped lines, cached on disk (CACHE_DIR) under a fingerprint of the
trees' directories, so a process loads it in milliseconds; `leaks(gold_patch)` looks up the
lines a task's gold patch adds. The grader rejects a task whose distinctive gold lines are found
there (and so does the factory, which validates every task through the grader).
"""

import array
import bisect
import functools
import hashlib
import io
import os
import tempfile
import zipfile
from pathlib import Path

from composer_jax.codetasks.sandbox import bwrap

CACHE_DIR = (
  Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "composer_jax" / "visible"
)

MIN_LINE = 24  # shorter lines ("return result") are too generic to count as a copy
MAX_FILE_BYTES = 64 << 20
MIN_HITS = 3  # distinctive gold lines found in the root that make a copy (fewer: all of them)


def _h(line: bytes) -> int:
  return int.from_bytes(hashlib.blake2b(line, digest_size=8).digest(), "little")


def _lines(data: bytes, out: set) -> None:
  out.update(s for s in map(bytes.strip, data.splitlines()) if len(s) >= MIN_LINE)


def _read(path: str, out: set) -> None:
  try:
    if os.path.getsize(path) > MAX_FILE_BYTES:
      return
    with open(path, "rb") as f:
      head = f.read(8192)
      if b"\0" in head and head[:4] != b"PK\x03\x04":
        return  # a binary that is not an archive (executables, libraries, data)
      data = head + f.read()
  except OSError:
    return
  if data[:4] == b"PK\x03\x04":
    try:
      with zipfile.ZipFile(io.BytesIO(data)) as z:
        for info in z.infolist():
          if info.file_size <= MAX_FILE_BYTES and not info.is_dir():
            member = z.read(info)
            if b"\0" not in member[:8192]:
              _lines(member, out)
    except (zipfile.BadZipFile, OSError, ValueError, NotImplementedError, EOFError):
      return
  elif b"\0" not in data[:8192]:
    _lines(data, out)


def _trees() -> list[str]:
  from composer_jax.codetasks.sandbox import suite

  binds = {k: v for k, v in suite.runtime_binds().items() if k != suite.PYCACHE}
  return sorted({host for _, host in bwrap.visible(binds)})


def _walk(trees, hidden):
  """(directory or single file, its entries) of every tree, hidden directories left out."""
  for host in trees:
    if os.path.isfile(host):
      yield host, [host]
      continue
    for d, dirs, files in os.walk(host):
      dirs[:] = sorted(x for x in dirs if os.path.join(d, x) not in hidden)
      yield d, [os.path.join(d, f) for f in sorted(files)]


def _fingerprint(trees, hidden) -> str:
  """Changes when a file is added, removed or replaced anywhere in the trees."""
  h = hashlib.sha256(repr((MIN_LINE, MAX_FILE_BYTES)).encode())
  for d, _ in _walk(trees, hidden):
    st = os.stat(d)
    h.update(f"{d}\0{st.st_mtime_ns}\0{st.st_size}\n".encode())
  return h.hexdigest()[:24]


def _build(trees, hidden) -> array.array:
  lines: set = set()
  for _, files in _walk(trees, hidden):
    for p in files:
      if not os.path.islink(p):
        _read(p, lines)
  return array.array("Q", sorted({_h(s) for s in lines}))


@functools.cache
def index() -> array.array:
  """Sorted hashes of the stripped lines (>= MIN_LINE bytes) of every file visible in the
  sandbox besides the workspace (package directories the sandbox hides excluded)."""
  trees, hidden = _trees(), frozenset(bwrap.hidden())
  path = CACHE_DIR / f"lines-{_fingerprint(trees, hidden)}.u64"
  out = array.array("Q")
  try:
    with open(path, "rb") as f:
      out.frombytes(f.read())
    return out
  except OSError:
    pass
  out = _build(trees, hidden)
  try:
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=CACHE_DIR, delete=False) as f:
      f.write(out.tobytes())
    os.replace(f.name, path)
  except OSError:
    pass
  return out


def _seen(table: array.array, h: int) -> bool:
  i = bisect.bisect_left(table, h)
  return i < len(table) and table[i] == h


def gold_lines(patch: str, prefix: str = "+") -> list[bytes]:
  """The distinctive lines a diff adds (stripped, >= MIN_LINE bytes, not comments); with
  prefix " ", its distinctive context lines."""
  out = []
  for line in patch.splitlines():
    if line.startswith(prefix) and not line.startswith("+++"):
      s = line[1:].strip().encode("utf-8", "surrogateescape")
      if len(s) >= MIN_LINE and not s.startswith(b"#"):
        out.append(s)
  return sorted(set(out))


def leaks(patch: str) -> list[str]:
  """The gold lines of `patch` found in the sandbox's visible files when they amount to a
  copy: at least MIN_HITS of them, or all of fewer together with the code around them (the
  patch's context lines: a line of a copy comes with its neighbours, a common line such as
  `if isinstance(value, str):` alone does not); [] otherwise."""
  lines = gold_lines(patch)
  if not lines:
    return []
  table = index()
  hits = [ln.decode("utf-8", "replace") for ln in lines if _seen(table, _h(ln))]
  if len(hits) >= MIN_HITS:
    return hits
  if len(hits) < len(lines):
    return []
  context = gold_lines(patch, " ")
  around = sum(_seen(table, _h(ln)) for ln in context)
  return hits if len(hits) + around >= min(MIN_HITS, len(lines) + len(context)) else []
