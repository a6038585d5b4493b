"""Source projects: pinned PyPI sdists (third_party/coding_sources.json), archives or directories.

Sdists are fetched at run time with `pip download --no-deps --no-binary :all:` into a cache,
checked against the pinned SHA-256, and never committed.

A project's runtime and test dependencies (manifest `deps`: name, version, wheel sha256) are
installed once, from pinned wheels only (`pip install --no-deps --only-binary :all:
--require-hashes --target`), into a read-only runtime cached under the hash of the pins; the
sandbox lays it into each test run's tree (`sandbox.dependencies`).
"""

import dataclasses
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tokenize
import zipfile
from pathlib import Path

from composer_jax.codetasks import project, trees
from composer_jax.codetasks.synthesis import microprojects

MANIFEST = Path(__file__).resolve().parents[3] / "third_party" / "coding_sources.json"
CACHE = Path(os.environ.get("CJ_CODING_CACHE", Path.home() / ".cache" / "composer_jax" / "sdists"))
_ENTRY_KEYS = ("name", "version", "sha256")
# Never part of a dependency runtime: tests would be collected with the project's, start-up
# hooks are removed by the grader anyway, scripts and caches are of no use.
_RUNTIME_DROP = re.compile(
  r"(^|/)(tests?|testing|__pycache__|bin)(/|$)|(^|/)(test_[^/]*|conftest)\.py$|\.(pth|pyc)$"
)


@dataclasses.dataclass(frozen=True)
class Source:
  name: str
  version: str
  archive_sha256: str  # sha256 of the sdist, or of the sorted file tree for a directory
  path: Path  # extracted project root
  deps: tuple[dict, ...] = ()  # pinned wheels: name, version, sha256
  runtime: Path | None = None  # their installed, read-only runtime (None without deps)

  def as_dict(self) -> dict:
    out = {"name": self.name, "version": self.version, "archive_sha256": self.archive_sha256}
    if self.deps:
      out["deps"] = [dict(d) for d in self.deps]
    return out


def check_entry(entry) -> str:
  """'' for a well-formed manifest entry, else a one-line description of what is wrong."""
  if not isinstance(entry, dict) or not isinstance(entry.get("deps", []), list):
    return f"manifest entry {entry!r}: need an object with {list(_ENTRY_KEYS)} and a deps list"
  for e in [entry, *entry.get("deps", [])]:
    if not isinstance(e, dict) or any(not isinstance(e.get(k), str) for k in _ENTRY_KEYS):
      return f"manifest entry {entry.get('name')!r}: {e!r} needs string fields {_ENTRY_KEYS}"
    if not re.fullmatch(r"[0-9a-f]{64}", e["sha256"]):
      return f"manifest entry {e['name']}: sha256 {e['sha256']!r} is not 64 lowercase hex digits"
  return ""


def load_manifest(path: Path = MANIFEST) -> list[dict]:
  try:
    entries = json.loads(Path(path).read_text())["sources"]
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise ValueError(f"manifest {path}: not a JSON object with a 'sources' list ({e})") from None
  if not isinstance(entries, list):
    raise ValueError(f"manifest {path}: 'sources' must be a list")
  return entries


def sha256_file(path: Path) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
      h.update(chunk)
  return h.hexdigest()


def fetch(name: str, version: str, sha256: str, cache: Path | None = None) -> Path:
  """The verified sdist for name==version (downloaded with pip on first use into `cache`,
  default CACHE)."""
  cache = Path(cache or CACHE)
  cache.mkdir(parents=True, exist_ok=True)
  for p in cache.glob("*"):
    if p.is_file() and sha256_file(p) == sha256:
      return p
  with tempfile.TemporaryDirectory() as tmp:
    cmd = [
      sys.executable,
      "-m",
      "pip",
      "download",
      "--no-deps",
      "--no-binary",
      ":all:",
      "-q",
      "-d",
      tmp,
      f"{name}=={version}",
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    files = list(Path(tmp).iterdir())
    if res.returncode != 0 or len(files) != 1:
      raise RuntimeError(f"pip download {name}=={version} failed: {_last_error(res.stderr)}")
    got = sha256_file(files[0])
    if got != sha256:
      raise ValueError(f"{files[0].name}: sha256 {got} does not match the pinned {sha256}")
    dest = cache / files[0].name
    shutil.move(files[0], dest)
    return dest


def _last_error(stderr: str) -> str:
  lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
  errors = [ln for ln in lines if ln.startswith("ERROR")]
  return (errors or lines or ["no output"])[-1][:300]


def build_runtime(deps, cache: Path | None = None) -> Path:
  """The read-only runtime of pinned wheels `deps`, built once per set of pins (in `cache`,
  default beside CACHE)."""
  cache = Path(cache or CACHE.parent / "deps")
  pins = sorted(f"{d['name']}=={d['version']} --hash=sha256:{d['sha256']}" for d in deps)
  key = hashlib.sha256(repr((pins, sys.version_info[:2])).encode()).hexdigest()[:16]
  dest = cache / f"runtime-{key}"
  if (dest / ".complete").exists():
    return dest
  cache.mkdir(parents=True, exist_ok=True)
  staging = Path(tempfile.mkdtemp(prefix="staging-", dir=cache))
  try:
    (staging.parent / f"{staging.name}.txt").write_text("\n".join(pins) + "\n")
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--only-binary", ":all:"]
    cmd += ["--require-hashes", "--no-compile", "--target", str(staging / "site")]
    cmd += ["-r", str(staging.parent / f"{staging.name}.txt")]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if res.returncode != 0:
      names = ", ".join(p.split(" ")[0] for p in pins)
      raise RuntimeError(f"dependencies {names} cannot be installed: {_last_error(res.stderr)}")
    for rel in project.walk(staging / "site", skip=frozenset()):
      if _RUNTIME_DROP.search(rel):
        (staging / "site" / rel).unlink()
    (staging / ".complete").write_text("\n".join(pins) + "\n")
    for p in sorted(staging.rglob("*"), reverse=True):
      p.chmod(0o555 if p.is_dir() else 0o444)
    staging.chmod(0o555)
    try:
      staging.rename(dest)
    except OSError:  # another worker built it first
      pass
  finally:
    (staging.parent / f"{staging.name}.txt").unlink(missing_ok=True)
    trees.remove(staging)
  return dest


def _tree_hash(root: Path) -> str:
  h = hashlib.sha256()
  for rel, path in trees.scan(root).files.items():
    h.update(rel.encode() + b"\0" + Path(path).read_bytes() + b"\0")
  return h.hexdigest()


_TARS = (".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar")


def extract(archive: Path, dest: Path, bounds: trees.Bounds = trees.DEFAULT) -> Path:
  """Extracts an sdist (tar.gz / zip) into dest and returns its single top-level directory.
  ValueError (one line naming the archive and what is wrong) for one that is not a readable
  archive, holds a member the standard library's `data` filter refuses (absolute or
  traversing paths, links leaving the tree, device files), is outside `bounds`, or is not one
  project directory."""
  archive = Path(archive)
  name = archive.name
  try:
    if name.endswith(_TARS):
      _extract_tar(archive, dest, bounds)
    elif name.endswith(".zip"):
      _extract_zip(archive, dest, bounds)
    else:
      raise ValueError("expected a .tar.gz, .tgz, .tar.bz2, .tar.xz, .tar or .zip or a directory")
    tops = sorted(os.listdir(dest))
  except (tarfile.TarError, zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError) as e:
    raise ValueError(f"source archive {name}: {_archive_error(e)}") from None
  except ValueError as e:
    raise ValueError(f"source archive {name}: {e}") from None
  if len(tops) != 1 or not (dest / tops[0]).is_dir() or (dest / tops[0]).is_symlink():
    shown = ", ".join(tops[:4]) + (", ..." if len(tops) > 4 else "") if tops else "nothing"
    raise ValueError(
      f"source archive {name}: holds {len(tops)} top-level entries ({shown}); an sdist "
      "holds exactly one project directory"
    )
  return dest / tops[0]


def _archive_error(e: Exception) -> str:
  """One line for what `tarfile`/`zipfile` refused."""
  text = " ".join(str(e).split())
  if isinstance(e, tarfile.ReadError) and "empty" in str(e):
    return "an empty file, not an archive"
  if isinstance(e, tarfile.ReadError) and "could not be opened" in str(e):
    return "not a tar archive (neither gzip, bzip2, xz nor plain tar)"
  if isinstance(e, (tarfile.ReadError, zipfile.BadZipFile)):
    return f"not a readable archive ({text[:200]})"
  if isinstance(e, tarfile.FilterError):  # what the data filter refused, for which member
    return f"member {e.tarinfo.name!a} refused ({type(e).__name__}): {text[:200]}"
  return f"{type(e).__name__}: {text[:200]}"


def _check_members(names_sizes, bounds: trees.Bounds) -> None:
  """ValueError for an archive whose members would make a tree outside `bounds`."""
  total, count = 0, 0
  for member, size in names_sizes:
    count += 1
    if member.startswith("/"):
      raise ValueError(f"member {member[:80]!a} refused: an absolute path")
    if count > bounds.max_entries:
      raise ValueError(f"more than {bounds.max_entries} members")
    if size > bounds.max_file_bytes:
      raise ValueError(f"member {member!a} is {size} bytes, over {bounds.max_file_bytes} per file")
    total += size
    if total > bounds.max_total_bytes:
      raise ValueError(f"members over {bounds.max_total_bytes} bytes in all")
    if member.count("/") > bounds.max_depth or len(member.encode()) > bounds.max_path_bytes:
      raise ValueError(f"member {member[:80]!a} is nested too deep")


def _extract_tar(archive: Path, dest: Path, bounds: trees.Bounds) -> None:
  with tarfile.open(archive) as tar:
    members = tar.getmembers()
    _check_members(((m.name, m.size) for m in members), bounds)
    dest.mkdir(parents=True, exist_ok=True)
    tar.extractall(dest, filter="data")


def _extract_zip(archive: Path, dest: Path, bounds: trees.Bounds) -> None:
  with zipfile.ZipFile(archive) as z:
    infos = z.infolist()
    _check_members(((i.filename, i.file_size) for i in infos), bounds)
    for i in infos:
      parts = i.filename.replace("\\", "/").split("/")
      if i.filename.startswith("/") or ".." in parts:
        raise ValueError(f"member {i.filename!a} refused: a path outside the tree")
    dest.mkdir(parents=True, exist_ok=True)
    z.extractall(dest)


def check_tree(root: Path) -> None:
  """ValueError (one line) for a source tree the generator would misread: a Python file that
  is not UTF-8 (PEP 3120; a file declaring another encoding is refused by name)."""
  for rel, path in trees.scan(root).files.items():
    if not rel.endswith(".py"):
      continue
    data = Path(path).read_bytes()
    try:
      encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError:  # bytes that are not UTF-8 and no declaration: said below
      encoding = "utf-8"
    if encoding not in ("utf-8", "utf-8-sig"):
      raise ValueError(
        f"source file {rel} declares encoding {encoding!r}; only UTF-8 sources are supported"
      )
    try:
      data.decode("utf-8")
    except UnicodeDecodeError as e:
      raise ValueError(
        f"source file {rel} is not UTF-8 (byte {data[e.start]:#04x} at offset {e.start}) and "
        "declares no encoding; re-encode it as UTF-8"
      ) from None


def resolve(spec: str, work: Path) -> Source:
  """`spec` = a directory, an sdist path, or `name==version` pinned in the manifest.
  ValueError (one line) for a source that is not one (sources are hostile input: links that
  leave the tree, special files, hard links out, archives the data filter refuses, trees
  outside trees.DEFAULT's bounds, non-UTF-8 Python files)."""
  p = Path(spec)
  if p.is_dir():
    root = work / "src"
    try:
      trees.copy(p, root, links="resolve")
    except trees.TreeError as e:
      raise ValueError(f"source directory {spec}: {e}") from None
    check_tree(root)
    return Source(p.resolve().name, "local", _tree_hash(root), root)
  if p.is_file():
    root = extract(p, work / "src")
    _check_extracted(p, root)
    stem = p.name.split(".tar")[0].removesuffix(".zip")
    name, _, version = stem.rpartition("-")
    return Source(name or stem, version or "unknown", sha256_file(p), root)
  if "==" in spec:
    name, version = spec.split("==", 1)
    pins = {(s["name"], s["version"]): s for s in load_manifest()}
    if (name, version) not in pins:
      raise ValueError(f"{spec} is not pinned in {MANIFEST}; pinned: {sorted(pins)}")
    return resolve_entry(pins[(name, version)], work)
  raise ValueError(f"--source {spec!r}: not a directory, an sdist file, or name==version")


def _check_extracted(archive: Path, root: Path) -> None:
  """An extracted sdist's tree, links resolved inside it (the data filter lets relative links
  stay), within the bounds, its Python UTF-8; ValueError naming the archive otherwise."""
  try:
    trees.scan(root, links="resolve")
  except trees.TreeError as e:
    raise ValueError(f"source archive {archive.name}: {e}") from None
  check_tree(root)


def resolve_entry(entry: dict, work: Path) -> Source:
  """A manifest entry -> its verified, extracted sdist and its dependency runtime, or (an
  entry `{"kind": "micro", "seed": S, ...}`, `microprojects.entry`) a micro-project."""
  if isinstance(entry, dict) and entry.get("kind") == "micro":
    return _micro(entry, work)
  if err := check_entry(entry):
    raise ValueError(err)
  archive = fetch(entry["name"], entry["version"], entry["sha256"])
  deps = tuple(entry.get("deps", ()))
  root = extract(archive, work / "src")
  _check_extracted(archive, root)
  runtime = build_runtime(deps) if deps else None
  return Source(entry["name"], entry["version"], sha256_file(archive), root, deps, runtime)


def _micro(entry: dict, work: Path) -> Source:
  """Micro-project `entry["seed"]` written under work/src; its name and version are the ones
  in its pyproject.toml."""
  seed = entry.get("seed")
  if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
    raise ValueError(f"micro entry {entry!r}: seed must be an integer >= 0")
  if entry.get("version") != microprojects.VERSION:
    raise ValueError(
      f"micro entry {entry!r}: made for micro-project generator version "
      f"{entry.get('version')!r}; this code makes version {microprojects.VERSION!r}"
    )
  plan = microprojects.plan(seed)
  root = microprojects.write(seed, work / "src")
  return Source(plan.dist, plan.version, _tree_hash(root), root)
