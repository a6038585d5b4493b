"""The factory offline: the mini project as a pinned sdist, two workers, both methods, a bad
manifest entry, resume, the reused coverage map, the summary; the worker pool; difficulty."""

import hashlib
import io
import json
import math
import os
import re
import tarfile
import textwrap
from concurrent.futures.process import BrokenProcessPool

import pytest

from composer_jax.codetasks import project, task, workers
from composer_jax.codetasks.sandbox import grader, suite
from composer_jax.codetasks.synthesis import (
  difficulty,
  factory,
  generator,
  make_tasks,
  sources,
  testmap,
)
from tests.codetasks.mini_project import FAST, MINI, requires_sandbox


def _sdist(dest, name="minipkg", version="1.0"):
  buf = io.BytesIO()
  with tarfile.open(fileobj=buf, mode="w:gz") as tar:
    for rel, text in MINI.items():
      if "__pycache__" in rel or ".mypy_cache" in rel:
        continue
      data = textwrap.dedent(text).encode()
      info = tarfile.TarInfo(f"{name}-{version}/{rel}")
      info.size = len(data)
      tar.addfile(info, io.BytesIO(data))
  dest.mkdir(parents=True, exist_ok=True)
  path = dest / f"{name}-{version}.tar.gz"
  path.write_bytes(buf.getvalue())
  return hashlib.sha256(buf.getvalue()).hexdigest()


CFG = generator.Config(
  max_tasks=2,
  max_attempts=6,
  methods=("deletion", "bug"),
  baseline_runs=0,
  validation_runs=1,
  verify=False,
  limits=FAST,
  max_f2p_fraction=0.7,
)


@pytest.fixture(scope="module")
def factory_run(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("factory")
  cache = tmp / "sdists"
  sha = _sdist(cache)
  mp = pytest.MonkeyPatch()
  mp.setattr(sources, "CACHE", cache)
  manifest = [
    {"name": "minipkg", "version": "1.0", "sha256": sha},
    {"name": "broken", "version": "1", "sha256": "not-a-hash"},
  ]
  log = io.StringIO()
  summary = factory.run(manifest, tmp / "out", CFG, workers.Pool(1), log=log)
  yield tmp, manifest, summary, log.getvalue(), mp
  mp.undo()


@requires_sandbox
def test_manifest_run_both_methods_and_bad_entry(factory_run):
  tmp, _, summary, log, _ = factory_run
  assert summary["by_method"] == {"deletion": 1, "bug": 1} and summary["tasks"] == 2
  assert summary["verified"] == 0  # this run skips gold/empty grading (verify=False)
  assert summary["failed"] == {
    "broken-1": "manifest entry broken: sha256 'not-a-hash' is not 64 lowercase hex digits"
  }
  assert re.search(r"make_tasks: 1/2 projects, \S+ projects/s, elapsed \S+, ETA \S+; ", log), log
  assert "FAILED: manifest entry broken" in log
  merged = task.read_jsonl(tmp / "out" / "tasks.jsonl")
  assert [t.id for t in merged] == [
    t.id for t in task.read_jsonl(tmp / "out" / "projects" / "minipkg-1.0.jsonl")
  ]
  for t in merged:
    assert t.F2P_direct and set(t.F2P_direct) <= set(t.FAIL_TO_PASS)
    assert t.difficulty["method"] == t.method and t.difficulty["features"] == 1
  table = factory.table(summary)
  assert "minipkg-1.0" in table and "failed" in table and "2 tasks" in table


@requires_sandbox
def test_resume_skips_finished_and_reuses_the_coverage_map(factory_run, monkeypatch):
  tmp, manifest, summary, _, _ = factory_run
  status = tmp / "out" / "projects" / "minipkg-1.0.json"
  before = status.read_text()
  log = io.StringIO()
  again = factory.run(manifest, tmp / "out", CFG, workers.Pool(1), log=log)
  assert "resuming: 2 finished projects skipped" in log.getvalue()
  assert again == summary and status.read_text() == before
  # A new generator with the same cache never maps the tests again.
  (cached,) = (tmp / "out" / "cache").iterdir()
  monkeypatch.setattr(testmap, "build", lambda *a, **k: pytest.fail("coverage map rebuilt"))
  src = sources.resolve_entry(manifest[0], tmp / "w")
  gen = generator.Generator(src, tmp / "w", CFG, cache=tmp / "out" / "cache")
  gen.prepare()
  made = task.read_jsonl(tmp / "out" / "projects" / "minipkg-1.0.jsonl")
  assert {t.provenance["coverage_map_sha256"] for t in made} == {gen.map.digest()}
  assert cached.name.startswith("minipkg-")


def test_worker_pool_and_bad_arguments():
  # A stdlib function: the spawned workers import nothing of ours.
  got = dict(workers.Pool(2).imap_unordered(math.factorial, range(6)))
  assert got == {0: 1, 1: 1, 2: 2, 3: 6, 4: 24, 5: 120}
  assert list(workers.Pool(1).imap_unordered(math.factorial, [3])) == [(3, 6)]
  # A worker that dies (os._exit) or a job that raises yields its exception; the rest go on.
  (item, err), *_ = workers.Pool(2).imap_unordered(os._exit, [3])
  assert item == 3 and isinstance(err, BrokenProcessPool)
  ((_, err),) = workers.Pool(1).imap_unordered(math.sqrt, [-1])
  assert isinstance(err, ValueError)
  with pytest.raises(ValueError, match="workers=0"):
    workers.Pool(0)
  with pytest.raises(ValueError, match="unknown worker backend 'slurm'"):
    workers.Pool(1, "slurm")


def test_ray_backend_matches_local():
  ray = pytest.importorskip("ray", reason="optional extra: pip install 'composer_jax[ray]'")
  try:
    got = dict(workers.Pool(2, "ray").imap_unordered(math.factorial, range(6)))
  finally:
    ray.shutdown()
  assert got == dict(workers.Pool(1).imap_unordered(math.factorial, range(6)))


def test_cli_bad_methods_and_only(tmp_path, capsys):
  argv = ["--manifest", str(sources.MANIFEST), "--out", str(tmp_path)]
  assert make_tasks.run([*argv, "--methods", "deletion,fuzz"]) == 1
  assert "synthesis methods ['deletion', 'fuzz']" in capsys.readouterr().err
  assert make_tasks.run([*argv, "--only", "nosuchproject"]) == 1
  assert "--only ['nosuchproject']: not in" in capsys.readouterr().err
  (tmp_path / "file").write_text("")
  for args, error in [
    (
      ["--manifest", str(sources.MANIFEST), "--out", str(tmp_path / "file")],
      "it is a file, not a directory (--manifest / --micro write a directory)",
    ),
    (["--source", "x==1", "--out", str(tmp_path)], "it is a directory, not a file (--source"),
    (["--source", "x==1", "--out", str(tmp_path / "no" / "t.jsonl")], "does not exist"),
    (["--source", "x==1", "--out", str(tmp_path / "file" / "t.jsonl")], "file is a file, so"),
  ]:
    assert make_tasks.run(args) == 2  # a bad flag: at parse time, before any work
    assert error in capsys.readouterr().err


@pytest.mark.parametrize(
  "name, version",
  [("../../escaped", "1.0"), ("pkg", "1.0/../../x"), ("/abs", "1"), (".hidden", "1")],
)
def test_manifest_name_that_is_a_path_is_refused_before_any_work(tmp_path, capsys, name, version):
  manifest = tmp_path / "m.json"
  manifest.write_text(
    json.dumps({"sources": [{"name": name, "version": version, "sha256": "0" * 64}]})
  )
  out = tmp_path / "a" / "b" / "out"
  assert make_tasks.run(["--manifest", str(manifest), "--out", str(out)]) == 1
  err = capsys.readouterr().err.strip()
  assert err.startswith("error: manifest entry") and "is not a plain file name" in err, err
  assert sorted(p.name for p in tmp_path.rglob("*")) == ["a", "b", "m.json", "out", "projects"]


def test_difficulty_fields_and_dedup_by_hand():
  gold = (
    "diff --git a/pkg/a.py b/pkg/a.py\n--- a/pkg/a.py\n+++ b/pkg/a.py\n@@ -1,1 +1,3 @@\n"
    " x = 1\n+def f():\n+  return 2\n"
  )
  t = task.Task(
    id="p-1-x",
    source={"name": "p", "version": "1"},
    features=[{"kind": "function", "path": "pkg/a.py", "qualname": "f"}],
    problem_statement="",
    deletion_diff="",
    gold_patch=gold,
    workspace="",
    hidden_files="",
    FAIL_TO_PASS=["t::a", "t::b", "t::c"],
    PASS_TO_PASS=["t::d"],
    provenance={},
    F2P_direct=["t::a"],
  )
  texts = {
    "pkg/a.py": "x = 1\n",
    "pkg/b.py": "from .a import x\n",  # imports the changed module (relative)
    "pkg/__init__.py": "from pkg import a\n",  # and again (absolute)
    "pkg/c.py": "import os\n",
  }
  assert difficulty.fields(t, texts) == {
    "method": "deletion",
    "features": 1,
    "lines": 2,
    "direct_f2p": 1,
    "collateral_f2p": 2,
    "files": 1,
    "cross_file": 2,
  }
  # score = log2(1 + 2) + 0 + log2(1 + 1) + 0.5 * (0 + 2)
  assert difficulty.score(difficulty.fields(t, texts)) == pytest.approx(1.5849625 + 1 + 1)
  newer = task.Task(**{**t.__dict__, "id": "p-2-y", "source": {"name": "p", "version": "2"}})
  kept, dropped = difficulty.dedup([t, newer])
  assert [k.id for k in kept] == ["p-1-x"] and [d.id for d in dropped] == ["p-2-y"]
  assert task.direct_partial(t, {"t::a": "passed", "t::b": "failed", "t::d": "passed"}) == 1.0


def test_pool_map_keeps_order_and_raises_the_failure():
  with workers.Pool(2) as pool:  # the workers stay up between calls
    assert pool.map(abs, [-3, 1, -2]) == [3, 1, 2]
    assert pool.map(abs, [-5]) == [5]
  with pytest.raises(RuntimeError, match="job 1 of 2 failed: TypeError"):
    workers.Pool(1).map(abs, [1, "x"])


@requires_sandbox
def test_grader_partial_counts_direct_tests_only(tmp_path, monkeypatch):
  """Hand case: direct t::a passes, collateral t::b fails, P2P t::d passes -> partial
  1 * 1 = 1.0 (all of FAIL_TO_PASS would give 1/2); reward 0 since t::b fails."""
  (tmp_path / "a.py").write_text("x = 1\n")
  t = task.Task(
    id="p-1-x",
    source={"name": "p", "version": "1"},
    features=[],
    problem_statement="",
    deletion_diff="",
    gold_patch="",
    workspace=project.pack(tmp_path, ["a.py"]),
    hidden_files=project.pack(tmp_path, []),
    FAIL_TO_PASS=["t::a", "t::b"],
    PASS_TO_PASS=["t::d"],
    provenance={},
    F2P_direct=["t::a"],
  )
  outcomes = {"t::a": "passed", "t::b": "failed", "t::d": "passed"}
  run = suite.SuiteRun(outcomes, [], [], 0, True, "", 0.0, {}, "")
  monkeypatch.setattr(suite, "run_suite", lambda *a, **k: run)
  # The ids name no test file, which the grader would refuse to grade (nothing protects them).
  monkeypatch.setattr(grader, "unprotected", lambda plan: "")
  g = grader.grade(t, "")
  assert (g.reward, g.partial, g.error) == (0.0, 1.0, "")
  outcomes["t::a"] = "failed"  # the direct test fails: nothing for the collateral one
  assert grader.grade(t, "").partial == 0.0
