"""Task generator: map tests, break the project (delete a feature or inject a bug), validate.

Two synthesis methods share one validation:
  deletion  a tested feature removed with libcst (deletion.py); the statement gives its stubs;
  bug       one mutation of covered code (bug_injection.py); the statement describes the failing
            behaviour (failing test names and their failure messages), never the change.
Validation of a change (N = validation_runs re-runs of the whole suite on fresh copies):
  FAIL_TO_PASS = passed in every baseline run and did not pass in any post-change run;
  PASS_TO_PASS = passed in every baseline run and in every post-change run;
  anything else that passed before is flaky and dropped. A task is kept only if both lists are
  non-empty, some FAIL_TO_PASS test is direct (the coverage map says it executed the changed
  code; the others are collateral: they fail through an import of a deleted name, or ran the
  code where coverage does not see it, in a subprocess or thread), every FAIL_TO_PASS test of a deletion
  is explained (direct, or its file names a deleted symbol), FAIL_TO_PASS is at most
  max_f2p_fraction of the suite, the visible workspace passes the leak scan, every
  FAIL_TO_PASS test is one the grader judges on the host (grader.unprotected: required hidden
  sites; else it refuses to grade the task), and (verify) the gold patch
  grades 1.0 and the empty patch 0.0. Everything is deterministic given the seed.
The baseline and coverage map are computed once per project and, with `cache`, reused across
runs (keyed by the sdist and dependency hashes and the generator version).
"""

import dataclasses
import hashlib
import json
import random
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from composer_jax.codetasks import project, trees
from composer_jax.codetasks.sandbox import bwrap, dependencies, grader, scrub, suite
from composer_jax.codetasks.synthesis import (
  bug_injection,
  deletion,
  difficulty,
  hiding,
  testmap,
)
from composer_jax.codetasks.synthesis.sources import Source
from composer_jax.codetasks.task import Task, unified_diff

VERSION = "2"
METHODS = ("deletion", "bug")


@dataclasses.dataclass(frozen=True)
class Config:
  seed: int = 0
  max_tasks: int = 8  # per project, shared evenly by `methods` (a method short of its share
  # leaves the rest to the next)
  max_attempts: int = 30  # per method
  methods: tuple[str, ...] = ("deletion",)
  n_features: int = 1  # > 1: harder variants deleting related features of one module
  kinds: tuple[str, ...] = ("function", "class", "method", "module")
  bug_kinds: tuple[str, ...] = bug_injection.KINDS
  baseline_runs: int = 2  # in addition to the coverage-mapping run
  validation_runs: int = 2
  max_tests_per_feature: int = 80  # "few others": features many tests use are skipped
  max_f2p_fraction: float = 0.5
  verify: bool = True
  limits: bwrap.Limits = bwrap.DEFAULT_LIMITS


_MISSING = re.compile(r"No module named '([^']+)'")


def _collection_error(run: suite.SuiteRun) -> str:
  """Why no test of a suite could be collected, in one line: a module it imports that is not
  there (a dependency the source's pins lack) by name, else pytest's own words."""
  files = ", ".join(run.collection_errors[:3])
  if m := _MISSING.search(run.log_tail):
    return (
      f"its tests cannot import module {m.group(1)!r} ({files}): a dependency missing from "
      "the source's pinned deps"
    )
  return f"its tests cannot be collected ({files}): {suite.pytest_error(run.log_tail)}"


class Generator:
  """Generates tasks from one source project (prepare() runs the baseline once)."""

  def __init__(
    self,
    source: Source,
    work: Path,
    cfg: Config = Config(),
    cache: Path | None = None,
    progress: Callable[[str], None] | None = None,
  ):
    self.check_methods(cfg.methods)
    self.source, self.work, self.cfg, self.cache = source, Path(work), cfg, cache
    self.orig = source.path
    self.log: list[str] = []  # one line per candidate: '<candidate>: kept' or ': <why not>'
    self.progress, self._start = progress, time.monotonic()

  def _note(self, line: str) -> None:
    """Logs a candidate's outcome and reports it."""
    self.log.append(line)
    self._report(line)

  def _report(self, line: str) -> None:
    """Progress: `line` with the counts so far, to the `progress` callback if there is one."""
    if self.progress is not None:
      kept = sum(ln.endswith(": kept") for ln in self.log)
      self.progress(
        f"{self.source.name} {self.source.version} [{len(self.log)} tried, {kept} kept, "
        f"{time.monotonic() - self._start:.0f} s] {line}"
      )

  @staticmethod
  def check_methods(methods) -> None:
    bad = sorted(set(methods) - set(METHODS))
    if bad or not methods:
      raise ValueError(f"synthesis methods {list(methods)}: valid ones are {list(METHODS)}")

  def _run(self, tree: Path, tag: str) -> suite.SuiteRun:
    """Runs the whole suite on a throwaway copy (tests may write into their tree)."""
    copy = self.work / f"run-{tag}"
    trees.copy(tree, copy)
    try:
      dependencies.install_runtime(self.source.runtime, copy)
      return suite.run_suite(copy, limits=self.cfg.limits)
    finally:
      trees.remove(copy)

  def _cache_key(self) -> str:
    blob = (self.source.as_dict(), VERSION, self.cfg.baseline_runs, self.cfg.limits.as_dict())
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:16]

  def prepare(self) -> None:
    """Baseline + coverage map. Raises ValueError for no tests or failing tests."""
    name = f"{self.source.name} {self.source.version}"
    # The sandbox's import path is the workspace + the runner's private site: a project that
    # shares a top-level name with the runner (pytest, pluggy, ...) would stay importable.
    files = project.source_files(self.orig)
    tops = {project.module_name(f).split(".")[0] for f in files}
    if not tops:
      raise ValueError(f"source {name} has no importable package or module")
    clash = tops & set(suite.RUNTIME_MODULES)
    if clash:
      raise ValueError(f"source {name}: package {sorted(clash)} is part of the test runner")
    self.project = deletion.Project(self.orig)
    path = self.cache / f"{self.source.name}-{self._cache_key()}.json" if self.cache else None
    if path is not None and path.exists():
      blob = json.loads(path.read_text())
      self.map = testmap.TestMap.from_json(blob["map"])
      self.passing, self.flaky, self.isolation = blob["passing"], blob["flaky"], blob["isolation"]
      return
    self._baseline(name, files)
    if path is not None:
      blob = {"map": self.map.to_json(), "passing": self.passing, "flaky": self.flaky}
      path.parent.mkdir(parents=True, exist_ok=True)
      tmp = path.with_name(path.name + ".partial")
      tmp.write_text(json.dumps({**blob, "isolation": self.isolation}))
      tmp.replace(path)

  def _baseline(self, name: str, files: list[str]) -> None:
    self._report(f"baseline: a coverage run and {self.cfg.baseline_runs} more runs of the suite")
    copy = self.work / "run-map"
    trees.copy(self.orig, copy)
    dependencies.install_runtime(self.source.runtime, copy)
    self.map, first = testmap.build(copy, files=files, limits=self.cfg.limits)
    trees.remove(copy)
    if first.collection_errors and not first.outcomes:
      raise ValueError(f"source {name}: {_collection_error(first)}")
    if first.returncode == 5 or (first.ok and not first.outcomes):
      raise ValueError(f"source {name} has no tests: pytest collected nothing")
    runs = [first] + [self._run(self.orig, f"base{i}") for i in range(self.cfg.baseline_runs)]
    bad = [r.reason for r in runs if not r.ok]
    if bad:
      raise ValueError(f"source {name}: baseline test run failed: {bad[0]}")
    failing = sorted(
      {t for r in runs for t, o in r.outcomes.items() if o in ("failed", "error")}
      | {c for r in runs for c in r.collection_errors}
    )
    always_failing = [t for t in failing if all(r.outcomes.get(t) != "passed" for r in runs)]
    if always_failing:
      why = _failure_messages(runs, always_failing, k=2) or [suite.pytest_error(first.log_tail)]
      raise ValueError(
        f"source {name}: {len(always_failing)} tests do not pass before any "
        f"deletion, e.g. {always_failing[:3]} ({'; '.join(why)[:300]}); only passing suites "
        "are usable"
      )
    self.passing = sorted(
      t for t in runs[0].outcomes if all(r.outcomes.get(t) == "passed" for r in runs)
    )
    self.flaky = sorted(set(failing) - set(always_failing))
    self.isolation = first.isolation["mode"]
    self._report(
      f"baseline: {len(self.passing)} tests pass in every run of {len(runs)}, "
      f"{len(self.map.symbols)} symbols mapped"
    )

  def _n_tests(self, sym) -> int:
    return len(set(self.passing).intersection(self.map.tests_by_symbol[sym.key]))

  def candidates(self) -> list[testmap.Symbol]:
    """Eligible features exercised by 1..max_tests_per_feature passing tests, seed-shuffled.

    Features that no test module imports by name come first: deleting them leaves every test
    module importable, so their FAIL_TO_PASS tests are direct rather than collateral.
    """
    out = [
      sym
      for key, sym in sorted(self.map.symbols.items())
      if sym.kind in self.cfg.kinds
      and 1 <= self._n_tests(sym) <= self.cfg.max_tests_per_feature
      and self.project.eligible(sym)
    ]
    random.Random(self.cfg.seed).shuffle(out)
    importers = self._test_importers()
    return sorted(out, key=lambda s: s.name in importers)

  def _test_importers(self) -> set[str]:
    """Names bound by `from ... import name` in some test file (an import-time dependency)."""
    pat = re.compile(r"^\s*from\s+\S+\s+import\s+\(?([^)#\n]*)", re.M)
    names = set()
    for rel in project.walk(self.orig):
      if rel.endswith(".py") and project.is_test_file(rel):
        text = (self.orig / rel).read_text(encoding="utf-8", errors="replace")
        for m in pat.finditer(text):
          names.update(n.split(" as ")[0].strip() for n in m.group(1).split(","))
    return names

  def related(self, primary: testmap.Symbol, pool: list[testmap.Symbol], k: int):
    """primary + the k nearest eligible non-overlapping features of the same file."""

    def overlaps(a, b):
      return a.qualname.split(".")[0] == b.qualname.split(".")[0] or "module" in (a.kind, b.kind)

    same = sorted(
      (s for s in pool if s.path == primary.path and not overlaps(s, primary)),
      key=lambda s: (abs(s.lines[0] - primary.lines[0]), s.key),
    )
    chosen = [primary]
    for s in same:
      if len(chosen) > k:
        break
      if not any(overlaps(s, c) for c in chosen):
        chosen.append(s)
    return chosen if len(chosen) == k + 1 else None

  def bug_candidates(self) -> list[tuple[testmap.Symbol, bug_injection.Mutation]]:
    """One seeded mutation per (function or method, kind) on covered lines, seed-shuffled."""
    rng = random.Random(self.cfg.seed)
    out = []
    for path in sorted(self.map.covered):
      covered = set(self.map.covered[path])
      code = (self.orig / path).read_text(encoding="utf-8")
      syms = [
        s
        for s in self.map.symbols.values()
        if s.path == path
        and s.kind in ("function", "method")
        and 1 <= self._n_tests(s) <= self.cfg.max_tests_per_feature
      ]
      for sym in sorted(syms, key=lambda s: s.key):
        lines = {ln for ln in covered if sym.lines[0] <= ln <= sym.lines[1]}
        by_kind = {}
        for m in bug_injection.mutations(code, lines) if lines else ():
          if m.kind in self.cfg.bug_kinds:
            by_kind.setdefault(m.kind, []).append(m)
        out += [(sym, rng.choice(ms)) for _, ms in sorted(by_kind.items())]
    rng.shuffle(out)
    return out

  def generate(self) -> list[Task]:
    if not hasattr(self, "map"):
      self.prepare()
    tasks = []
    for i, method in enumerate(self.cfg.methods):
      share = (self.cfg.max_tasks - len(tasks)) // (len(self.cfg.methods) - i)
      tasks += self.generate_deletions(share) if method == "deletion" else self.generate_bugs(share)
    return tasks

  def generate_deletions(self, max_tasks: int) -> list[Task]:
    pool = self.candidates()
    if not pool and max_tasks:
      self._note("deletion: no candidate: no eligible feature has 1..max_tests_per_feature tests")
    tasks, attempts = [], 0
    for primary in pool:
      if len(tasks) >= max_tasks or attempts >= self.cfg.max_attempts:
        break
      feats = self.related(primary, pool, self.cfg.n_features - 1)
      if feats is None:
        continue
      attempts += 1
      tasks += self._attempt(feats)
    return tasks

  def generate_bugs(self, max_tasks: int) -> list[Task]:
    tasks, pool = [], self.bug_candidates()
    if not pool and max_tasks:
      self._note("bug: no candidate: no covered function has 1..max_tests_per_feature tests")
    for sym, mut in pool[: self.cfg.max_attempts]:
      if len(tasks) >= max_tasks:
        break
      task, why = self._guarded(self.build_bug, sym, mut)
      self._note(f"bug {sym.key} {mut.kind}@{mut.line}: {why or 'kept'}")
      tasks += [task] if task is not None else []
    return tasks

  def _attempt(self, feats) -> list[Task]:
    task, why = self._guarded(self.build, feats)
    self._note(f"{'+'.join(f.key for f in feats)}: {why or 'kept'}")
    return [task] if task is not None else []

  @staticmethod
  def _guarded(fn, *args):
    """One candidate's failure (a libcst edge case, a crashed run) rejects only that candidate."""
    try:
      return fn(*args)
    except (ValueError, RuntimeError, OSError, SyntaxError) as e:
      return None, f"error: {type(e).__name__}: {str(e)[:200]}"

  def harder(self, t: Task) -> list[Task]:
    """A variant of deletion task t deleting one more related feature (curriculum callback).

    Bug tasks get none: the curriculum's harder bug tasks are the ones with higher
    difficulty.score (more direct tests, longer branches) already in the pool.
    """
    if t.method != "deletion":
      return []
    first = t.features[0]
    primary = self.map.symbols[f"{first['path']}::{first['qualname']}"]
    feats = self.related(primary, self.candidates(), len(t.features))
    return [] if feats is None else self._attempt(feats)

  def build(self, feats: list[testmap.Symbol]) -> tuple[Task | None, str]:
    """One candidate deletion -> (task, '') or (None, why it was rejected)."""
    dele = self.project.delete(feats)
    stubs = "\n\n".join(dele.stubs)
    many = "a feature" if len(feats) == 1 else f"{len(feats)} related features"
    intro = (
      f"The project `{self.source.name}` ({self.source.version}) is missing {many}. Implement "
      "the following so that the project's hidden tests pass; keep the rest of the project "
      "working. Do not modify tests or test configuration.\n\n```python\n" + stubs + "\n```\n\n"
    )
    change = Change(
      "deletion",
      feats,
      dele.changed,
      dele.removed_names,
      dele.removed_code,
      stubs,
      None,
      dele.tests,
    )
    return self._validate(change, lambda f2p, runs: intro + _hidden_list(f2p))

  def build_bug(self, sym: testmap.Symbol, mut: bug_injection.Mutation):
    """One candidate mutation -> (task, '') or (None, why it was rejected)."""
    # The leak scan looks for whole original lines the mutation changed (a node's own text,
    # say `x is not None`, also occurs inside kept lines).
    old = (self.orig / sym.path).read_text(encoding="utf-8").splitlines()
    gone = sorted(set(old) - set(mut.new_code.splitlines()))
    change = Change("bug", [sym], {sym.path: mut.new_code}, [], ["\n".join(gone)], "", mut)

    def statement(f2p, runs):
      msgs = _failure_messages(runs, f2p)
      return (
        f"A bug was introduced into the project `{self.source.name}` "
        f"({self.source.version}): behaviour its tests check is now wrong. Find and fix it so "
        "that the project's hidden tests pass; keep the rest of the project working. Do not "
        "modify tests or test configuration.\n\n"
        + _hidden_list(f2p)
        + ("\nHow they fail:\n" + "".join(f"- {m}\n" for m in msgs) if msgs else "")
      )

    return self._validate(change, statement)

  def _validate(self, change: "Change", statement) -> tuple[Task | None, str]:
    tag = hashlib.sha256(repr((self.cfg.seed, change.key())).encode()).hexdigest()[:10]
    tdir = self.work / f"task-{tag}"
    broken = tdir / "broken"
    trees.copy(self.orig, broken)
    try:
      return self._check(change, tag, tdir, broken, statement)
    finally:
      trees.remove(tdir)

  def _check(self, change, tag, tdir, broken, statement):
    for rel, text in change.tests.items():
      (broken / rel).write_text(text, encoding="utf-8")
    for rel, text in change.changed.items():
      if text is None:
        (broken / rel).unlink()
      else:
        (broken / rel).write_text(text, encoding="utf-8")
    mapped = {t for f in change.feats for t in self.map.tests_by_symbol[f.key]}
    runs = []
    for i in range(self.cfg.validation_runs):
      runs.append(self._run(broken, f"{tag}-v{i}"))
      if not runs[-1].ok:
        return None, f"post-change run unsound: {runs[-1].reason}"
      f2p = [t for t in self.passing if all(r.outcomes.get(t) != "passed" for r in runs)]
      p2p = [t for t in self.passing if all(r.outcomes.get(t) == "passed" for r in runs)]
      # Both lists only shrink with more runs: an empty one is final after any run.
      if not f2p or not p2p:
        return None, f"empty FAIL_TO_PASS ({len(f2p)}) or PASS_TO_PASS ({len(p2p)})"
      if not mapped & set(f2p):
        return None, f"no direct FAIL_TO_PASS test (all {len(f2p)} collateral)"
    if len(f2p) > self.cfg.max_f2p_fraction * len(self.passing):
      return None, f"change breaks {len(f2p)}/{len(self.passing)} tests"
    direct = [t for t in f2p if t in mapped]
    names = change.removed_names
    name_re = re.compile(r"\b(" + "|".join(map(re.escape, names)) + r")\b") if names else None
    unexplained = [
      t
      for t in f2p
      if t not in mapped
      and not (
        name_re
        and name_re.search(
          (self.orig / t.split("::")[0]).read_text(encoding="utf-8", errors="replace")
        )
      )
    ]
    # A mutation changes behaviour only where its code runs, so every FAIL_TO_PASS test of a bug
    # is explained (coverage misses code run in subprocesses and threads); a deletion can also break tests
    # that never ran the feature, and those must at least name it.
    if unexplained and change.method == "deletion":
      return None, f"unrelated breakage: {unexplained[:3]}"
    visible = tdir / "visible"
    trees.copy(broken, visible)
    hiding.hide_tests(visible, f2p, self.passing)
    hiding.drop_unused_guards(visible, change.tests)
    # Lines that other kept code also contains are not leaks; the problem statement's stubs
    # are revealed anyway.
    kept_code = [
      (broken / f).read_text(encoding="utf-8")
      for f in project.walk(broken)
      if f.endswith((".py", ".pyi"))
    ]
    shown = "\n".join([change.revealed, *kept_code])
    scrub.scrub(visible)
    hits = scrub.leak_scan(visible, names, change.removed_code, shown)
    if hits:
      return None, f"leak scan: {hits[:3]}"
    head = scrub.fresh_git(visible)
    hits = scrub.leak_scan(visible, names, change.removed_code, shown)
    if hits:
      return None, f"leak scan after git: {hits[:3]}"
    task = self._record(change, tag, visible, head, f2p, p2p, direct, statement(f2p, runs))
    if why := grader.unprotected(grader.plan_for(task)):
      return None, why  # the grader would refuse it (grader.unprotected)
    if self.cfg.verify:
      gold = grader.grade(task, task.gold_patch, limits=self.cfg.limits)
      empty = grader.grade(task, "", limits=self.cfg.limits)
      if gold.reward != 1.0 or empty.reward != 0.0:
        failing = [t for t, o in gold.tests.items() if o != "passed"][:3]
        return None, f"verify: gold={gold.reward} ({gold.error or failing}) empty={empty.reward}"
      task.provenance["verify"] = {
        "gold": gold.reward,
        "empty": empty.reward,
        "gold_wall_s": round(gold.wall_s, 2),
      }
    return task, ""

  def _record(self, change, tag, visible, head, f2p, p2p, direct, statement) -> Task:
    old = {rel: (self.orig / rel).read_text(encoding="utf-8") for rel in change.changed}
    hidden = visible.parent / "hidden"  # removed with the task's directory
    for rel in project.walk(self.orig):
      if project.is_protected(rel):
        (hidden / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self.orig / rel, hidden / rel)
    for rel, text in change.tests.items():
      (hidden / rel).write_text(text, encoding="utf-8")
    dependencies.install_runtime(self.source.runtime, hidden, self.orig)
    features = [{"kind": f.kind, "path": f.path, "qualname": f.qualname} for f in change.feats]
    if change.mutation is not None:
      m = change.mutation
      features[0].update(mutation=m.kind, line=m.line, before=m.before, after=m.after)
    gold = unified_diff(change.changed, old)
    task = Task(
      id=f"{self.source.name}-{self.source.version}-{tag}",
      source=self.source.as_dict(),
      features=features,
      problem_statement=statement,
      deletion_diff=unified_diff(old, change.changed),
      gold_patch=gold,
      workspace=project.pack(visible, project.walk(visible, skip=frozenset())),
      hidden_files=project.pack(hidden, project.walk(hidden, skip=frozenset())),
      FAIL_TO_PASS=f2p,
      PASS_TO_PASS=p2p,
      provenance={
        "seed": self.cfg.seed,
        "coverage_map_sha256": self.map.digest(),
        "generator_version": VERSION,
        "validation_runs": self.cfg.validation_runs,
        "baseline_runs": self.cfg.baseline_runs + 1,
        "git_head": head,
        "n_features": len(change.feats),
        "flaky_dropped": self.flaky,
        "isolation": self.isolation,
      },
      method=change.method,
      F2P_direct=direct,
    )
    texts = {f: (self.orig / f).read_text(encoding="utf-8") for f in self.project.files}
    task.difficulty = difficulty.fields(task, texts)
    return task


@dataclasses.dataclass
class Change:
  """A candidate break of the project, whichever method made it."""

  method: str
  feats: list[testmap.Symbol]
  changed: dict[str, str | None]  # rel path -> new text, None = file removed
  removed_names: list[str]  # leak-scanned as identifiers (deletion only)
  removed_code: list[str]  # leak-scanned as source lines
  revealed: str  # text the problem statement shows anyway (not a leak)
  mutation: bug_injection.Mutation | None = None
  # Rewritten test modules (deletion.guard_test_imports): part of the task's tests in every
  # run and grade, never of the gold patch.
  tests: dict[str, str] = dataclasses.field(default_factory=dict)

  def key(self):
    where = (self.mutation.kind, self.mutation.line) if self.mutation else ()
    return (self.method, [f.key for f in self.feats], *where)


def _hidden_list(f2p: list[str]) -> str:
  names = sorted({t.split("[", 1)[0] for t in f2p})
  return "Hidden tests that will be run:\n" + "".join(f"- {n}\n" for n in names)


_SECTION = re.compile(r"^_{3,} (\S+) _{3,}$")
_SUMMARY = re.compile(r"^(?:FAILED|ERROR) (\S+) - (.+)$")


def _failure_messages(runs: list[suite.SuiteRun], f2p: list[str], k: int = 5) -> list[str]:
  """Up to k `test: message` lines: the first `E ` line of each failing test's report section.

  pytest heads a failure's section with `___ Cls.test_name[param] ___`; the output tail kept by
  the runner holds the last sections, which is enough for a description.
  """
  by_head = {"::".join(t.split("::")[1:]).replace("::", "."): t for t in f2p}
  wanted, out = set(f2p), {}

  def add(test, msg):
    name = test.split("[", 1)[0]
    if name not in out and len(out) < k and msg:
      out[name] = msg[:200]

  for r in runs:
    test = None
    for line in r.log_tail.splitlines():
      if m := _SECTION.match(line):
        test = by_head.get(m.group(1))
      elif test and line.startswith("E ") and line[1:].strip():
        add(test, line[1:].strip())
        test = None
      elif (m := _SUMMARY.match(line)) and m.group(1) in wanted:
        # Many failures push the sections out of the tail; the short summary (cut to the
        # terminal width) is what is left.
        add(m.group(1), m.group(2).strip().removesuffix("..."))
  return [f"{t}: {m}" for t, m in sorted(out.items())]
