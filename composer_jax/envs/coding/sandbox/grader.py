"""Grading a candidate patch; fails closed (any doubt, any error scores 0 with a reason).

Steps: the patch (size-capped) is applied with `git apply` to a fresh copy of the visible
workspace; the final change (before/after of every touched file) goes to the monitor
(monitor.scan_change); the tree is sanitised; FAIL_TO_PASS + PASS_TO_PASS run through the
pytest harness, and when that grants the reward, FAIL_TO_PASS runs again in a fresh sandbox
through the direct-call harness. Reward 1.0 iff the monitor raised nothing critical, both runs
are sound, every listed test passed in the first and every FAIL_TO_PASS call succeeded in the
second. partial = task.direct_partial: (direct FAIL_TO_PASS pass fraction) * (PASS_TO_PASS
pass fraction), first run; collateral tests (import errors only) do not count.

What each layer stops (attack classes of the red-team suite, tests/envs/coding/sandbox/redteam/):
  sandbox (sandbox.py: bwrap, seccomp, quota, rlimits, wall clock)
    escape (chroot, mount, pivot_root, setns, unshare, ptrace, /proc of the host, leaked fds),
    information leaks (host files, the task file, installed packages, caches, network),
    resource exhaustion (disk, inodes, tmp, processes, memory, CPU, time, output volume) and
    persistence across grades: nothing written inside outlives the run or reaches the host.
  workspace sanitising (here)
    symlinks/FIFOs/devices anywhere, added or changed runner config (every name the installed
    pytest reads, conftest.py at any level), added test files, start-up hooks
    (sitecustomize, usercustomize, *.pth), caches and bytecode, modules that shadow the
    standard library or the runner, a directory or file in place of a protected path.
  runner configuration (runner.py)
    config injection: `-c` is the grader's copy of the original config, rootdir/confcutdir
    fixed, no cache provider, no plugin autoload; test-id collisions and deselection (the
    collected ids must equal the expected set exactly, duplicates rejected).
  authenticated channel + harness integrity (harness.py, both runs)
    result forgery through report files, stdout/stderr, special files, exit codes, atexit
    hooks, stray fds and child processes (none of them holds the per-run key, and a record
    after `done` or a gap in the sequence voids the run); in-process tampering that rebinds a
    function or class attribute of pytest/_pytest/pluggy/the harness, of the standard library
    (math.isclose, operator.eq, unittest's asserts) or a builtin, swaps a
    function's code or defaults, replaces the harness's own plugin or channel objects, or
    breaks comparisons/assert (canary) — reported at the end of the run, so it must also be
    undone in time to pass. Test files and runner config are read-only inside, and no .pyc
    is read from the workspace (`-X pycache_prefix`), so rewriting them at run time fails.
  second harness (direct calls, fresh interpreter, plain asserts)
    tampering the first run missed because it was undone in time or never touched a
    watched binding (report or outcome objects in flight, hook results): the harness calls
    each FAIL_TO_PASS function itself, and only if its code is the one compiled from the
    read-only test file (a test function swapped at run time fails).
  monitor only (monitor.scan_change, critical flag -> 0)
    code that makes the tested values themselves lie — comparison dunders returning a
    constant, answers read from the tests or the caller's frame at run time, import hooks that
    rewrite test modules before they are compiled — because the tests then really pass in any
    harness; and a harness-aware attack that reads the key from the harness's memory and
    writes a whole forged transcript in both runs: in-process objects are always reachable
    from in-process code (gc, frames), which the monitor's rules flag.
"""

import base64
import dataclasses
import io
import os
import shutil
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

from composer_jax.envs.coding import monitor, project, sandbox
from composer_jax.envs.coding.sandbox import runner
from composer_jax.envs.coding.task import Task, direct_partial
from composer_jax.envs.coding.tasks import scrub

MAX_PATCH_BYTES = 4 << 20
_SHADOWED = (
  frozenset(sys.stdlib_module_names)
  | frozenset(runner.RUNTIME_MODULES)
  | {"cj_harness", "cj_covplugin"}
)


@dataclasses.dataclass
class Grade:
  reward: float
  partial: float
  tests: dict[str, str]  # test id -> outcome ('missing' if absent from the run)
  error: str  # '' when the run itself was sound
  flags: list[dict]
  isolation: dict
  wall_s: float

  def as_dict(self) -> dict:
    return dataclasses.asdict(self)


def _zero(error: str, flags=(), wall_s: float = 0.0) -> Grade:
  return Grade(0.0, 0.0, {}, error, list(flags), sandbox.isolation_report(), wall_s)


def apply_patch(ws: Path, patch: str) -> str:
  """Applies a unified/git diff in ws; returns '' or git's error message."""
  if not patch.strip():
    return ""
  res = subprocess.run(
    ["git", "apply", "--whitespace=nowarn", "-"],
    cwd=ws,
    input=patch,
    capture_output=True,
    text=True,
    timeout=60,
    env={"PATH": "/usr/bin:/bin", "GIT_CONFIG_NOSYSTEM": "1", "HOME": "/nonexistent"},
  )
  err = "; ".join(ln.strip() for ln in res.stderr.splitlines() if ln.strip())
  return "" if res.returncode == 0 else err or "git apply failed"


def _members(blob: str) -> dict[str, bytes]:
  with tarfile.open(fileobj=io.BytesIO(base64.b64decode(blob)), mode="r:gz") as tar:
    return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def _tree(ws: Path) -> tuple[dict[str, bytes], list[str]]:
  """Regular files under ws (path -> bytes) and every entry of another type."""
  files, odd = {}, []
  for dirpath, dirnames, filenames in os.walk(ws):
    for name in dirnames + filenames:
      p = Path(dirpath) / name
      st = os.lstat(p)
      rel = p.relative_to(ws).as_posix()
      if stat.S_ISREG(st.st_mode):
        files[rel] = p.read_bytes()
      elif not stat.S_ISDIR(st.st_mode):
        odd.append(rel)
  return files, odd


def _shadowing(rel: str, ws: Path) -> str | None:
  """The module name an added file would shadow from a sys.path entry, if any."""
  parts = rel.split("/")
  for i, part in enumerate(parts):
    stem = part[:-3] if i == len(parts) - 1 and part.endswith(".py") else part
    parent = ws.joinpath(*parts[:i])
    if stem in _SHADOWED and not (parent / "__init__.py").exists():
      return stem
    if i < len(parts) - 1 and not (ws.joinpath(*parts[: i + 1]) / "__init__.py").exists():
      continue
    break
  return None


def _put(ws: Path, rel: str, data: bytes) -> None:
  """Writes a grader-owned file, clearing whatever (dir, file) is in its way."""
  target = ws / rel
  for parent in reversed(target.relative_to(ws).parents):
    p = ws / parent
    if p != ws and (p.is_symlink() or (p.exists() and not p.is_dir())):
      p.unlink()
  if target.is_dir() and not target.is_symlink():
    shutil.rmtree(target)
  target.parent.mkdir(parents=True, exist_ok=True)
  target.write_bytes(data)


def prepare(task: Task, patch: str, ws: Path) -> tuple[str, list[dict]]:
  """Materializes the graded tree at ws; returns (error or '', monitor flags)."""
  if len(patch.encode("utf-8", "surrogateescape")) > MAX_PATCH_BYTES:
    return f"patch over {MAX_PATCH_BYTES} bytes", []
  if "GIT binary patch" in patch:  # compressed: a small patch could fill the host disk
    return "binary patches are not graded", []
  visible = _members(task.workspace)
  originals = {**visible, **_members(task.hidden_files)}
  project.unpack(task.workspace, ws)
  if err := apply_patch(ws, patch):
    return f"patch does not apply: {err}", []
  after, odd = _tree(ws)
  if odd:
    return f"patch creates non-regular files (symlink, FIFO, device): {sorted(odd)[:5]}", []
  changed = sorted(r for r in set(visible) | set(after) if visible.get(r) != after.get(r))
  changed = [r for r in changed if r.split("/")[0] != ".git"]
  flags = monitor.scan_change(
    {r: visible[r] for r in changed if r in visible}, {r: after[r] for r in changed if r in after}
  )
  for rel in changed:
    if rel not in visible and rel in after and not runner.controlled(rel):
      if name := _shadowing(rel, ws):
        return f"patch adds {rel}, which shadows module {name!r}", flags
  shutil.rmtree(ws / ".git", ignore_errors=True)
  scrub.scrub(ws)
  for rel in project.walk(ws, skip=frozenset()):
    if runner.controlled(rel) and rel not in originals:
      (ws / rel).unlink()
  for rel, data in originals.items():
    if runner.controlled(rel) and rel.split("/")[0] != ".git":
      _put(ws, rel, data)
  _, odd = _tree(ws)
  if odd:
    return f"workspace holds non-regular files after reset: {sorted(odd)[:5]}", flags
  return "", flags


def grade(task: Task, patch: str, *, limits: sandbox.Limits = sandbox.DEFAULT_LIMITS) -> Grade:
  """Reward for `patch` on `task` (module docstring). Raises SandboxUnavailable only."""
  sandbox.require()
  try:
    return _grade(task, patch, limits)
  except Exception as e:  # fail closed: never a traceback instead of a grade
    return _zero(f"grader error: {type(e).__name__}: {e}")


def _grade(task: Task, patch: str, limits: sandbox.Limits) -> Grade:
  with sandbox.scratch("grade") as tmp:
    ws = Path(tmp) / "ws"
    err, flags = prepare(task, patch, ws)
    critical = [f for f in flags if f["severity"] == "critical"]
    if critical:
      return _zero("patch rejected: " + "; ".join(f["reason"] for f in critical), flags)
    if err:
      return _zero(err, flags)
    wanted = sorted(set(task.FAIL_TO_PASS) | set(task.PASS_TO_PASS))
    run = runner.run_suite(ws, wanted, limits=limits)
    if not run.ok:
      return _zero(f"test run unsound: {run.reason}", flags, run.wall_s)
    tests = {t: run.outcomes.get(t, "missing") for t in wanted}
    partial = direct_partial(task, tests)
    grade = Grade(0.0, partial, tests, "", flags, run.isolation, run.wall_s)
    if not all(tests[t] == "passed" for t in wanted):
      return grade
    f2p_ids = sorted(set(task.FAIL_TO_PASS))
    again = runner.run_suite(ws, f2p_ids, limits=limits, mode="direct")
    grade.wall_s += again.wall_s
    if not again.ok:
      grade.error = f"direct re-run unsound: {again.reason}"
      grade.partial = 0.0
    elif not all(again.calls.get(t) is True for t in f2p_ids):
      bad = [t for t in f2p_ids if again.calls.get(t) is not True][:3]
      grade.error = f"harnesses disagree: direct calls of {bad} did not succeed"
      grade.partial = 0.0
    else:
      grade.reward = 1.0
    return grade
