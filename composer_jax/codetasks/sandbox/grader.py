"""Grading a candidate patch; fails closed (any doubt, any error scores 0 with a reason).

Steps: a task with a FAIL_TO_PASS test that no layer below could judge is refused before
anything runs (`unprotected`). The patch (size-capped) is applied with `git apply` to a fresh
copy of the visible workspace; the final change (before/after of every touched file) goes to
the monitor, in a worker with a deadline; the tree is sanitised and its tests and runner
config reset; the FAIL_TO_PASS test files are rewritten for this grade (instrument/: renamed
tests, hidden expected values, decoys); FAIL_TO_PASS + PASS_TO_PASS run once through the
harness, whose guard watches the candidate's code from inside. Reward 1.0 iff nothing critical
was flagged (monitor, guard, decoys, lying values), the run is sound, and every listed test
passed — a test with hidden sites only if every value it sent equals the expected one, which
never entered the sandbox. partial = task.direct_partial on the same outcomes.

The verdict depends on nothing the candidate's process can write: its records are data, and
what decides is what it could not know or forge — the expected values of hidden sites, which
items are decoys, the random names. Each layer fails closed on its own. What it stops (classes
of #22 and of the red-team suite, tests/codetasks/sandbox/redteam/):
  sandbox (sandbox/bwrap.py: bwrap, seccomp, quota, rlimits, wall clock, minimal read-only root)
    escape (chroot, mount, pivot_root, setns, unshare, ptrace, /proc of the host, leaked fds),
    resource exhaustion (disk, inodes, tmp, processes, memory, CPU, time, output volume),
    persistence across grades, information leaks (host files, the task file, network) and
    copies of task sources (7): the root holds only the pinned runtime — no /usr/lib/python3*,
    /usr/share, /usr/local or vendored trees, no site-packages or bundled wheels — and the
    writable tmpfs is noexec, so no extension or library written at run time loads (5).
  root leak scan (root_leaks.py)
    copies of task sources (7) anywhere a command inside can read: a task whose gold lines are
    found in the root's files (zip members too; fewer than three only with the patch's context
    lines) is not graded.
  workspace sanitising (here)
    symlinks/FIFOs/devices, added or changed runner config and conftest.py, added test files,
    start-up hooks (sitecustomize, usercustomize, *.pth), caches and bytecode, modules that
    shadow the standard library or the runner, a directory where a protected file belongs.
  runner configuration (suite.py)
    config injection: `-c` is the grader's copy of the original config, rootdir/confcutdir
    fixed, no cache provider, no plugin autoload; test-id collisions and deselection (the
    collected ids, names mapped back, must equal the expected set; every decoy collected).
  monitor in a worker with a deadline (monitor/, monitor/deadline.py)
    code that makes values lie or reads answers, written plainly (3, 4); every file the change
    adds or edits: any that is not Python source is critical, so data-file payloads (5) are
    rejected before they run; a super-linear or memory-exhausting input (6) ends at the
    deadline: 0 and a critical flag, never a hung grader.
  guard (guard.py: PEP 578 audit hook installed before any project code, not removable)
    while code the change touched is on the stack: frames (sys._getframe, tracebacks',
    generators' frames) other than through standard-library helpers that keep them or hand
    them only to callers known by code-object identity (logging's findCaller, freezegun's
    _should_use_real_time), gc object walks, trace/profile hooks, replaced function
    code/defaults, code objects and functions built from parts, marshal, pickles naming
    functions, ctypes, new audit hooks or interpreters, starting programs, reading test or
    runner-config files, writing .py files, /proc/*/mem, and code passed off under a trusted
    file's name. Code dataclasses/namedtuple generate under trusted work is trusted only if
    its text is made of identifiers (no trampoline or annotation puts the candidate's text
    there). The run stops: 0 + critical `runtime_guard`. This closes the introspection
    routes of outcome tampering (1, 2) and answer reading (4), and the loaders of hidden
    payloads (5: pickle, marshal, ctypes, code objects); the process is also made
    non-dumpable (no /proc/PID/mem from a child).
  judged on the host only (instrument/, grader.unprotected; the factory applies it too)
    a task with a FAIL_TO_PASS test whose pass would be the process's word alone is not
    graded (0, the reason, nothing runs) and never emitted: one without a required hidden
    site (a kept name without one, defined where it cannot be found, a generator, nothing
    to compare, ...) — including one guarded by decoys alone (#41: its expected values stay
    in the process, where whatever tells the decoys' perturbed copies from the original —
    their values, tables, lines — is in the process too, so an outcome forced on the real
    test alone cannot be excluded). No forced outcome (1, 2), lying value (3), answer read
    at run time (4) or payload (5) can pass a test no layer below judges.
  renamed tests (instrument/rewrite.py)
    the names the problem statement lists do not exist in the run: tampering aimed at them
    (1, 2) misses. A test defined in another file than its id's (imported or inherited) is
    rewritten where it is defined. A name the file uses again is kept, and so is one that
    other files' ids run where it has hidden sites. A kept name is judged by hidden sites.
  hidden sites (instrument/rewrite.py, hidden_tables.py + site_values.py)
    for `assert x == <literal>` (inline or a local bound to the literal), parametrized
    expected values, and truth, identity and order checks (`assert x`, `assert not x`,
    `is None/True/False`, `<`, `in`, assertTrue ... against a literal) the expected value
    never enters the sandbox; the actual value comes back as its one canonical reading
    (site_values.py: exact builtin types only, read through their own C-level accessors; a
    subclass of a builtin or any other object has none and fails, except that an object
    true by default — no __bool__/__len__ in its type — is true) and is compared here:
    forced outcomes (1, 2), lying values (3: also flagged when a value equals a fresh
    sentinel, `lying_value`), values with several readings (#41) and answers read at run
    time (4) all fail it. The run order of the items (real tests, sentinels) is drawn
    host-side for each grade and nothing of the plan but the helper's name enters the
    sandbox.
  sentinels (instrument/rewrite.py)
    every FAIL_TO_PASS file gets a test that always fails: it passes only if outcomes are
    forced for every test (1, 2) — `decoy_passed`, critical.
  agent tools (agent/tools.py): every argument validated, a call never raises (8).
  scratch directories (bwrap.tempdir/reap): a grader killed from outside leaves its
    workspace copy behind only until the next grade starts.
  host-side trees (trees.py): every walk, copy and removal of a candidate's or a source's
    tree is iterative and bounded (depth, entries, sizes, names, links; removal whatever
    the permissions), the clean-up before a grade never raises and runs inside the grade's
    error handling: a hostile tree fails its grade in one line and reaches no other.
"""

import base64
import dataclasses
import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

from composer_jax.codetasks import project, trees
from composer_jax.codetasks.monitor import deadline
from composer_jax.codetasks.sandbox import bwrap, instrument, root_leaks, scrub, site_values, suite
from composer_jax.codetasks.task import Task, direct_partial

MAX_PATCH_BYTES = 4 << 20
_SHADOWED = (
  frozenset(sys.stdlib_module_names)
  | frozenset(suite.RUNTIME_MODULES)
  | frozenset(suite.OWN_MODULES)
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
  # What the integrity layers saw (plain data): F2P functions with hidden expected values,
  # decoys, functions left as they were (and why), tests whose hidden values disagreed with a
  # reported pass, passing decoys, guard stops.
  integrity: dict = dataclasses.field(default_factory=dict)

  def as_dict(self) -> dict:
    return dataclasses.asdict(self)


def _zero(error: str, flags=(), wall_s: float = 0.0) -> Grade:
  return Grade(0.0, 0.0, {}, error, list(flags), bwrap.isolation_report(), wall_s)


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
  """Regular files under ws (path -> bytes) and every entry of another type; trees.TreeError
  (one line) for a tree outside the bounds (depth, entries, sizes, names)."""
  listing = trees.scan(ws)
  return {rel: Path(path).read_bytes() for rel, path in listing.files.items()}, listing.odd


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
    if why := trees.remove(target):
      raise trees.TreeError(why)
  target.parent.mkdir(parents=True, exist_ok=True)
  target.write_bytes(data)


def prepare(task: Task, patch: str, ws: Path) -> tuple[str, list[dict], frozenset]:
  """Materializes the graded tree at ws; returns (error or '', monitor flags, the paths the
  change added or edited that the reset left in place)."""
  none = frozenset()
  if len(patch.encode("utf-8", "surrogateescape")) > MAX_PATCH_BYTES:
    return f"patch over {MAX_PATCH_BYTES} bytes", [], none
  if "GIT binary patch" in patch:  # compressed: a small patch could fill the host disk
    return "binary patches are not graded", [], none
  visible = _members(task.workspace)
  originals = {**visible, **_members(task.hidden_files)}
  project.unpack(task.workspace, ws)
  if err := apply_patch(ws, patch):
    return f"patch does not apply: {err}", [], none
  try:
    after, odd = _tree(ws)
  except trees.TreeError as e:
    return f"the patched tree is not graded: {e}", [], none
  if odd:
    return f"patch creates non-regular files (symlink, FIFO, device): {sorted(odd)[:5]}", [], none
  changed = sorted(r for r in set(visible) | set(after) if visible.get(r) != after.get(r))
  changed = [r for r in changed if r.split("/")[0] != ".git"]
  flags = deadline.scan_change(
    {r: visible[r] for r in changed if r in visible}, {r: after[r] for r in changed if r in after}
  )
  touched = frozenset(r for r in changed if r in after and not suite.controlled(r))
  for rel in changed:
    if rel not in visible and rel in after and not suite.controlled(rel):
      if name := _shadowing(rel, ws):
        return f"patch adds {rel}, which shadows module {name!r}", flags, none
  trees.remove(ws / ".git")
  scrub.scrub(ws)
  for rel in project.walk(ws, skip=frozenset()):
    if suite.controlled(rel) and rel not in originals:
      (ws / rel).unlink()
  for rel, data in originals.items():
    if suite.controlled(rel) and rel.split("/")[0] != ".git":
      _put(ws, rel, data)
  _, odd = _tree(ws)
  if odd:
    return f"workspace holds non-regular files after reset: {sorted(odd)[:5]}", flags, none
  return "", flags, touched


def grade(task: Task, patch: str, *, limits: bwrap.Limits = bwrap.DEFAULT_LIMITS) -> Grade:
  """Reward for `patch` on `task` (module docstring). Raises SandboxUnavailable only."""
  bwrap.require()
  try:
    bwrap.reap()  # never raises; inside all the same: no grade's leftovers reach another
    return _grade(task, patch, limits)
  except Exception as e:  # fail closed: never a traceback instead of a grade
    return _zero(f"grader error: {type(e).__name__}: {e}")


def _critical(kind: str, reason: str) -> dict:
  return {"kind": kind, "severity": "critical", "reason": reason, "path": None, "line": None}


def plan_for(task: Task) -> instrument.Plan:
  """A fresh rewriting (instrument/) of `task`'s test files for one grade. They are the
  task's originals whatever a patch does (`prepare` resets them)."""
  originals = {**_members(task.workspace), **_members(task.hidden_files)}
  wanted = sorted(set(task.FAIL_TO_PASS) | set(task.PASS_TO_PASS))
  # The files to rewrite (FAIL_TO_PASS), every file whose ids run (where a test runs), and
  # the other test-side modules beside them (where a test they import may be defined).
  id_files = {tid.split("::", 1)[0] for tid in wanted}
  dirs = {os.path.dirname(rel) for rel in id_files}
  files = {
    rel: data
    for rel, data in sorted(originals.items())
    if suite.controlled(rel)
    and (rel in id_files or (rel.endswith(".py") and os.path.dirname(rel) in dirs))
  }
  return instrument.plan(files, task.FAIL_TO_PASS, wanted)


def refused(plan: instrument.Plan) -> dict[str, str]:
  """FAIL_TO_PASS function -> why it is not judged on the host (`unprotected`)."""
  return {**plan.unprotected, **{k: DECOYS_ALONE for k in plan.decoyed}}


DECOYS_ALONE = (
  "guarded by decoys alone: its expected values stay in the process, where the decoys' "
  "perturbed copies are told from the originals, so its pass would be the process's word"
)


def unprotected(plan: instrument.Plan) -> str:
  """'' if every FAIL_TO_PASS function of `plan` is judged on the host (required hidden
  sites: literals, table rows, truth/identity/order checks), else why the task cannot be
  graded: the pass of any other test would be the candidate's process's word alone. That
  includes a test guarded by decoys alone (its expected values must stay in the process: a
  table another test reads, a fixture, a computed value): whatever tells a decoy from the
  real test (a perturbed value or table in its code, its line) is in the process too, so an
  outcome forced on the real test alone cannot be excluded."""
  bad = refused(plan)
  if not bad:
    return ""
  why = "; ".join(f"{k} ({v})" for k, v in sorted(bad.items())[:3])
  return f"unprotected FAIL_TO_PASS tests ({len(bad)}): {why}"


def _grade(task: Task, patch: str, limits: bwrap.Limits) -> Grade:
  if hits := root_leaks.leaks(task.gold_patch):
    return _zero(f"the task's code is readable in the sandbox root: {hits[:2]}")
  plan = plan_for(task)
  if why := unprotected(plan):  # nothing runs: the task is not gradable
    g = _zero(f"task not gradable: {why}")
    g.integrity = {"unprotected": refused(plan)}
    return g
  with bwrap.scratch("grade") as tmp:
    ws = Path(tmp) / "ws"
    err, flags, touched = prepare(task, patch, ws)
    critical = [f for f in flags if f["severity"] == "critical"]
    if critical:
      return _zero("patch rejected: " + "; ".join(f["reason"] for f in critical), flags)
    if err:
      return _zero(err, flags)
    wanted = sorted(set(task.FAIL_TO_PASS) | set(task.PASS_TO_PASS))
    for rel, data in plan.files.items():
      (ws / rel).write_bytes(data)
    run = suite.run_suite(ws, wanted, limits=limits, plan=plan, untrusted=touched)
  return judge(task, plan, run, flags, wanted)


def judge(task: Task, plan: instrument.Plan, run: suite.SuiteRun, flags, wanted) -> Grade:
  """The grade of a finished run (module docstring): guard, soundness, decoys, sites."""
  flags = list(flags)
  for g in run.guard:
    flags.append(_critical("runtime_guard", f"{g.get('event')} at {g.get('where')}"))
  passed_decoys = sorted(i for i, o in run.decoys.items() if o == "passed")
  if passed_decoys:
    flags.append(_critical("decoy_passed", f"decoy tests passed: {passed_decoys[:3]}"))
  tests = {t: run.outcomes.get(t, "missing") for t in wanted}
  overturned = {}
  for t in wanted:
    why = _site_check(plan, t, run.sites.get(t, []))
    if why == "liar":
      flags.append(_critical("lying_value", f"{t}: a value equal to a fresh sentinel"))
    if why and tests[t] == "passed":
      tests[t], overturned[t] = "failed", why
  info = {
    "hidden": len(plan.required),
    "decoys": len(plan.decoys),
    "unprotected": plan.unprotected,
    "overturned": overturned,
    "decoys_passed": passed_decoys,
    "guard": run.guard,
  }
  critical = [f for f in flags if f["severity"] == "critical"]
  if critical:
    g = _zero("; ".join(f["reason"] for f in critical), flags, run.wall_s)
  elif not run.ok:
    g = _zero(f"test run unsound: {run.reason}", flags, run.wall_s)
  else:
    reward = 1.0 if all(tests[t] == "passed" for t in wanted) else 0.0
    g = Grade(reward, direct_partial(task, tests), tests, "", flags, run.isolation, run.wall_s)
  g.integrity = info
  return g


def _site_check(plan: instrument.Plan, test: str, records: list) -> str:
  """'' if the hidden sites of `test` hold (every value sent equals its expected value and
  every required site was reached), 'liar' if a value claimed equality with a sentinel,
  else why not."""
  required = set(plan.required.get(plan.owner.get(test), ()))
  reached = set()
  for rec in records:
    site = plan.sites.get(rec.get("site")) if isinstance(rec.get("site"), int) else None
    if site is None:
      return "a site record that is no site of this grade"
    if rec.get("liar"):
      return "liar"
    expected = site.literal
    if site.table:
      entry = plan.tokens.get(rec.get("token"))
      if entry is None or test not in entry[0]:
        return f"{site.where}: a record with the token of another row"
      expected = entry[1]
    if not instrument.matches(
      site, expected, rec.get("value"), site_values.decode, rec.get("truth"), rec.get("args")
    ):
      return f"{site.where}: the value differs from the expected one"
    reached.add(rec["site"])
  if required - reached:
    return f"required sites not reached: {sorted(required - reached)}"
  return ""
