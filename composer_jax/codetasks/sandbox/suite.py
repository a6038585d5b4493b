"""Runs a project's pytest suite in the sandbox through the grader's harness (harness.py).

The runner configuration is the grader's: `-c` names a read-only copy of the project's
original pytest config (chosen host-side the way the installed pytest chooses, among
CONFIG_NAMES at the workspace root) or an empty one, `--rootdir`/`--confcutdir` are the
workspace, `-p no:cacheprovider`, plugin autoload is off (PYTEST_DISABLE_PLUGIN_AUTOLOAD) and
the only plugin besides pytest's own is the harness's (plus covplugin for test mapping). The
runtime is the installed pytest and its dependencies, bound read-only from this interpreter's
own installation (no copy, no cache), first on sys.path.

Outcomes come only from the outcome fd's records (harness.py), read by `check`: plain JSON
lines in sequence, `done` last. Those records are written by code in the candidate's process,
so they are data to check, not a verdict: the grader decides with what the process could not
know (instrument/'s hidden sites and decoys). A run is unsound — and scores 0 upstream — on
a timeout, a cap hit, a malformed or out-of-sequence record, a missing `done`, an exit status
other than pytest's 0/1 (5 = nothing collected, only for whole-suite runs), collected ids other
than the expected ones, or a decoy that was not collected. A guard record (or the guard's exit
status) is kept in `SuiteRun.guard` whatever else happened.
"""

import atexit
import base64
import dataclasses
import functools
import importlib.util
import json
import os
import re
import shutil
import sysconfig
from pathlib import Path

from _pytest.config import findpaths

from composer_jax.codetasks import project
from composer_jax.codetasks.sandbox import bwrap, dependencies, guard, instrument

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
# The grader's own modules the harness imports there (name inside -> file of this package).
OWN_MODULES = {"cj_covplugin": "covplugin", "cj_guard": "guard", "cj_values": "site_values"}
_HARNESS = "/cj/harness.py"
PYCACHE = _PYC = "/cj/pyc"  # sys.pycache_prefix inside: no .pyc is read from or written to /ws


@dataclasses.dataclass
class SuiteRun:
  """Outcome of one harness run: test id -> 'passed'|'failed'|'error'|'skipped' (ids with
  their original names; a plan's decoys apart)."""

  outcomes: dict[str, str]
  collection_errors: list[str]
  collected: list[str]
  returncode: int | None
  ok: bool  # complete, in sequence, the expected ids, finished in time
  reason: str
  wall_s: float
  isolation: dict
  log_tail: str
  blob: bytes | None = None  # the file named by run_suite(blob=...), read inside at the end
  decoys: dict[str, str] = dataclasses.field(default_factory=dict)  # decoy item -> outcome
  sites: dict[str, list] = dataclasses.field(default_factory=dict)  # test id -> site records
  guard: list[dict] = dataclasses.field(default_factory=list)  # what the guard stopped


@functools.cache
def runtime_binds() -> dict[str, str]:
  """Sandbox path -> host path of the runner's read-only files: the harness, the installed
  pytest and its dependencies (this interpreter's own installation, not a copy), and the
  pycache (`-X pycache_prefix`) — see pycache()."""
  binds = {_HARNESS: str(_HERE / "harness.py")}
  binds |= {f"{SITE}/{name}.py": str(_HERE / f"{src}.py") for name, src in OWN_MODULES.items()}
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
  root = bwrap.tempdir("pyc")
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
  return [f"{bwrap.WS}/src", bwrap.WS]


def run_suite(
  ws: Path,
  test_ids: list[str] | None = None,
  *,
  limits=bwrap.DEFAULT_LIMITS,
  extra_args: tuple[str, ...] = (),
  blob: str | None = None,
  plan: instrument.Plan | None = None,
  untrusted: frozenset[str] = frozenset(),
) -> SuiteRun:
  """Runs pytest on a copy of `ws` (all tests, or exactly `test_ids`) inside the sandbox.

  With `test_ids`, the collected set must equal them exactly (else unsound). `plan` is this
  run's rewriting of the test files (already written into `ws`): its renamed tests run under
  their new names, its decoys beside them. `untrusted`: workspace files the change touched
  (the guard treats their code as the candidate's; every other .py of `ws` is trusted).
  """
  ws = Path(ws).resolve()
  with bwrap.scratch("cfg") as tmp:
    src = config_file(ws)
    ini = Path(tmp) / (src.name if src else "pytest.ini")
    if src:
      shutil.copyfile(src, ini)
    else:
      ini.write_text("[pytest]\n")
    run_ids = plan.run_order(test_ids) if plan is not None and test_ids else test_ids
    args = [
      "-q",
      "-p",
      "no:cacheprovider",
      "-c",
      f"/cj/cfg/{ini.name}",
      f"--rootdir={bwrap.WS}",
      f"--confcutdir={bwrap.WS}",
      *(() if test_ids else ("--continue-on-collection-errors",)),
      *extra_args,
      *(run_ids or []),
    ]
    files = project.walk(ws, skip=frozenset())
    frozen = [r for r in files if controlled(r) and r[:5] != ".git/"]
    # The dependency runtime is importable from the start (a config's filterwarnings may
    # import the project, hence its dependencies, before the root conftest.py runs), and is
    # the site-packages of the processes a test starts (`python -m pkg`, `python -c` under its
    # own PYTHONPATH), as if installed.
    deps = ws / dependencies.RUNTIME_DIR
    site = {bwrap.base_site(): str(deps)} if deps.is_dir() else {}
    paths = import_paths() + ([f"{bwrap.WS}/{dependencies.RUNTIME_DIR}"] if site else [])
    inside = lambda rels: sorted(f"{bwrap.WS}/{r}" for r in rels)
    cfg = {
      "args": args,
      "site": SITE,
      "paths": paths,
      "blob": blob,
      "plan": plan.harness_config() if plan is not None else None,
      "trusted": inside(r for r in files if r.endswith(".py") and r not in untrusted),
      "protected": inside(
        r
        for r in frozen
        if not r.startswith(dependencies.RUNTIME_DIR.split("/")[0] + "/")
        and (r.endswith(".py") or r.rsplit("/", 1)[-1] in CONFIG_NAMES)
      ),
    }
    res = bwrap.run(
      [bwrap.real_python(), "-I", "-S", "-B", "-X", f"pycache_prefix={_PYC}", _HARNESS],
      workspace=ws,
      ro={**runtime_binds(), **site, f"/cj/cfg/{ini.name}": str(ini)},
      ro_inside=[r for r in frozen if r.endswith(".py")],
      stdin=json.dumps(cfg).encode(),
      limits=limits,
    )
  return check(res, test_ids, plan)


_E_LINE = re.compile(r"^E +(\S.*)$", re.M)


def pytest_error(log: str, k: int = 3) -> str:
  """pytest's own words for a failed run, in one line: its `ERROR:` usage line and the last k
  distinct `E   ...` lines (the exceptions of the first error report), at most 400 chars."""
  text = log[-20000:]
  usage = [ln.strip() for ln in text.splitlines() if ln.startswith("ERROR: ")][:1]
  first = text.split("\n___", 2)[1] if text.count("\n___") >= 2 else text
  excs = list(dict.fromkeys(m.group(1).strip() for m in _E_LINE.finditer(first)))[-k:]
  return " | ".join(usage + excs)[:400]


def records(blob: bytes) -> tuple[list[dict], list[dict], str]:
  """(records in sequence, guard records, '' or why the stream is unsound)."""
  out, guard = [], []
  lines = blob.split(b"\n")
  if lines[-1] != b"":
    return out, guard, "channel ends mid-record"
  why = ""
  for line in lines[:-1]:
    try:
      rec = json.loads(line)
    except ValueError:
      rec = None
    if isinstance(rec, dict) and rec.get("kind") == "guard" and rec.get("seq") == -1:
      guard.append(rec)  # written by the guard itself, outside the sequence, then it exits
    elif why:
      continue
    elif not isinstance(rec, dict) or rec.get("seq") != len(out) + 1:
      why = f"record {len(out) + 1} malformed or out of sequence"
    else:
      out.append(rec)
  return out, guard, why


def check(res: bwrap.Result, expected: list[str] | None, plan=None) -> SuiteRun:
  """Fail-closed reading of a finished run (see the module docstring)."""
  run = SuiteRun({}, [], [], res.returncode, False, "", res.wall_s, res.isolation, res.log[-4000:])
  recs, run.guard, why = records(res.channel)
  if res.returncode == guard.GUARD_EXIT and not run.guard:
    run.guard = [{"event": "the guard stopped the run", "where": "?"}]
  if res.error or why:
    run.reason = res.error or f"outcome channel rejected: {why}"
    return run
  done = [r for r in recs if r.get("kind") == "done"]
  if len(done) != 1 or recs[-1] is not done[0]:
    run.reason = f"runner did not finish cleanly (exit status {res.returncode})"
    return run
  done = done[0]
  kinds = lambda k: [r for r in recs if r.get("kind") == k]
  try:
    collected = [i for r in kinds("collected") for i in r["ids"]]
    run.collection_errors = [r["id"] for r in kinds("collect_error")]
    tests = [(r["id"], r["outcome"]) for r in kinds("test")]
    sites = [(r["test"], r) for r in kinds("site")]
    rc = done["rc"]
  except (KeyError, TypeError) as e:
    run.reason = f"outcome channel rejected: a record lacks {e}"
    return run
  split = plan.split if plan is not None else lambda i: ("other", i, "")
  run.collected = [split(i)[1] for i in collected if split(i)[0] != "decoy"]
  decoys_seen = {split(i)[2] for i in collected if split(i)[0] == "decoy"}
  for nodeid, outcome in tests:
    kind, tid, _ = split(nodeid)
    table = run.decoys if kind == "decoy" else run.outcomes
    key = nodeid if kind == "decoy" else tid
    prev = table.get(key)
    table[key] = outcome if prev in (None, outcome) else "error"
  for nodeid, rec in sites:
    run.sites.setdefault(split(nodeid)[1] if isinstance(nodeid, str) else "", []).append(rec)
  if done.get("blob"):
    run.blob = base64.b64decode(done["blob"])
  allowed = (0, 1) if expected else (0, 1, 5)
  missing_decoys = sorted(set(plan.decoys) - decoys_seen) if plan is not None else []
  if rc not in allowed or res.returncode != rc:
    run.reason = f"pytest exit status {rc} (process {res.returncode})"
    if why := pytest_error(res.log):
      run.reason += f": {why}"
  elif expected is not None and (
    len(run.collected) != len(set(run.collected)) or set(run.collected) != set(expected)
  ):
    missing = sorted(set(expected) - set(run.collected))[:3]
    extra = sorted(set(run.collected) - set(expected))[:3]
    dups = len(run.collected) - len(set(run.collected))
    run.reason = f"collected test ids differ from the expected set: missing {missing}, extra {extra}, duplicates {dups}"
  elif missing_decoys:
    run.reason = f"decoys not collected: {missing_decoys[:3]}"
  else:
    run.ok = True
  return run
