"""Source projects: pinned PyPI sdists (third_party/coding_sources.json), archives or directories.

Sdists are fetched at run time with `pip download --no-deps --no-binary :all:` into a cache,
checked against the pinned SHA-256, and never committed.
"""

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

MANIFEST = Path(__file__).resolve().parents[3] / "third_party" / "coding_sources.json"
CACHE = Path(os.environ.get("CJ_CODING_CACHE", Path.home() / ".cache" / "composer_jax" / "sdists"))


@dataclasses.dataclass(frozen=True)
class Source:
  name: str
  version: str
  archive_sha256: str  # sha256 of the sdist, or of the sorted file tree for a directory
  path: Path  # extracted project root

  def as_dict(self) -> dict:
    return {"name": self.name, "version": self.version, "archive_sha256": self.archive_sha256}


def load_manifest(path: Path = MANIFEST) -> list[dict]:
  return json.loads(Path(path).read_text())["sources"]


def sha256_file(path: Path) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
      h.update(chunk)
  return h.hexdigest()


def fetch(name: str, version: str, sha256: str, cache: Path = CACHE) -> Path:
  """The verified sdist for name==version (downloaded with pip on first use)."""
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
      raise RuntimeError(f"pip download {name}=={version} failed: {res.stderr.strip()[-500:]}")
    got = sha256_file(files[0])
    if got != sha256:
      raise ValueError(f"{files[0].name}: sha256 {got} does not match the pinned {sha256}")
    dest = cache / files[0].name
    shutil.move(files[0], dest)
    return dest


def _tree_hash(root: Path) -> str:
  h = hashlib.sha256()
  for dirpath, dirnames, filenames in sorted(os.walk(root)):
    dirnames.sort()
    for f in sorted(filenames):
      p = Path(dirpath) / f
      h.update(p.relative_to(root).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
  return h.hexdigest()


def extract(archive: Path, dest: Path) -> Path:
  """Extracts an sdist (tar.gz / zip) into dest and returns its single top-level directory."""
  dest.mkdir(parents=True, exist_ok=True)
  name = archive.name
  if name.endswith((".tar.gz", ".tgz", ".tar.bz2", ".tar")):
    with tarfile.open(archive) as tar:
      tar.extractall(dest, filter="data")
  elif name.endswith(".zip"):
    with zipfile.ZipFile(archive) as z:
      z.extractall(dest)
  else:
    raise ValueError(f"unsupported source archive {archive}; expected .tar.gz, .tgz, .zip or a dir")
  tops = [p for p in dest.iterdir()]
  return tops[0] if len(tops) == 1 and tops[0].is_dir() else dest


def resolve(spec: str, work: Path) -> Source:
  """`spec` = a directory, an sdist path, or `name==version` pinned in the manifest."""
  p = Path(spec)
  if p.is_dir():
    root = work / "src"
    shutil.copytree(p, root, symlinks=False)
    return Source(p.resolve().name, "local", _tree_hash(root), root)
  if p.is_file():
    root = extract(p, work / "src")
    stem = p.name.split(".tar")[0].removesuffix(".zip")
    name, _, version = stem.rpartition("-")
    return Source(name or stem, version or "unknown", sha256_file(p), root)
  if "==" in spec:
    name, version = spec.split("==", 1)
    pins = {(s["name"], s["version"]): s["sha256"] for s in load_manifest()}
    if (name, version) not in pins:
      raise ValueError(f"{spec} is not pinned in {MANIFEST}; pinned: {sorted(pins)}")
    archive = fetch(name, version, pins[(name, version)])
    return Source(name, version, sha256_file(archive), extract(archive, work / "src"))
  raise ValueError(f"--source {spec!r}: not a directory, an sdist file, or name==version")
