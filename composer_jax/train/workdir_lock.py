"""One running job per workdir: `<workdir>/.lock` holds the owner's pid and host.

A second run on the same workdir fails with a one-line `WorkdirLockedError` naming the
holder, instead of overwriting its checkpoints. A lock left by a process that died without
releasing it (kill -9, OOM kill, a crashed node on the same host) is taken over with a
warning: on the holder's host, `kill(pid, 0)` tells whether it still runs. A lock held from
another host is never taken over (liveness cannot be checked from here); the message says
to delete the file if that job is gone. Creating the lock is also the first write into the
workdir, so a read-only or non-directory workdir fails here, in one line, before any work.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import time
from collections.abc import Iterator

from absl import logging

LOCK_FILE = ".lock"


class WorkdirLockedError(RuntimeError):
  """The workdir is held by another live job."""


class WorkdirUnusableError(OSError):
  """The workdir cannot be created or written (a file, read-only, no permission)."""


def _holder(path: str) -> dict | None:
  """The lock's content, or None when it vanished or is unreadable (a torn write)."""
  try:
    with open(path) as f:
      return json.load(f)
  except FileNotFoundError:
    return None
  except (OSError, ValueError):
    return {}


def _create(tmp: str, path: str, me: dict) -> None:
  """Creates `path` holding `me`, atomically; FileExistsError if it exists."""
  try:
    os.link(tmp, path)  # The complete file appears at once.
  except FileExistsError:
    raise
  except OSError as e:  # A filesystem without hard links: exclusive create, then write.
    if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS):
      raise
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    with os.fdopen(fd, "w") as f:
      json.dump(me, f)


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # Exists, owned by another user.
    return True
  return True


def _describe(holder: dict) -> str:
  since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(holder.get("time", 0)))
  return f"pid {holder.get('pid')} on host {holder.get('host')!r} (since {since})"


def _unusable(workdir: str, e: OSError) -> WorkdirUnusableError:
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    reason = "it is a regular file, not a directory"
  else:
    reason = f"{e.strerror or e} ({type(e).__name__})"
  return WorkdirUnusableError(f"--workdir {workdir}: cannot write there: {reason}; pass a "
                              "writable directory (new, or holding this run's checkpoints)")


def acquire(workdir: str) -> str:
  """Creates `workdir` if needed and takes its lock; returns the lock path.

  Raises:
    WorkdirLockedError: a live process holds the lock (or one on another host).
    WorkdirUnusableError: `workdir` is a file, read-only, or otherwise not writable.
  """
  path = os.path.join(workdir, LOCK_FILE)
  me = {"pid": os.getpid(), "host": socket.gethostname(), "time": time.time()}
  tmp = f"{path}.{me['pid']}.tmp"
  try:
    os.makedirs(workdir, exist_ok=True)
    with open(tmp, "w") as f:  # Complete before it becomes the lock: never a torn lock file.
      json.dump(me, f)
    try:
      _create(tmp, path, me)
      return path
    except FileExistsError:
      holder = _holder(path)
      stale = (holder is not None and holder.get("host") == me["host"]
               and isinstance(holder.get("pid"), int) and not _alive(holder["pid"]))
      if holder and not stale:
        raise WorkdirLockedError(
            f"--workdir {workdir} is in use by {_describe(holder)}: wait for that run to "
            f"finish or pass another --workdir (if that run is gone, delete {path})") from None
      if holder:
        logging.warning("Taking over the stale lock %s of %s, which no longer runs", path,
                        _describe(holder))
      else:
        logging.warning("Replacing the unreadable lock file %s", path)
      os.replace(tmp, path)
      if _holder(path) != me:  # Another run took it over at the same moment.
        raise WorkdirLockedError(f"--workdir {workdir} is in use by "
                                 f"{_describe(_holder(path) or {})}") from None
      return path
  except OSError as e:
    raise _unusable(workdir, e) from None
  finally:
    with contextlib.suppress(OSError):
      os.remove(tmp)


def release(path: str) -> None:
  """Removes the lock if this process still holds it."""
  holder = _holder(path)
  if holder and holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname():
    with contextlib.suppress(OSError):
      os.remove(path)


@contextlib.contextmanager
def held(workdir: str) -> Iterator[str]:
  """`with held(workdir):` runs the job while holding the workdir's lock."""
  path = acquire(workdir)
  try:
    yield path
  finally:
    release(path)
