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
  code = (
    "import sys, time; from composer_jax.train import workdir_lock as w; "
    "w.acquire(sys.argv[1]); print('held', flush=True); time.sleep(60)"
  )
  holder = subprocess.Popen(
    [sys.executable, "-c", code, workdir], cwd=REPO, stdout=subprocess.PIPE, text=True
  )
  try:
    assert holder.stdout.readline() == "held\n"
    with pytest.raises(
      workdir_lock.WorkdirLockedError,
      match=f"in use by pid {holder.pid} on host '{socket.gethostname()}'",
    ):
      workdir_lock.acquire(workdir)
  finally:
    holder.kill()
    holder.wait()
  assert _holder(workdir)["pid"] == holder.pid  # its file remains; its lock does not
  path = workdir_lock.acquire(workdir)
  assert _holder(workdir)["pid"] == os.getpid()
  workdir_lock.release(path)


# Argv: base dir, contenders, trials. Forks the contenders, which wait on one
# multiprocessing.Barrier (blocking, no spinning). Phase 1: per trial, all try the trial's
# workdir (seeded with a dead run's lock file) at once and hold what they won until all have
# tried. Phase 2: each acquires and releases one workdir over and over; whoever holds it must
# be alone in it (O_EXCL marker), which exercises a release racing an acquire. Prints, per
# contender, its wins ('1'/'0' per trial), how often it held the phase-2 lock, and how often
# it found another holder inside.
_CONTENDERS = r"""
import multiprocessing as mp, os, sys
from composer_jax.train import workdir_lock as wl
base, k, trials = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

def contend(barrier, results):
  won = []
  for t in range(trials):
    barrier.wait()
    try:
      path = wl.acquire(os.path.join(base, str(t)))
    except wl.WorkdirLockedError:
      path = None
    won.append("1" if path else "0")
    barrier.wait()
    if path:
      wl.release(path)
  barrier.wait()
  held = shared = 0
  for _ in range(1000):
    try:
      path = wl.acquire(os.path.join(base, "churn"))
    except wl.WorkdirLockedError:
      continue
    try:
      os.close(os.open(os.path.join(base, "inside"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
      os.remove(os.path.join(base, "inside"))
      held += 1
    except FileExistsError:  # another holder is inside: the lock failed
      shared += 1
    wl.release(path)
  results.put(("".join(won), held, shared))

ctx = mp.get_context("fork")  # a fresh interpreter: nothing threaded to fork
barrier, results = ctx.Barrier(k), ctx.Queue()
procs = [ctx.Process(target=contend, args=(barrier, results)) for _ in range(k)]
for p in procs:
  p.start()
out = [results.get(timeout=120) for _ in procs]
for p in procs:
  p.join()
  assert p.exitcode == 0, p.exitcode
for won, held, shared in out:
  print(won, held, shared)
"""


def test_exactly_one_of_many_concurrent_runs_wins(tmp_path):
  k, trials = 6, 100
  for t in range(trials):  # every trial starts from a lock file left by a dead run
    os.makedirs(tmp_path / str(t))
    (tmp_path / str(t) / workdir_lock.LOCK_FILE).write_text(
      json.dumps({"pid": 2**22 + 1, "host": socket.gethostname(), "time": 0})
    )
  proc = subprocess.run(
    [sys.executable, "-c", _CONTENDERS, str(tmp_path), str(k), str(trials)],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 0, proc.stderr
  rows = [line.split() for line in proc.stdout.splitlines()]
  assert len(rows) == k
  winners = [sum(won[t] == "1" for won, _, _ in rows) for t in range(trials)]
  assert winners == [1] * trials
  assert sum(int(shared) for _, _, shared in rows) == 0  # never two holders at once
  assert sum(int(held) for _, held, _ in rows) > k  # the churn phase really ran


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
  under = tmp_path / "file" / "a" / "b"
  with pytest.raises(
    workdir_lock.WorkdirUnusableError,
    match=f"it is under {tmp_path / 'file'}, which is not a directory",
  ):
    workdir_lock.acquire(str(under))


@pytest.mark.parametrize("dangling", [False, True])
def test_a_lock_that_is_a_symlink_is_refused_and_its_target_kept(tmp_path, dangling):
  target = tmp_path / "committed_results.csv"
  if not dangling:
    target.write_text("precious\n")
  workdir = tmp_path / "w"
  workdir.mkdir()
  os.symlink(target, workdir / workdir_lock.LOCK_FILE)
  with pytest.raises(OSError, match=r"\.lock is a symbolic link .*refusing to write"):
    workdir_lock.acquire(str(workdir))
  if dangling:
    assert not os.path.lexists(target)  # nothing created through the link
  else:
    assert target.read_text() == "precious\n"


def _no_flock(monkeypatch):
  def no_locks(*_):
    raise OSError(errno.ENOLCK, "No locks available")

  monkeypatch.setattr(fcntl, "flock", no_locks)


def test_without_file_locks_a_dead_holders_lock_is_taken_over_with_a_line(
  tmp_path, monkeypatch, caplog
):
  _no_flock(monkeypatch)
  dead = subprocess.run(
    [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
  ).stdout.strip()
  lock = tmp_path / workdir_lock.LOCK_FILE
  lock.write_text(json.dumps({"pid": int(dead), "host": socket.gethostname(), "time": 0}))
  with caplog.at_level("WARNING"):
    path = workdir_lock.acquire(str(tmp_path))
  assert _holder(str(tmp_path))["pid"] == os.getpid()
  assert f"taking over the stale lock {path} of pid {dead}" in caplog.text
  workdir_lock.release(path)


def test_without_file_locks_a_reused_pid_is_not_the_holder(tmp_path, monkeypatch):
  # The record names a live pid (the parent of this test) but another start time: the pid
  # was reused, its holder is gone.
  _no_flock(monkeypatch)
  ppid = os.getppid()
  lock = tmp_path / workdir_lock.LOCK_FILE
  record = {"pid": ppid, "host": socket.gethostname(), "time": 0, "start": 1}
  lock.write_text(json.dumps(record))
  workdir_lock.release(workdir_lock.acquire(str(tmp_path)))
  # The same pid with its real start time is a live holder: refused.
  from composer_jax.host import processes

  lock.write_text(json.dumps(dict(record, start=processes.start_ticks(ppid))))
  with pytest.raises(workdir_lock.WorkdirLockedError, match=f"in use by pid {ppid}"):
    workdir_lock.acquire(str(tmp_path))


def test_without_file_locks_another_hosts_lock_is_not_taken(tmp_path, monkeypatch):
  _no_flock(monkeypatch)
  lock = tmp_path / workdir_lock.LOCK_FILE
  lock.write_text(json.dumps({"pid": 2**22 + 1, "host": "elsewhere", "time": 0}))
  with pytest.raises(workdir_lock.WorkdirLockedError, match="if that run is gone, delete"):
    workdir_lock.acquire(str(tmp_path))


def test_held_or_exit_is_one_line_for_an_entry_point(tmp_path):
  with workdir_lock.held_or_exit(str(tmp_path)) as path:
    assert _holder(str(tmp_path))["pid"] == os.getpid()
    with pytest.raises(SystemExit, match=f"^error: --workdir {tmp_path} is in use by pid"):
      with workdir_lock.held_or_exit(str(tmp_path)):
        pytest.fail("ran while the workdir was held")
  assert not os.path.exists(path)
