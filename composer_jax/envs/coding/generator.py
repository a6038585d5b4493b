"""Task generator: map tests, delete a feature, validate (SWE-smith style, stricter), package.

Validation of a deletion (N = validation_runs re-runs of the whole suite on fresh copies):
  FAIL_TO_PASS = passed in every baseline run and did not pass in any post-deletion run;
  PASS_TO_PASS = passed in every baseline run and in every post-deletion run;
  anything else that passed before is flaky and dropped. A task is kept only if both lists are
  non-empty, every FAIL_TO_PASS test is explained (the coverage map says it exercised a deleted
  feature, or its file names a deleted symbol), FAIL_TO_PASS is at most max_f2p_fraction of the
  suite, the visible workspace passes the leak scan, and (verify) the gold patch grades 1.0 and
  the empty patch 0.0. Everything is deterministic given the seed.
"""

import dataclasses
import hashlib
import random
import re
import shutil
from pathlib import Path

from composer_jax.envs.coding import (
  deletion,
  grader,
  hiding,
  project,
  runner,
  sandbox,
  scrub,
  testmap,
)
from composer_jax.envs.coding.sources import Source
from composer_jax.envs.coding.task import Task, unified_diff

VERSION = "1"


@dataclasses.dataclass(frozen=True)
class Config:
  seed: int = 0
  max_tasks: int = 8
  max_attempts: int = 30
  n_features: int = 1  # > 1: harder variants deleting related features of one module
  kinds: tuple[str, ...] = ("function", "class", "method", "module")
  baseline_runs: int = 2  # in addition to the coverage-mapping run
  validation_runs: int = 2
  max_tests_per_feature: int = 80  # "few others": features many tests use are skipped
  max_f2p_fraction: float = 0.5
  verify: bool = True
  limits: sandbox.Limits = sandbox.DEFAULT_LIMITS


class Generator:
  """Generates tasks from one source project (prepare() runs the baseline once)."""

  def __init__(self, source: Source, work: Path, cfg: Config = Config()):
    self.source, self.work, self.cfg = source, Path(work), cfg
    self.orig = source.path
    self.log: list[str] = []

  def _run(self, tree: Path, tag: str) -> runner.SuiteRun:
    """Runs the whole suite on a throwaway copy (tests may write into their tree)."""
    copy = self.work / f"run-{tag}"
    shutil.copytree(tree, copy)
    try:
      return runner.run_suite(copy, limits=self.cfg.limits)
    finally:
      shutil.rmtree(copy, ignore_errors=True)

  def prepare(self) -> None:
    """Baseline + coverage map. Raises ValueError for no tests or failing tests."""
    name = f"{self.source.name} {self.source.version}"
    # The sandbox's import path is the workspace + the runner's private site: a project that
    # shares a top-level name with the runner (pytest, pluggy, ...) would stay importable.
    tops = {project.module_name(f).split(".")[0] for f in project.source_files(self.orig)}
    if not tops:
      raise ValueError(f"source {name} has no importable package or module")
    clash = tops & set(runner.RUNTIME_MODULES)
    if clash:
      raise ValueError(f"source {name}: package {sorted(clash)} is part of the test runner")
    copy = self.work / "run-map"
    shutil.copytree(self.orig, copy)
    self.map, first = testmap.build(copy, limits=self.cfg.limits)
    shutil.rmtree(copy, ignore_errors=True)
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
      raise ValueError(
        f"source {name}: {len(always_failing)} tests do not pass before any "
        f"deletion, e.g. {always_failing[:3]}; only passing suites are usable"
      )
    self.passing = sorted(
      t for t in runs[0].outcomes if all(r.outcomes.get(t) == "passed" for r in runs)
    )
    self.flaky = sorted(set(failing) - set(always_failing))
    self.project = deletion.Project(self.orig)
    self.isolation = first.isolation

  def candidates(self) -> list[testmap.Symbol]:
    """Eligible features exercised by 1..max_tests_per_feature passing tests, seed-shuffled."""
    passing = set(self.passing)
    out = []
    for key in sorted(self.map.symbols):
      sym = self.map.symbols[key]
      n = len(passing.intersection(self.map.tests_by_symbol[key]))
      if (
        sym.kind in self.cfg.kinds
        and 1 <= n <= self.cfg.max_tests_per_feature
        and self.project.eligible(sym)
      ):
        out.append(sym)
    random.Random(self.cfg.seed).shuffle(out)
    return out

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

  def generate(self) -> list[Task]:
    self.prepare()
    pool = self.candidates()
    tasks, attempts = [], 0
    for primary in pool:
      if len(tasks) >= self.cfg.max_tasks or attempts >= self.cfg.max_attempts:
        break
      feats = self.related(primary, pool, self.cfg.n_features - 1)
      if feats is None:
        continue
      attempts += 1
      tasks += self._attempt(feats)
    return tasks

  def _attempt(self, feats) -> list[Task]:
    task, why = self.build(feats)
    self.log.append(f"{'+'.join(f.key for f in feats)}: {why or 'kept'}")
    return [task] if task is not None else []

  def harder(self, t: Task) -> list[Task]:
    """A variant of task t deleting one more related feature (curriculum callback)."""
    first = t.features[0]
    primary = self.map.symbols[f"{first['path']}::{first['qualname']}"]
    feats = self.related(primary, self.candidates(), len(t.features))
    return [] if feats is None else self._attempt(feats)

  def build(self, feats: list[testmap.Symbol]) -> tuple[Task | None, str]:
    """One candidate deletion -> (task, '') or (None, why it was rejected)."""
    tag = hashlib.sha256(repr((self.cfg.seed, [f.key for f in feats])).encode()).hexdigest()[:10]
    tdir = self.work / f"task-{tag}"
    broken = tdir / "broken"
    shutil.copytree(self.orig, broken)
    try:
      return self._build(feats, tag, tdir, broken)
    finally:
      shutil.rmtree(tdir, ignore_errors=True)

  def _build(self, feats, tag, tdir, broken):
    dele = self.project.delete(feats)
    for rel, text in dele.changed.items():
      if text is None:
        (broken / rel).unlink()
      else:
        (broken / rel).write_text(text, encoding="utf-8")
    runs = [self._run(broken, f"{tag}-v{i}") for i in range(self.cfg.validation_runs)]
    if not all(r.ok for r in runs):
      return None, f"post-deletion run unsound: {[r.reason for r in runs if not r.ok][0]}"
    f2p = [t for t in self.passing if all(r.outcomes.get(t) != "passed" for r in runs)]
    p2p = [t for t in self.passing if all(r.outcomes.get(t) == "passed" for r in runs)]
    if not f2p or not p2p:
      return None, f"empty FAIL_TO_PASS ({len(f2p)}) or PASS_TO_PASS ({len(p2p)})"
    if len(f2p) > self.cfg.max_f2p_fraction * len(self.passing):
      return None, f"deletion breaks {len(f2p)}/{len(self.passing)} tests"
    mapped = {t for f in feats for t in self.map.tests_by_symbol[f.key]}
    name_re = re.compile(r"\b(" + "|".join(map(re.escape, dele.removed_names)) + r")\b")
    unexplained = [
      t
      for t in f2p
      if t not in mapped
      and not name_re.search(
        (self.orig / t.split("::")[0]).read_text(encoding="utf-8", errors="replace")
      )
    ]
    if unexplained:
      return None, f"unrelated breakage: {unexplained[:3]}"
    visible = tdir / "visible"
    shutil.copytree(broken, visible)
    hiding.hide_tests(visible, f2p, self.passing)
    # Lines that other kept code also contains are not leaks; the problem statement's stubs
    # are revealed anyway.
    kept_code = [
      (broken / f).read_text(encoding="utf-8")
      for f in project.walk(broken)
      if f.endswith((".py", ".pyi"))
    ]
    shown = "\n".join(dele.stubs + kept_code)
    scrub.scrub(visible)
    hits = scrub.leak_scan(visible, dele.removed_names, dele.removed_code, shown)
    if hits:
      return None, f"leak scan: {hits[:3]}"
    head = scrub.fresh_git(visible)
    hits = scrub.leak_scan(visible, dele.removed_names, dele.removed_code, shown)
    if hits:
      return None, f"leak scan after git: {hits[:3]}"
    task = self._record(feats, tag, dele, visible, head, f2p, p2p)
    if self.cfg.verify:
      gold = grader.grade(task, task.gold_patch, limits=self.cfg.limits)
      empty = grader.grade(task, "", limits=self.cfg.limits)
      if gold.reward != 1.0 or empty.reward != 0.0:
        return None, f"verify: gold={gold.reward} ({gold.error}) empty={empty.reward}"
      task.provenance["verify"] = {
        "gold": gold.reward,
        "empty": empty.reward,
        "gold_wall_s": round(gold.wall_s, 2),
      }
    return task, ""

  def _record(self, feats, tag, dele, visible, head, f2p, p2p) -> Task:
    old = {rel: (self.orig / rel).read_text(encoding="utf-8") for rel in dele.changed}
    protected = [r for r in project.walk(self.orig) if project.is_protected(r)]
    hidden_names = sorted({t.split("[", 1)[0] for t in f2p})
    statement = (
      f"The project `{self.source.name}` ({self.source.version}) is missing "
      f"{'a feature' if len(feats) == 1 else f'{len(feats)} related features'}. Implement "
      "the following so that the project's hidden tests pass; keep the rest of the project "
      "working. Do not modify tests or test configuration.\n\n```python\n"
      + "\n\n".join(dele.stubs)
      + "\n```\n\nHidden tests that will be run:\n"
      + "\n".join(f"- {n}" for n in hidden_names)
      + "\n"
    )
    return Task(
      id=f"{self.source.name}-{self.source.version}-{tag}",
      source=self.source.as_dict(),
      features=[{"kind": f.kind, "path": f.path, "qualname": f.qualname} for f in feats],
      problem_statement=statement,
      deletion_diff=unified_diff(old, dele.changed),
      gold_patch=unified_diff(dele.changed, old),
      workspace=project.pack(visible, project.walk(visible, skip=frozenset())),
      hidden_files=project.pack(self.orig, protected),
      FAIL_TO_PASS=f2p,
      PASS_TO_PASS=p2p,
      provenance={
        "seed": self.cfg.seed,
        "coverage_map_sha256": self.map.digest(),
        "generator_version": VERSION,
        "validation_runs": self.cfg.validation_runs,
        "baseline_runs": self.cfg.baseline_runs + 1,
        "git_head": head,
        "n_features": len(feats),
        "flaky_dropped": self.flaky,
        "isolation": self.isolation["mode"],
      },
    )
