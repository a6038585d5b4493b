"""Sandbox + runner: JUnit parsing, isolation probes (run inside the sandbox), report tampering."""

import socket
import sys
import sysconfig

import pytest

from composer_jax.envs.coding import runner
from tests.envs.coding.mini_project import (
  FAST,
  requires_namespaces,
  requires_sandbox,
  write_project,
)

JUNIT = b"""<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite tests="6">
<testcase classname="tests.test_a" name="test_ok" file="tests/test_a.py" line="1" time="0"/>
<testcase classname="tests.test_a.TestK" name="test_m[1-x]" file="tests/test_a.py" line="5"
 time="0"><failure message="boom"/></testcase>
<testcase classname="tests.test_a.TestK.Inner" name="test_n" file="tests/test_a.py" line="9"
 time="0"><skipped message="no"/></testcase>
<testcase classname="pkg.mod" name="pkg.mod.func" file="pkg/mod.py" line="2" time="0"/>
<testcase classname="tests.test_a" name="test_dup" file="tests/test_a.py" line="12" time="0"/>
<testcase classname="tests.test_a" name="test_dup" file="tests/test_a.py" line="12" time="0">
<error message="teardown"/></testcase>
<testcase classname="tests.test_b.TestMixed" name="test_inherited" file="tests/__init__.py"
 line="3" time="0"/>
<testcase classname="" name="tests.test_broken" time="0"><error message="collection failure"/>
</testcase></testsuite></testsuites>"""


def test_parse_junit_rebuilds_nodeids(tmp_path):
  write_project(
    tmp_path,
    {"tests/__init__.py": "", "tests/test_a.py": "", "tests/test_b.py": "", "pkg/mod.py": ""},
  )
  outcomes, coll = runner.parse_junit(JUNIT, tmp_path)
  assert outcomes == {
    "tests/test_a.py::test_ok": "passed",
    "tests/test_a.py::TestK::test_m[1-x]": "failed",
    "tests/test_a.py::TestK::Inner::test_n": "skipped",
    "pkg/mod.py::pkg.mod.func": "passed",  # doctest item
    "tests/test_a.py::test_dup": "error",  # passed call + errored teardown: fail closed
    "tests/test_b.py::TestMixed::test_inherited": "passed",  # defined in a mixin elsewhere
  }
  assert coll == ["tests.test_broken"]


@requires_namespaces
def test_isolation_probes(tmp_path):
  """Each probe test runs inside the sandbox; all must pass."""
  secret = tmp_path / "secret_tasks.jsonl"
  secret.write_text("gold patch")
  outside = tmp_path / "outside.txt"
  listener = socket.socket()
  listener.bind(("127.0.0.1", 0))
  listener.listen(1)
  listener.setblocking(False)
  port = listener.getsockname()[1]
  site_dirs = sorted(
    {
      sysconfig.get_paths()["purelib"],  # the venv's and the base interpreter's
      sysconfig.get_paths(vars={"base": sys.base_prefix})["purelib"],
    }
  )
  probe = f"""
import importlib.util, os, socket, sys

def test_testnet_unreachable():
  s = socket.socket(); s.settimeout(3)
  assert s.connect_ex(("192.0.2.1", 80)) != 0

def test_host_loopback_listener_unreachable():
  s = socket.socket(); s.settimeout(3)
  assert s.connect_ex(("127.0.0.1", {port})) != 0

def test_no_installed_packages():
  assert importlib.util.find_spec("toolz") is None and importlib.util.find_spec("jax") is None
  assert not any("site-packages" in p for p in sys.path)
  for d in {site_dirs!r}:
    assert not os.path.isdir(d) or os.listdir(d) == []

def test_host_files_invisible():
  assert not os.path.exists({str(secret)!r}) and not os.path.exists("/work")

def test_write_outside_does_not_reach_host():
  try:
    open({str(outside)!r}, "w").write("pwned")
  except OSError:
    pass

def test_environment_is_empty_and_pinned():
  assert os.environ["PYTHONHASHSEED"] == "0" and os.environ["TZ"] == "UTC"
  assert os.environ["HOME"] != "/root" and os.access(os.environ["HOME"], os.W_OK)
  assert not {{"XLA_FLAGS", "JAX_PLATFORMS", "VIRTUAL_ENV"}} & set(os.environ)
"""
  ws = write_project(tmp_path / "ws", {"test_probe.py": probe})
  run = runner.run_suite(ws, limits=FAST)
  with pytest.raises(BlockingIOError):
    listener.accept()  # nothing ever connected from the sandbox
  listener.close()
  assert run.ok, run.log_tail
  assert run.outcomes and set(run.outcomes.values()) == {"passed"}, run.log_tail
  assert len(run.outcomes) == 6 and not outside.exists()


@requires_sandbox
def test_atexit_report_forgery_is_ignored(tmp_path):
  forge = """
import atexit, sys

def _forge():
  path = [a for a in sys.argv if a.startswith("--junitxml=")][0].split("=", 1)[1]
  open(path, "w").write('<testsuite><testcase classname="test_forge" name="test_fails" '
                        'file="test_forge.py"/></testsuite>')

atexit.register(_forge)

def test_fails():
  assert False
"""
  ws = write_project(tmp_path / "ws", {"test_forge.py": forge})
  run = runner.run_suite(ws, limits=FAST)
  assert run.outcomes.get("test_forge.py::test_fails") != "passed"
