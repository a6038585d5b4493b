"""Workdir lock: held while running, refused to a second job, stale locks taken over."""

import json
import os
import socket
import subprocess
import sys

import pytest

from composer_jax.train import workdir_lock


def _dead_pid() -> int:
  proc = subprocess.Popen([sys.executable, "-c", ""])
  proc.wait()  # Reaped: the pid no longer runs.
  return proc.pid


def _write_lock(workdir, pid, host):
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, workdir_lock.LOCK_FILE), "w") as f:
    json.dump({"pid": pid, "host": host, "time": 0}, f)


def _holder(workdir):
  with open(os.path.join(workdir, workdir_lock.LOCK_FILE)) as f:
    return json.load(f)


def test_held_then_released(tmp_path):
  workdir = str(tmp_path / "w")
  with workdir_lock.held(workdir) as path:
    assert _holder(workdir)["pid"] == os.getpid()
    with pytest.raises(workdir_lock.WorkdirLockedError, match=f"in use by pid {os.getpid()}"):
      workdir_lock.acquire(workdir)
  assert not os.path.exists(path)
  assert os.listdir(workdir) == []  # no temporary file left behind


def test_live_holder_refused_stale_taken_over(tmp_path, caplog):
  workdir = str(tmp_path)
  holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
  try:
    _write_lock(workdir, holder.pid, socket.gethostname())
    with pytest.raises(workdir_lock.WorkdirLockedError,
                       match=f"in use by pid {holder.pid} on host '{socket.gethostname()}'"):
      workdir_lock.acquire(workdir)
  finally:
    holder.kill()
    holder.wait()
  with caplog.at_level("WARNING"):
    path = workdir_lock.acquire(workdir)  # the holder is dead now
  assert f"Taking over the stale lock {path} of pid {holder.pid}" in caplog.text
  assert _holder(workdir)["pid"] == os.getpid()
  workdir_lock.release(path)


def test_other_host_never_taken_over(tmp_path):
  _write_lock(str(tmp_path), _dead_pid(), "elsewhere")
  with pytest.raises(workdir_lock.WorkdirLockedError, match="host 'elsewhere'.*delete"):
    workdir_lock.acquire(str(tmp_path))
  workdir_lock.release(os.path.join(tmp_path, workdir_lock.LOCK_FILE))  # not ours: kept
  assert _holder(str(tmp_path))["host"] == "elsewhere"


def test_filesystem_without_hard_links(tmp_path, monkeypatch):
  def no_links(*_):
    raise PermissionError(1, "Operation not permitted")
  monkeypatch.setattr(os, "link", no_links)
  path = workdir_lock.acquire(str(tmp_path))
  assert _holder(str(tmp_path))["pid"] == os.getpid()
  with pytest.raises(workdir_lock.WorkdirLockedError):
    workdir_lock.acquire(str(tmp_path))
  workdir_lock.release(path)
  assert os.listdir(tmp_path) == []
