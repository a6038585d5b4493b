"""Workdir lock: held while running, refused to a second job, free again when its holder
dies however it dies, and exactly one winner among runs that start at once."""

import errno
import fcntl
import json
import os
import socket
import subprocess
import sys

import pytest

from composer_jax.train import workdir_lock

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


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
  assert os.listdir(workdir) == []  # nothing left behind
  workdir_lock.release(path)  # not held: nothing happens


def test_kill_9_frees_the_lock_and_an_old_lock_file_is_no_lock(tmp_path):
  """A live holder in another process is named; after kill -9 the lock is free with no
  takeover (the kernel released it), though its file is still there."""
  workdir = str(tmp_path)
  code = ("import sys, time; from composer_jax.train import workdir_lock as w; "
          "w.acquire(sys.argv[1]); print('held', flush=True); time.sleep(60)")
  holder = subprocess.Popen([sys.executable, "-c", code, workdir], cwd=REPO,
                            stdout=subprocess.PIPE, text=True)
  try:
    assert holder.stdout.readline() == "held\n"
    with pytest.raises(workdir_lock.WorkdirLockedError,
                       match=f"in use by pid {holder.pid} on host '{socket.gethostname()}'"):
      workdir_lock.acquire(workdir)
  finally:
    holder.kill()
    holder.wait()
  assert _holder(workdir)["pid"] == holder.pid  # its file remains; its lock does not
  path = workdir_lock.acquire(workdir)
  assert _holder(workdir)["pid"] == os.getpid()
  workdir_lock.release(path)


# One contender (argv: base dir, index, contenders, trials). Phase 1: per trial, all
# contenders pass a file barrier, then try the trial's workdir (seeded with a dead run's
# lock file) at once, and hold what they won until all have tried. Phase 2: each acquires
# and releases one workdir over and over; whoever holds it must be alone in it (O_EXCL
# marker), which exercises a release racing an acquire.
_CONTENDER = r"""
import os, sys, time
from composer_jax.train import workdir_lock as wl
base, me, k, trials = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
def barrier(name):
  d = os.path.join(base, "barrier", name)
  os.makedirs(d, exist_ok=True)
  open(os.path.join(d, me), "w").close()
  while len(os.listdir(d)) < k:
    time.sleep(0.0002)
won = []
for t in range(trials):
  barrier(f"go{t}")
  try:
    path = wl.acquire(os.path.join(base, str(t)))
  except wl.WorkdirLockedError:
    path = None
  won.append("1" if path else "0")
  barrier(f"tried{t}")
  if path:
    wl.release(path)
barrier("churn")
held, deadline = 0, time.time() + 1.0
while time.time() < deadline:
  try:
    path = wl.acquire(os.path.join(base, "churn"))
  except wl.WorkdirLockedError:
    continue
  marker = os.open(os.path.join(base, "inside"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
  os.close(marker)
  os.remove(os.path.join(base, "inside"))
  held += 1
  wl.release(path)
print("".join(won), held)
"""


def test_exactly_one_of_many_concurrent_runs_wins(tmp_path):
  k, trials = 6, 100
  for t in range(trials):  # every trial starts from a lock file left by a dead run
    os.makedirs(tmp_path / str(t))
    (tmp_path / str(t) / workdir_lock.LOCK_FILE).write_text(
        json.dumps({"pid": 2**22 + 1, "host": socket.gethostname(), "time": 0}))
  procs = [subprocess.Popen([sys.executable, "-c", _CONTENDER, str(tmp_path), str(i), str(k),
                             str(trials)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True) for i in range(k)]
  outs = [p.communicate(timeout=120) for p in procs]
  assert all(p.returncode == 0 for p in procs), [err for _, err in outs]
  won = [out.split()[0] for out, _ in outs]
  winners = [sum(w[t] == "1" for w in won) for t in range(trials)]
  assert winners == [1] * trials
  assert sum(int(out.split()[1]) for out, _ in outs) > k  # the churn phase really ran


def test_filesystem_without_file_locks(tmp_path, monkeypatch):
  """No flock (ENOLCK): the lock is the file's exclusive creation; one holder, and the
  message says to delete the file if its run is gone."""
  def no_locks(*_):
    raise OSError(errno.ENOLCK, "No locks available")
  monkeypatch.setattr(fcntl, "flock", no_locks)
  path = workdir_lock.acquire(str(tmp_path))
  assert _holder(str(tmp_path))["pid"] == os.getpid()
  with pytest.raises(workdir_lock.WorkdirLockedError, match=f"if that run is gone, delete {path}"):
    workdir_lock.acquire(str(tmp_path))
  workdir_lock.release(path)
  assert os.listdir(tmp_path) == []


def test_unusable_workdir_is_one_line(tmp_path):
  (tmp_path / "file").write_text("")
  with pytest.raises(workdir_lock.WorkdirUnusableError, match="it is a regular file"):
    workdir_lock.acquire(str(tmp_path / "file"))
