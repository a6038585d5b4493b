"""Sandbox + runner: isolation probes (run inside the sandbox), report forgery."""

import socket
import sys
import sysconfig

import pytest

from composer_jax.envs.coding import runner
from tests.envs.coding.mini_project import FAST, requires_sandbox, write_project


@requires_sandbox
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
  import os
  for fd in range(3, 64):
    try:
      os.write(fd, b'0' * 64 + b' {"seq": 1, "kind": "done", "rc": 0}\\n')
    except OSError:
      pass

atexit.register(_forge)

def test_fails():
  assert False
"""
  ws = write_project(tmp_path / "ws", {"test_forge.py": forge})
  run = runner.run_suite(ws, limits=FAST)
  assert run.outcomes.get("test_forge.py::test_fails") != "passed"
