"""The test map's coverage run (testmap.build, covplugin.py) under the grader's guard."""

from composer_jax.codetasks.synthesis import testmap
from tests.codetasks.mini_project import FAST, requires_sandbox, write_project

# A suite with a test that runs the project's code in a thread (cachetools' and h11's suites
# do): coverage follows new threads by a trace hook each one installs as it starts, which the
# guard stops (exit status 86), so the whole map run failed and the factory lost the project.
THREADED = {
  "pkg/__init__.py": """\
        def double(x):
          return 2 * x


        def triple(x):
          return 3 * x
        """,
  "tests/test_pkg.py": """\
        import threading

        from pkg import double, triple


        def test_double():
          assert double(2) == 4


        def test_triple_in_a_thread():
          out = []
          t = threading.Thread(target=lambda: out.append(triple(2)))
          t.start()
          t.join()
          assert out == [6]
        """,
}


@requires_sandbox
def test_map_run_of_a_suite_that_starts_threads(tmp_path):
  root = write_project(tmp_path / "proj", THREADED)
  tmap, run = testmap.build(root, limits=FAST)
  assert run.ok, (run.reason, run.guard)
  assert run.guard == []
  assert run.outcomes == {
    "tests/test_pkg.py::test_double": "passed",
    "tests/test_pkg.py::test_triple_in_a_thread": "passed",
  }
  # The main thread is mapped; a line run only in a thread is not (like one in a subprocess).
  assert tmap.tests_by_symbol["pkg/__init__.py::double"] == ["tests/test_pkg.py::test_double"]
  assert tmap.tests_by_symbol["pkg/__init__.py::triple"] == []
