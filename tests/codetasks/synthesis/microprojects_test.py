"""Micro-projects: seeded and varied, their suites pass, and tasks made from them by the factory
grade gold 1.0 / empty 0.0 through the real grader (sandboxed runs: 1 baseline + 2 validations
+ 6 grading runs, about 5 s)."""

import collections
import subprocess
import sys

import pytest

from composer_jax.codetasks import project, task, workers
from composer_jax.codetasks.sandbox import grader
from composer_jax.codetasks.synthesis import (
  factory,
  generator,
  make_tasks,
  microprojects,
  sources,
  split,
)
from tests.codetasks.mini_project import FAST, requires_sandbox


def test_seeded_and_varied():
  assert microprojects.project_files(7) == microprojects.project_files(7)
  plans = [microprojects.plan(s) for s in range(40)]
  fns = [f for p in plans for fs in p.modules.values() for f in fs]
  assert len({p.dist for p in plans}) == 40 and len({p.package for p in plans}) >= 30
  assert {f.family.key for f in fns} == {f.key for f in microprojects.FAMILIES}
  assert len({f.name for f in fns}) > len(fns) // 2  # names are drawn, not fixed per family
  assert {len(f.params) for f in fns} == {1, 2, 3}
  assert {(p.import_style, p.parametrize) for p in plans} == {
    (s, b) for s in ("names", "module") for b in (False, True)
  }
  # One family, different projects: different constants, parameter names and names.
  by_family = collections.defaultdict(set)
  for f in fns:
    by_family[f.family.key].add(f.source.split("\n", 1)[1])
  assert all(len(v) > 1 for v in by_family.values())
  files = microprojects.project_files(8)
  assert f'name = "{plans[8].dist}"' in files["pyproject.toml"]
  assert "[tool.pytest.ini_options]" in files["pyproject.toml"]


def test_heldout_only_templates_and_the_family_size():
  """The held-out-only templates occur in every held-out project and in no other, at the
  smallest held-out fraction and at any larger one (`is_heldout` is monotone); 48 projects hold
  several hundred functions, over 60 of them in held-out projects."""
  plans = [microprojects.plan(s) for s in range(48)]
  fns = lambda p: [f for fs in p.modules.values() for f in fs]
  held = [p for p in plans if split.is_heldout(p.dist, microprojects.HELDOUT_FRACTION)]
  assert len(microprojects.FAMILIES) >= 36 and len(microprojects.HELDOUT_ONLY) >= 2
  for p in plans:
    keys = {f.family.key for f in fns(p)}
    assert (p in held) == (microprojects.HELDOUT_ONLY <= keys), p.dist
    assert (p in held) == bool(microprojects.HELDOUT_ONLY & keys), p.dist
    assert p not in held or split.is_heldout(p.dist, 0.5)
  assert sum(len(fns(p)) for p in plans) >= 300 and sum(len(fns(p)) for p in held) >= 60


def test_suite_passes(tmp_path):
  """Seed 0: module imports and parametrized tables (seed 8's plain asserts and name imports
  pass their baseline in the factory test below)."""
  root = microprojects.write(0, tmp_path / "p")
  res = subprocess.run(
    [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(root)],
    cwd=root,
    capture_output=True,
    text=True,
  )
  assert res.returncode == 0 and " passed" in res.stdout, res.stdout[-2000:]


def test_bad_entries_and_seed_specs(tmp_path):
  for bad, why in (
    ({**microprojects.entry(1), "seed": -1}, "seed must be an integer >= 0"),
    ({**microprojects.entry(1), "version": "0"}, "generator version '0'"),
  ):
    with pytest.raises(ValueError, match=why):
      sources.resolve_entry(bad, tmp_path)
  assert make_tasks.micro_seeds("3") == range(3)
  assert make_tasks.micro_seeds("5:9") == range(5, 9)
  for bad in ("", "x", "4:2", "-1:3"):
    with pytest.raises(ValueError, match="give START:STOP or N"):
      make_tasks.micro_seeds(bad)


@requires_sandbox
def test_micro_tasks_through_the_factory_and_grader(tmp_path, capsys):
  """Seed 8's tests import the functions by name (`from pkg.mod import a, b`): the toolz
  layout, where a deletion's import guard used to name the deleted function in the visible
  tests and the leak scan rejected every deletion."""
  cfg = generator.Config(
    max_tasks=2,
    max_attempts=2,
    methods=generator.METHODS,
    kinds=("function",),
    baseline_runs=0,
    validation_runs=1,
    verify=False,
    limits=FAST,
  )
  summary = factory.run(
    [microprojects.entry(8)], tmp_path, cfg, workers.Pool(1), log=sys.stderr, progress=True
  )
  err = capsys.readouterr().err
  assert "baseline: 15 tests pass" in err and "1 tried, 1 kept" in err and "2 tried, 2 kept" in err
  assert summary["by_method"] == {"deletion": 1, "bug": 1}, summary["projects"]
  tasks = task.read_jsonl(tmp_path / "tasks.jsonl")
  plan = microprojects.plan(8)
  for t in tasks:
    assert t.source["name"] == plan.dist and t.F2P_direct
    assert grader.grade(t, t.gold_patch, limits=FAST).reward == 1.0
    assert grader.grade(t, "", limits=FAST).reward == 0.0
  dele = next(t for t in tasks if t.method == "deletion")
  name, path = dele.features[0]["qualname"], dele.features[0]["path"]
  test_file = f"tests/test_{path.rsplit('/', 1)[1]}"
  visible = project.unpack(dele.workspace, tmp_path / "visible")
  assert test_file in visible and name not in (tmp_path / "visible" / test_file).read_text()
  project.unpack(dele.hidden_files, tmp_path / "hidden")
  assert f"except ImportError:\n    {name} = None" in (tmp_path / "hidden" / test_file).read_text()
