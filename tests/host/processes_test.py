"""Children started through `host.processes` die with their parent, however it dies."""

import os
import signal
import subprocess
import sys
import time

import pytest

from composer_jax.host import processes

_PARENT = """
import sys, time
from composer_jax.host import processes
p = processes.popen(["sleep", "60"])
print(p.pid, flush=True)
{end}
"""


def _alive(pid: int) -> bool:
  """Running (a zombie left for a non-reaping init is dead)."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[0] != "Z"
  except FileNotFoundError:
    return False


def _wait_dead(pid: int, s: float = 5.0) -> bool:
  deadline = time.monotonic() + s
  while _alive(pid) and time.monotonic() < deadline:
    time.sleep(0.05)
  return not _alive(pid)


def _parent(end: str):
  proc = subprocess.Popen(
    [sys.executable, "-c", _PARENT.format(end=end)], stdout=subprocess.PIPE, text=True
  )
  return proc, int(proc.stdout.readline())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("how", ["kill9", "sigterm"])
def test_child_dies_when_the_parent_is_killed(how):
  parent, child = _parent("time.sleep(60)")
  assert _alive(child)
  assert os.getpgid(child) == os.getpgid(parent.pid)  # in the parent's process group
  parent.send_signal(signal.SIGKILL if how == "kill9" else signal.SIGTERM)
  parent.wait(10)
  assert _wait_dead(child), f"child {child} outlived its parent ({how})"


def test_children_left_at_a_normal_exit_are_stopped():
  parent, child = _parent("sys.exit(0)")
  parent.wait(10)
  assert _wait_dead(child)


def test_a_plain_popen_child_would_outlive_its_parent():
  # The yardstick: without the helper, kill -9 of the parent leaves the child running.
  code = "import subprocess; p = subprocess.Popen(['sleep', '60']); print(p.pid, flush=True)"
  parent = subprocess.Popen(
    [sys.executable, "-c", code + "; import time; time.sleep(60)"],
    stdout=subprocess.PIPE,
    text=True,
  )
  child = int(parent.stdout.readline())
  parent.kill()
  parent.wait(10)
  try:
    assert not _wait_dead(child, 0.5)
  finally:
    os.kill(child, signal.SIGKILL)


def test_popen_refuses_its_own_arguments():
  with pytest.raises(ValueError, match="start_new_session"):
    processes.popen(["true"], start_new_session=True)


_POOL_PARENT = """
import os, time
from composer_jax.codetasks.workers import Pool
with Pool(2) as pool:
  pids = set(pool.map(os.readlink, ["/proc/self"] * 4))  # each worker's own pid
  print(" ".join(map(str, pids)), flush=True)
  time.sleep(60)
"""


def test_worker_pool_processes_die_with_a_killed_parent():
  parent = subprocess.Popen([sys.executable, "-c", _POOL_PARENT], stdout=subprocess.PIPE, text=True)
  workers = [int(p) for p in parent.stdout.readline().split()]
  assert workers and all(_alive(w) for w in workers)
  parent.kill()
  parent.wait(10)
  assert all(_wait_dead(w) for w in workers), workers
