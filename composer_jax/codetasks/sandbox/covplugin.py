"""pytest plugin (loaded inside the sandbox as `cj_covplugin`): one coverage context per test.

Each test's setup/call/teardown runs under the coverage context `<nodeid>`, so the saved data
maps every executed line to the tests that executed it (coverage.py dynamic contexts, the same
mechanism as pytest-cov's --cov-context=test, without the extra dependency).

Only the main thread (pytest's) is traced: coverage follows new threads by a hook that each
thread installs with sys.settrace as it starts, under threading's frames alone, and the guard
(guard.py) stops such a trace hook whoever set it (a trusted thread's frames handed to the
candidate). Lines that run only in threads are not mapped, like those run in subprocesses.
"""

import threading

import coverage
import pytest

_COV = None


def pytest_addoption(parser):
  parser.addoption("--cj-cov-data", default=None, help="coverage data file to write")
  parser.addoption("--cj-cov-source", action="append", default=[], help="measured source dir")


def pytest_configure(config):
  global _COV
  data = config.getoption("--cj-cov-data")
  if data:
    _COV = coverage.Coverage(
      data_file=data, source=config.getoption("--cj-cov-source"), config_file=False, branch=False
    )
    _COV.start()
    threading.settrace(None)  # the main thread only (module docstring)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
  if _COV is not None:
    _COV.switch_context(item.nodeid)
  yield
  if _COV is not None:
    _COV.switch_context("")


def pytest_unconfigure(config):
  if _COV is not None:
    _COV.stop()
    _COV.save()
