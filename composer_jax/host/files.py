"""Files a program creates under the paths it was given, never through a link.

A name in a run directory that is a symbolic link (planted, or left by another tool) would make
a plain `open(path, 'w')` write wherever the link points: a `.lock` linked to a source file
overwrites that file. Every opener here adds `O_NOFOLLOW` (a link as the last component is
refused, `ELOOP`) and `O_CLOEXEC`; `create_new` adds `O_EXCL` (the name must not exist). A
refused link is a `LinkRefusedError`, an `OSError` whose text is one line naming the path and
where it points. Links in the directories above are the caller's: those are the paths given.
"""

from __future__ import annotations

import errno
import os


class LinkRefusedError(OSError):
  """A file to be written is a symbolic link."""


def _refused(path: str) -> LinkRefusedError:
  try:
    target = os.readlink(path)
  except OSError:
    target = "?"
  return LinkRefusedError(
    f"{path} is a symbolic link (to {target}); refusing to write through it: remove the link "
    "or pass a directory of your own"
  )


def open_fd(path: str, flags: int, mode: int = 0o644) -> int:
  """`os.open(path, flags | O_NOFOLLOW | O_CLOEXEC, mode)`; a link raises LinkRefusedError."""
  try:
    return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
  except OSError as e:
    if e.errno == errno.ELOOP or (e.errno == errno.EEXIST and os.path.islink(path)):
      raise _refused(path) from None
    raise


def create_new(path: str, mode: int = 0o644) -> int:
  """A descriptor (read-write) of `path`, created now: raises FileExistsError if it exists,
  LinkRefusedError if it is a link (dangling or not)."""
  return open_fd(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, mode)


def open_append(path: str):
  """`path` opened for appending, unbuffered (binary): one `write` per record."""
  return os.fdopen(open_fd(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND), "ab", buffering=0)


def write_bytes(path: str, data: bytes) -> None:
  """Replaces `path`'s contents with `data` (created if missing; a link is refused)."""
  with os.fdopen(open_fd(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "wb") as f:
    f.write(data)


def read_bytes(path: str) -> bytes:
  """`path`'s contents; a link is refused (what it points at is not this run's)."""
  with os.fdopen(open_fd(path, os.O_RDONLY), "rb") as f:
    return f.read()


def not_a_directory(path: str) -> str:
  """'' when `path` is a directory or can be made one; else why not, in words: it is a file,
  or it lies under one (`--out`, `--workdir`: checked at start, before any work)."""
  above = os.path.abspath(path)
  while not os.path.lexists(above):
    above = os.path.dirname(above)
  if os.path.isdir(above):
    return ""
  if above == os.path.abspath(path):
    return (
      "it is a regular file, not a directory"
      if os.path.isfile(above)
      else ("it is not a directory")
    )
  return f"it is under {above}, which is not a directory"


def check_output_dir(path: str, flag: str) -> None:
  """Raises ValueError, one line, when `path` (given as `flag`) cannot be a directory."""
  if why := not_a_directory(path):
    raise ValueError(f"{flag}={path}: {why}; pass a directory (new, or this run's own)")
