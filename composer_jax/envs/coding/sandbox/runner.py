"""Runs a project's pytest suite in the sandbox through the grader's harness (harness.py).

The runner configuration is the grader's: `-c` names a read-only copy of the project's
original pytest config (chosen host-side the way the installed pytest chooses, among
CONFIG_NAMES at the workspace root) or an empty one, `--rootdir`/`--confcutdir` are the
workspace, `-p no:cacheprovider`, plugin autoload is off (PYTEST_DISABLE_PLUGIN_AUTOLOAD) and
the only plugin besides pytest's own is the harness's (plus covplugin for test mapping). The
runtime is the installed pytest and its dependencies, bound read-only from this interpreter's
own installation (no copy, no cache), first on sys.path.

Outcomes come only from the authenticated channel (harness.verify); a run is unsound — and
scores 0 upstream — on a timeout, a cap hit, a bad record, a missing `done`, a changed runner
binding, a failed canary, or an exit status other than pytest's 0/1 (5 = nothing collected,
only for whole-suite runs).
"""

import atexit
import base64
import dataclasses
import functools
import importlib.util
import json
import os
import re
import secrets
import shutil
import sysconfig
from pathlib import Path

from _pytest.config import findpaths

from composer_jax.envs.coding import project, sandbox
from composer_jax.envs.coding.sandbox import harness
from composer_jax.envs.coding.tasks import sources

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
# Every config file name the installed pytest reads, in its order of preference.
CONFIG_NAMES = tuple(findpaths.CONFIG_LOADERS_BY_NAME)
_HERE = Path(__file__).parent
SITE = "/cj/site"  # the read-only pytest runtime inside the sandbox
_HARNESS = "/cj/harness.py"
_PYC = "/cj/pyc"  # sys.pycache_prefix inside: no .pyc is ever read from or written to /ws


@dataclasses.dataclass
class SuiteRun:
  """Outcome of one harness run: test id -> 'passed'|'failed'|'error'|'skipped'."""

  outcomes: dict[str, str]
  collection_errors: list[str]
  collected: list[str]
  returncode: int | None
  ok: bool  # authenticated, complete, untampered, finished in time
  reason: str
  wall_s: float
  isolation: dict
  log_tail: str
  blob: bytes | None = None  # the file named by run_suite(blob=...), read inside at the end
  calls: dict[str, bool] = dataclasses.field(default_factory=dict)  # mode "direct"


@functools.cache
def runtime_binds() -> dict[str, str]:
  """Sandbox path -> host path of the runner's read-only files: the harness, the installed
  pytest and its dependencies (this interpreter's own installation, not a copy), and the
  pycache (`-X pycache_prefix`) — see pycache()."""
  binds = {
    _HARNESS: str(_HERE / "harness.py"),
    f"{SITE}/cj_covplugin.py": str(_HERE / "covplugin.py"),
  }
  for name in RUNTIME_MODULES:
    spec = importlib.util.find_spec(name)
    if spec is None:
      continue
    if spec.submodule_search_locations:
      binds[f"{SITE}/{name}"] = next(iter(spec.submodule_search_locations))
    else:
      binds[f"{SITE}/{Path(spec.origin).name}"] = spec.origin
  stdlib = sysconfig.get_paths()["stdlib"]
  sources = {stdlib: stdlib, **{inside: host for inside, host in binds.items()}}
  binds[_PYC] = pycache(tuple(sorted(sources.items())))
  return binds


@functools.cache
def pycache(sources: tuple[tuple[str, str], ...]) -> str:
  """A private tree of the installed compiled files, laid out as `-X pycache_prefix` reads
  them, for the sandbox paths in `sources` (sandbox path -> host path). Python then never
  reads or writes a .pyc next to a workspace file, so none planted there at run time loads.
  Hard links (copies across filesystems) of the installation's own __pycache__ files; built
  once per process, removed at exit."""
  root = sandbox.tempdir("pyc")
  atexit.register(shutil.rmtree, root, ignore_errors=True)
  for inside, host in sources:
    if os.path.isfile(host):
      pairs = [(os.path.dirname(host), os.path.dirname(inside), [os.path.basename(host)])]
    else:
      pairs = [
        (d, os.path.normpath(os.path.join(inside, os.path.relpath(d, host))), files)
        for d, dirs, files in os.walk(host)
        if not dirs.__setitem__(slice(None), [x for x in dirs if "-packages" not in x])
      ]
    for d, mirror, files in pairs:
      for f in files:
        if not f.endswith(".py"):
          continue
        pyc = importlib.util.cache_from_source(os.path.join(d, f))
        if os.path.isfile(pyc):
          dest = os.path.join(root, mirror.lstrip("/"), os.path.basename(pyc))
          os.makedirs(os.path.dirname(dest), exist_ok=True)
          try:
            os.link(pyc, dest)
          except OSError:
            shutil.copyfile(pyc, dest)
  return root


def controlled(rel: str) -> bool:
  """Paths whose content is the grader's: tests, runner config, start-up hooks, .git."""
  name = rel.rsplit("/", 1)[-1]
  return (
    project.is_protected(rel)
    or name in CONFIG_NAMES
    or bool(project.STARTUP_HOOKS.search(rel))
    or rel.split("/")[0] == ".git"
  )


def config_file(ws: Path) -> Path | None:
  """The pytest config file pytest would use at the workspace root (None: use an empty one)."""
  for name, loader in findpaths.CONFIG_LOADERS_BY_NAME.items():
    p = ws / name
    if p.is_file() and not p.is_symlink() and loader(p) is not None:
      return p
  p = ws / "pyproject.toml"
  return p if p.is_file() and not p.is_symlink() else None


def import_paths() -> list[str]:
  return [f"{sandbox.WS}/src", sandbox.WS]


def run_suite(
  ws: Path,
  test_ids: list[str] | None = None,
  *,
  limits=sandbox.DEFAULT_LIMITS,
  extra_args: tuple[str, ...] = (),
  mode: str = "pytest",
  blob: str | None = None,
) -> SuiteRun:
  """Runs pytest on a copy of `ws` (all tests, or exactly `test_ids`) inside the sandbox.

  With `test_ids`, the collected set must equal them exactly (else unsound).
  """
  ws = Path(ws).resolve()
  key = secrets.token_bytes(32)
  with sandbox.scratch("cfg") as tmp:
    src = config_file(ws)
    ini = Path(tmp) / (src.name if src else "pytest.ini")
    if src:
      shutil.copyfile(src, ini)
    else:
      ini.write_text("[pytest]\n")
    args = [
      "-q",
      "-p",
      "no:cacheprovider",
      "-c",
      f"/cj/cfg/{ini.name}",
      f"--rootdir={sandbox.WS}",
      f"--confcutdir={sandbox.WS}",
      *(() if test_ids else ("--continue-on-collection-errors",)),
      *(("--assert=plain",) if mode == "direct" else ()),
      *extra_args,
      *(test_ids or []),
    ]
    frozen = [r for r in project.walk(ws, skip=frozenset()) if controlled(r) and r[:5] != ".git/"]
    # The dependency runtime is importable from the start (a config's filterwarnings may
    # import the project, hence its dependencies, before the root conftest.py runs), and is
    # the site-packages of the processes a test starts (`python -m pkg`, `python -c` under its
    # own PYTHONPATH), as if installed.
    deps = ws / sources.RUNTIME_DIR
    site = {sandbox.base_site(): str(deps)} if deps.is_dir() else {}
    paths = import_paths() + ([f"{sandbox.WS}/{sources.RUNTIME_DIR}"] if site else [])
    cfg = {
      "key": key.hex(),
      "mode": mode,
      "args": args,
      "site": SITE,
      "paths": paths,
      "blob": blob,
      "frozen": [f"{sandbox.WS}/{r}" for r in frozen if r.endswith(".py")],
    }
    res = sandbox.run(
      [sandbox.real_python(), "-I", "-S", "-B", "-X", f"pycache_prefix={_PYC}", _HARNESS],
      workspace=ws,
      ro={**runtime_binds(), **site, f"/cj/cfg/{ini.name}": str(ini)},
      ro_inside=frozen,
      stdin=json.dumps(cfg).encode(),
      limits=limits,
    )
  return check(res, key, test_ids)


_E_LINE = re.compile(r"^E +(\S.*)$", re.M)


def pytest_error(log: str, k: int = 3) -> str:
  """pytest's own words for a failed run, in one line: its `ERROR:` usage line and the last k
  distinct `E   ...` lines (the exceptions of the first error report), at most 400 chars."""
  text = log[-20000:]
  usage = [ln.strip() for ln in text.splitlines() if ln.startswith("ERROR: ")][:1]
  first = text.split("\n___", 2)[1] if text.count("\n___") >= 2 else text
  excs = list(dict.fromkeys(m.group(1).strip() for m in _E_LINE.finditer(first)))[-k:]
  return " | ".join(usage + excs)[:400]


def check(res: sandbox.Result, key: bytes, expected: list[str] | None) -> SuiteRun:
  """Fail-closed reading of a finished run (see the module docstring)."""
  run = SuiteRun({}, [], [], res.returncode, False, "", res.wall_s, res.isolation, res.log[-4000:])
  if res.error:
    run.reason = res.error
    return run
  try:
    records = harness.verify(key, res.channel)
  except ValueError as e:
    run.reason = f"outcome channel rejected: {e}"
    return run
  done = [r for r in records if r.get("kind") == "done"]
  if len(done) != 1 or records[-1] is not done[0]:
    run.reason = f"runner did not finish cleanly (exit status {res.returncode})"
    return run
  done = done[0]
  collected = [i for r in records if r["kind"] == "collected" for i in r.get("ids", [])]
  run.collected = collected
  run.collection_errors = [r["id"] for r in records if r["kind"] == "collect_error"]
  for r in records:
    if r["kind"] == "test":
      prev = run.outcomes.get(r["id"])
      run.outcomes[r["id"]] = r["outcome"] if prev in (None, r["outcome"]) else "error"
    elif r["kind"] == "call":
      run.calls[r["id"]] = run.calls.get(r["id"], True) and r["ok"] is True
  if done.get("blob"):
    run.blob = base64.b64decode(done["blob"])
  allowed = (0, 1) if expected else (0, 1, 5)
  if done["tampered"]:
    run.reason = f"runner changed during the run: {done['tampered'][:5]}"
  elif not done["canary"]:
    run.reason = "canary comparison misbehaved: the interpreter was tampered with"
  elif done["rc"] not in allowed or res.returncode != done["rc"]:
    run.reason = f"pytest exit status {done['rc']} (process {res.returncode})"
    if why := pytest_error(res.log):
      run.reason += f": {why}"
  elif expected is not None and (
    len(collected) != len(set(collected)) or set(collected) != set(expected)
  ):
    missing = sorted(set(expected) - set(collected))[:3]
    extra = sorted(set(collected) - set(expected))[:3]
    run.reason = f"collected test ids differ from the expected set: missing {missing}, extra {extra}, duplicates {len(collected) - len(set(collected))}"
  else:
    run.ok = True
  return run
