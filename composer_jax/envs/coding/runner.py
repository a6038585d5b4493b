"""Runs a project's pytest suite in the sandbox and returns per-test outcomes.

The sandboxed interpreter starts with `-I -S` and an explicit sys.path: the workspace (and its
src/ when present) plus a private copy of pytest and its dependencies (`runtime_dir`). No
site-packages directory is on the path, so nothing installed on the host can stand in for a
deleted feature. Per-test results come from pytest's JUnit XML (xunit1, which records each
test's file), written to a report directory outside the workspace. The bootstrap prints the
report's SHA-256 and leaves with os._exit, so atexit hooks in candidate code cannot rewrite the
report unnoticed.
"""

import compileall
import dataclasses
import hashlib
import importlib.util
import os
import shutil
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

from composer_jax.envs.coding import sandbox

# Importable top-level names the sandboxed runner needs (pytest's own dependencies + coverage).
RUNTIME_MODULES = (
  "pytest",
  "_pytest",
  "pluggy",
  "iniconfig",
  "packaging",
  "pygments",
  "py",
  "coverage",
)
_DIGEST_TAG = "CJ-JUNIT-SHA256"
_BOOTSTRAP = f"""
import hashlib, os, sys
report, paths, args = sys.argv[1], sys.argv[2].split(os.pathsep), sys.argv[3:]
sys.path[:0] = paths
import pytest
rc = pytest.main(args)
try:
  digest = hashlib.sha256(open(report, "rb").read()).hexdigest()
except OSError:
  digest = "missing"
sys.stdout.flush()
os.write(1, ("\\n{_DIGEST_TAG} %s %d\\n" % (digest, rc)).encode())
os._exit(int(rc))
"""
_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "composer_jax"


@dataclasses.dataclass
class SuiteRun:
  """Outcome of one pytest run: test id -> 'passed'|'failed'|'error'|'skipped'."""

  outcomes: dict[str, str]
  collection_errors: list[str]
  returncode: int
  ok: bool  # report present, untampered, run finished (rc 0 or 1), not timed out
  reason: str
  wall_s: float
  isolation: dict
  log_tail: str


def runtime_dir() -> Path:
  """A cached private copy of pytest + deps + coverage (copied from this interpreter)."""
  specs = {m: importlib.util.find_spec(m) for m in RUNTIME_MODULES}
  plugin = Path(__file__).with_name("covplugin.py")
  key = hashlib.sha256(
    repr(
      (sorted((m, s.origin) for m, s in specs.items() if s), _BOOTSTRAP, plugin.read_text())
    ).encode()
  )
  # A per-user cache, not /tmp: nobody else may plant a pytest there.
  dest = _CACHE / f"runtime-{key.hexdigest()[:12]}"
  _CACHE.mkdir(parents=True, exist_ok=True)
  if (dest / "bootstrap.py").exists():
    return dest
  staging = Path(tempfile.mkdtemp(prefix="staging-", dir=_CACHE))
  for name, spec in specs.items():
    if spec is None:
      continue
    if spec.submodule_search_locations:
      src = Path(next(iter(spec.submodule_search_locations)))
      shutil.copytree(
        src, staging / "site" / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
      )
    else:
      (staging / "site").mkdir(exist_ok=True)
      shutil.copy2(spec.origin, staging / "site" / Path(spec.origin).name)
  shutil.copy2(plugin, staging / "site" / "cj_covplugin.py")
  (staging / "bootstrap.py").write_text(_BOOTSTRAP)
  # Precompiled once here: the sandbox runs with -B on a read-only copy.
  compileall.compile_dir(staging / "site", quiet=2)
  os.chmod(staging, 0o755)
  try:
    staging.rename(dest)
  except OSError:  # another process won the race
    shutil.rmtree(staging, ignore_errors=True)
  return dest


def import_paths(ws: Path) -> list[str]:
  paths = [str(ws)]
  if (ws / "src").is_dir():
    paths.insert(0, str(ws / "src"))
  return paths


def _nodeid(root: Path | None, file: str, classname: str, name: str) -> str:
  """pytest's nodeid `dir/test_x.py::Cls::test[p]` from a JUnit (xunit1) testcase.

  The classname is the nodeid's path (dotted, without .py) plus its classes. The `file`
  attribute is where the test function is defined, which differs for tests inherited from a
  mixin in another file, so the module is found as the longest classname prefix that names a
  file under root; `file` is only the fallback.
  """
  parts = classname.split(".") if classname else []
  for k in range(len(parts), 0, -1):
    cand = "/".join(parts[:k]) + ".py"
    if root is not None and (root / cand).is_file():
      return "::".join([cand, *parts[k:], name])
  module = file[:-3].replace("/", ".") if file.endswith(".py") else file.replace("/", ".")
  rest = classname[len(module) :].strip(".") if classname.startswith(module) else ""
  return "::".join([file, *(p for p in rest.split(".") if p), name])


def parse_junit(xml_bytes: bytes, root: Path | None = None) -> tuple[dict[str, str], list[str]]:
  """JUnit (xunit1) -> ({nodeid: outcome}, collection-error module names).

  A test reported twice with different outcomes is 'error' (fail closed).
  """
  tree = ET.fromstring(xml_bytes)
  outcomes, coll_errors = {}, []
  for case in tree.iter("testcase"):
    file, cls, name = case.get("file"), case.get("classname", ""), case.get("name", "")
    tags = {child.tag for child in case}
    if not file:
      coll_errors.append(f"{cls}.{name}".strip("."))
      continue
    nodeid = _nodeid(root, file, cls, name)
    if "error" in tags:
      outcome = "error"
    elif "failure" in tags:
      outcome = "failed"
    elif "skipped" in tags:
      outcome = "skipped"
    else:
      outcome = "passed"
    prev = outcomes.get(nodeid)
    if prev is not None and prev != outcome:
      outcome = "error" if "passed" in (prev, outcome) else prev
    outcomes[nodeid] = outcome
  return outcomes, coll_errors


def run_suite(
  ws: Path,
  test_ids: list[str] | None = None,
  *,
  limits=sandbox.DEFAULT_LIMITS,
  extra_args: tuple[str, ...] = (),
) -> SuiteRun:
  """Runs pytest on `ws` (all tests, or exactly `test_ids`) inside the sandbox."""
  ws = ws.resolve()
  runtime = runtime_dir()
  report_dir = Path(tempfile.mkdtemp(prefix="cj-report-"))
  try:
    report = report_dir / "junit.xml"
    args = [
      "-q",
      "-p",
      "no:cacheprovider",
      f"--rootdir={ws}",
      f"--confcutdir={ws}",
      "--continue-on-collection-errors",
      "-o",
      "junit_family=xunit1",
      f"--junitxml={report}",
      *extra_args,
      *(test_ids or []),
    ]
    argv = [
      sandbox.real_python(),
      "-I",
      "-S",
      "-B",
      str(runtime / "bootstrap.py"),
      str(report),
      os.pathsep.join([*import_paths(ws), str(runtime / "site")]),
      *args,
    ]
    res = sandbox.run(
      argv, cwd=str(ws), rw=[str(ws), str(report_dir)], ro=[str(runtime)], limits=limits
    )
    tail = (res.stdout + res.stderr)[-4000:]
    reason, outcomes, coll = _check(res, report, ws)
    return SuiteRun(
      outcomes or {}, coll, res.returncode, reason == "", reason, res.wall_s, res.isolation, tail
    )
  finally:
    shutil.rmtree(report_dir, ignore_errors=True)


def _check(res: sandbox.Result, report: Path, ws: Path):
  """Fail-closed validation of a finished run: (reason or '', outcomes, collection errors)."""
  if res.timed_out:
    return "wall-time limit exceeded", None, []
  tags = [ln for ln in res.stdout.splitlines() if ln.startswith(_DIGEST_TAG + " ")]
  if len(tags) != 1:
    return f"runner did not finish cleanly (rc={res.returncode})", None, []
  _, digest, rc = tags[0].split()
  if rc not in ("0", "1") or str(res.returncode) != rc:
    return f"pytest exit code {rc} (process {res.returncode})", None, []
  if not report.exists() or hashlib.sha256(report.read_bytes()).hexdigest() != digest:
    return "report missing or modified after pytest wrote it", None, []
  try:
    outcomes, coll = parse_junit(report.read_bytes(), ws)
  except ET.ParseError as e:
    return f"unparseable report: {e}", None, []
  return "", outcomes, coll
