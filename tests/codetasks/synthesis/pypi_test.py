"""The real pipeline on a pinned PyPI project (network: the registry is reachable in CI).

inflection's 455 tests run in about a second, so one run covers the sdist fetch + hash check,
both synthesis methods and gold/empty verification in about a minute. Three
bad entries ride along, each failing in one line while the good project goes on. A project with
dependencies (itsdangerous) gets its pinned-wheel runtime built and laid over a tree. The full
run is `make_tasks --manifest third_party/coding_sources.json` (see README).
"""

import io
import stat

import pytest

from composer_jax.codetasks import project, task, workers
from composer_jax.codetasks.sandbox import dependencies
from composer_jax.codetasks.synthesis import factory, generator, sources
from tests.codetasks.mini_project import requires_sandbox

ZERO = "0" * 64


@pytest.mark.network
@pytest.mark.slow
@requires_sandbox
def test_pinned_pypi_project_and_bad_entries(tmp_path, monkeypatch):
  monkeypatch.setattr(sources, "CACHE", tmp_path / "sdists")  # a fresh cache: really fetch
  pins = {e["name"]: e for e in sources.load_manifest()}
  good = pins["inflection"]
  manifest = [
    good,
    {"name": "inflection", "version": "0.5.0", "sha256": ZERO},
    {"name": "cj-no-such-project", "version": "1.0", "sha256": ZERO},
    {**pins["webencodings"], "deps": [{"name": "cj-no-such-dep", "version": "1", "sha256": ZERO}]},
  ]
  cfg = generator.Config(max_tasks=2, max_attempts=4, methods=generator.METHODS, baseline_runs=0)
  log = io.StringIO()
  summary = factory.run(manifest, tmp_path / "out", cfg, workers.Pool(1), log=log)
  failed = summary["failed"]
  assert sorted(failed) == ["cj-no-such-project-1.0", "inflection-0.5.0", "webencodings-0.6.1"]
  assert f"does not match the pinned {ZERO}" in failed["inflection-0.5.0"]
  assert (
    "pip download cj-no-such-project==1.0 failed: ERROR: No matching distribution"
    in (failed["cj-no-such-project-1.0"])
  )
  assert failed["webencodings-0.6.1"].startswith(
    "dependencies cj-no-such-dep==1 cannot be installed: ERROR:"
  )
  assert all("\n" not in e for e in failed.values())
  tasks = task.read_jsonl(tmp_path / "out" / "tasks.jsonl")
  assert {t.method for t in tasks} == {"deletion", "bug"}, summary["projects"][0]
  assert summary["verified"] == len(tasks) == 2
  for t in tasks:
    assert t.provenance["verify"]["gold"] == 1.0 and t.provenance["verify"]["empty"] == 0.0
    assert t.source["name"] == "inflection" and t.F2P_direct
  # A dependency runtime: pinned wheels, installed read-only, laid into a tree under a protected
  # directory with a conftest line that puts it on sys.path (the generator packs both into the
  # hidden files only).
  runtime = sources.build_runtime(pins["itsdangerous"]["deps"], cache=tmp_path / "deps")
  assert not stat.S_IMODE((runtime / "site").stat().st_mode) & 0o222
  files = dependencies.runtime_files(runtime)
  assert {"freezegun/__init__.py", "dateutil/parser/__init__.py", "six.py"} <= set(files)
  assert not [f for f in files if f.endswith((".pth", ".pyc")) or "/tests/" in f]
  tree = tmp_path / "tree"
  (tree / "pkg").mkdir(parents=True)
  (tree / "pkg" / "__init__.py").write_text("")
  (tree / "conftest.py").write_text("X = 1\n")
  dependencies.install_runtime(runtime, tree)
  copied = tree / dependencies.RUNTIME_DIR / "six.py"
  assert copied.read_bytes() == files["six.py"].read_bytes()
  assert project.is_protected(f"{dependencies.RUNTIME_DIR}/six.py")  # the grader restores it
  conftest = (tree / "conftest.py").read_text()
  assert conftest.endswith("X = 1\n") and repr(dependencies.RUNTIME_DIR) in conftest.splitlines()[0]
  assert sources.build_runtime(pins["itsdangerous"]["deps"], cache=tmp_path / "deps") == runtime
