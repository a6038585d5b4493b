"""One running job per workdir: an `flock(2)` lock on `<workdir>/.lock`, held for the job's life.

A second run on the same workdir fails with a one-line `WorkdirLockedError` naming the
holder (the lock file holds its pid, host and start time), instead of overwriting its
checkpoints. The kernel releases the lock when the holder's process ends in any way (exit,
kill -9, OOM kill), so a lock left by a dead run is never "stale": the next run simply gets
it, and there is no takeover to race. Of any number of runs starting at once, exactly one
wins. On NFS, Linux maps `flock` to whole-file POSIX locks that every client sees, unless
the filesystem is mounted with `local_lock=flock|all` (then the lock only excludes runs on
the same host).

On a filesystem without file locks (`flock` fails with ENOLCK/EOPNOTSUPP, e.g. some FUSE
mounts) the lock file is created exclusively (`O_EXCL`) instead: still one winner, but a
run that died without releasing it leaves it behind. The file names its holder's pid, host
and process start time, so a lock of this host whose process no longer runs (or whose pid now
belongs to a later process) is stale: it is taken over, with a warning line naming the old
holder. A lock of another host cannot be checked: the message says to delete it.

The lock file is never opened through a symbolic link (`host.files`): a `.lock` that is a link
is refused in one line, and the file it points at is left as it was.

Creating the lock is also the first write into the workdir, so a read-only or non-directory
workdir fails here, in one line, before any work.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator

from absl import logging

from composer_jax.host import files, processes

LOCK_FILE = ".lock"

# flock errors that mean "this filesystem has no file locks", not "someone holds it".
_NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS, errno.EINVAL)

_held: dict[str, int] = {}  # lock path -> the open descriptor that holds it


class WorkdirLockedError(RuntimeError):
  """The workdir is held by another live job."""


class WorkdirUnusableError(OSError):
  """The workdir cannot be created or written (a file, read-only, no permission)."""


def _holder(path: str) -> dict | None:
  """The lock file's record, None while it is unreadable (mid-write, or not ours)."""
  try:
    holder = json.loads(files.read_bytes(path))
    return holder if isinstance(holder, dict) else None
  except (OSError, ValueError):
    return None


def _describe(holder: dict | None) -> str:
  """The holder as its lock file names it (it may be mid-write: then 'another process')."""
  try:
    since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(holder["time"])))
    return f"pid {holder['pid']} on host {holder['host']!r} (since {since})"
  except (ValueError, TypeError, KeyError):
    return "another process"


def _stale(holder: dict | None) -> bool:
  """The holder ran on this host and its process is gone (its pid free, or reused since)."""
  try:
    if holder["host"] != socket.gethostname():
      return False
    started = processes.start_ticks(int(holder["pid"]))
  except (TypeError, KeyError, ValueError):
    return False
  return started is None or started != holder.get("start", started)


def _write_holder(fd: int) -> None:
  me = {
    "pid": os.getpid(),
    "host": socket.gethostname(),
    "time": time.time(),
    "start": processes.start_ticks(os.getpid()),
  }
  os.ftruncate(fd, 0)
  os.pwrite(fd, json.dumps(me).encode(), 0)


def _lock(path: str) -> int:
  """The descriptor holding `path`'s lock.

  Raises BlockingIOError when another process holds it, and FileExistsError when the file
  exists on a filesystem without flock (there the lock is the file's existence: whoever
  creates it, `O_EXCL`, holds it). The lock is taken on an open file, so the file must
  still be `path` once it is held: a holder releasing it unlinks it, and a run that opened
  the old file just before would hold a lock nobody else sees; then it retries.
  """
  while True:
    try:
      fd, created = files.create_new(path), True
    except FileExistsError:
      try:
        fd, created = files.open_fd(path, os.O_RDWR), False
      except FileNotFoundError:  # Released in between: create it.
        continue
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
      if e.errno in _NO_LOCKS and created:
        return fd
      os.close(fd)
      if e.errno in _NO_LOCKS:
        raise FileExistsError(errno.EEXIST, "held", path) from None
      raise
    try:
      same = os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
      same = False
    if same:
      return fd
    os.close(fd)


def _unusable(workdir: str, e: OSError) -> WorkdirUnusableError:
  if why := files.not_a_directory(workdir):
    reason = why
  else:
    reason = f"{e.strerror or e} ({type(e).__name__})"
  return WorkdirUnusableError(
    f"--workdir {workdir}: cannot write there: {reason}; pass a "
    "writable directory (new, or holding this run's checkpoints)"
  )


def acquire(workdir: str) -> str:
  """Creates `workdir` if needed and takes its lock until `release` or this process ends;
  returns the lock path.

  Raises:
    WorkdirLockedError: another process holds the lock (in this process too: a second
      `acquire` of a held workdir is refused).
    WorkdirUnusableError: `workdir` is a file, read-only, or otherwise not writable.
  """
  path = os.path.join(workdir, LOCK_FILE)
  try:
    os.makedirs(workdir, exist_ok=True)
    fd = None
    while fd is None:
      try:
        fd = _lock(path)
      except (BlockingIOError, FileExistsError) as e:
        holder = _holder(path)
        if isinstance(e, FileExistsError) and _stale(holder):
          logging.warning(
            "--workdir %s: taking over the stale lock %s of %s, which no longer runs",
            workdir,
            path,
            _describe(holder),
          )
          os.remove(path)
          continue
        hint = (
          ""
          if isinstance(e, BlockingIOError)
          else f"; this filesystem has no file locks, so if that run is gone, delete {path}"
        )
        raise WorkdirLockedError(
          f"--workdir {workdir} is in use by {_describe(holder)}: wait for "
          f"that run to finish or pass another --workdir{hint}"
        ) from None
    _write_holder(fd)
  except files.LinkRefusedError:
    raise
  except OSError as e:
    raise _unusable(workdir, e) from None
  _held[path] = fd
  return path


def release(path: str) -> None:
  """Releases the lock if this process holds it (the file is removed, then unlocked)."""
  fd = _held.pop(path, None)
  if fd is None:
    return
  with contextlib.suppress(OSError):
    os.remove(path)
  os.close(fd)


@contextlib.contextmanager
def held(workdir: str) -> Iterator[str]:
  """`with held(workdir):` runs the job while holding the workdir's lock."""
  path = acquire(workdir)
  try:
    yield path
  finally:
    release(path)


@contextlib.contextmanager
def held_or_exit(workdir: str) -> Iterator[str]:
  """`held` for an entry point (a figure, a sweep): a workdir another live run holds, or
  one that cannot be written, exits with its one line (`error: ...`, status 1)."""
  try:
    path = acquire(workdir)
  except (WorkdirLockedError, OSError) as e:
    raise SystemExit(f"error: {e}") from None
  try:
    yield path
  finally:
    release(path)
