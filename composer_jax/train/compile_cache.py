"""JAX's persistent compilation cache: one policy for every program of a run (the supervised
steps, an RL experiment's warm-up, update and probes), with the checks a cache of native code needs.

A later run of the same config (a rerun, a resumed run, the next seed of a sweep) loads its
compiled programs from the cache instead of compiling them (the `tiny` train step: tens of CPU
seconds cold, a few warm). JAX keys every entry by the program itself — its lowered module,
compile options, devices, jax/jaxlib and XLA versions — so an entry never stands in for a
program it was not compiled from: a run with another step count (another LR schedule, other
constants in the module) compiles its own.

An entry is a compiled executable: loading one runs its code as this user. So:
  * `enable` refuses (one line) a directory that this user does not own or that its group or
    others may write: anyone who can write a cache can run code in every run that reads it;
  * an entry that this user does not own, that others may write, or that does not decompress
    (a write cut short: JAX writes entries in place and never replaces one that exists, so it
    would fail on every run) is deleted with a one-line warning naming the file, and compiled
    again.
Sharing a cache: among one user's runs only (sweeps, seeds, resumes, notebooks), e.g.
`--config.train.compile_cache_dir=~/.cache/composer_jax/compile` (created 0700). Never a
directory other users can write; a team that wants one cache runs its jobs as one user.

Only the first directory set in a process takes effect: JAX opens its cache once, at the first
compile.
"""

from __future__ import annotations

import os
import stat
import zlib

import jax
from absl import logging

OFF = "none"
_ENTRY = "-cache"  # JAX's file cache: <key>-cache, compressed (zstd if installed, else zlib)
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def cache_dir(setting: str, workdir: str) -> str | None:
  """`train.compile_cache_dir` -> a directory: '' = `<workdir>/compile_cache`, 'none' = off."""
  if setting == OFF:
    return None
  return os.path.abspath(os.path.expanduser(setting or os.path.join(workdir, "compile_cache")))


def _unsafe(st: os.stat_result) -> str | None:
  """Why a file or directory with this stat may not be trusted, or None."""
  if st.st_uid != os.getuid():
    return f"is owned by uid {st.st_uid}, not this user ({os.getuid()})"
  if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
    return f"is writable by its group or others (mode {stat.filemode(st.st_mode)})"
  return None


def _zstd_decompress(blob: bytes) -> bytes:
  """As JAX reads a zstd entry: Python 3.14's `compression.zstd`, else the zstandard package
  (JAX wrote it with one of them, so it is there)."""
  try:
    from compression import zstd
  except ImportError:
    import zstandard

    return zstandard.ZstdDecompressor().decompress(blob)
  return zstd.decompress(blob)


def _decompresses(path: str) -> bool:
  with open(path, "rb") as f:
    blob = f.read()
  try:
    if blob.startswith(_ZSTD_MAGIC):
      _zstd_decompress(blob)
    else:
      zlib.decompress(blob)
  except Exception:  # noqa: BLE001 -- any decoding failure: the entry is not usable
    return False
  return True


def check_entries(directory: str) -> None:
  """Deletes, with a one-line warning naming each, the entries in `directory` that may not
  be trusted or do not decompress (module docstring). Only JAX's entries (`<key>-cache` files
  at the top level, all that it reads) are looked at: anything else there is left alone."""
  for name in sorted(os.listdir(directory)):
    if name.endswith(_ENTRY):
      try:
        _check_entry(os.path.join(directory, name))
      except FileNotFoundError:  # another process of this run (or a peer run) deleted it
        pass


def _check_entry(path: str) -> None:
  st = os.lstat(path)
  if stat.S_ISDIR(st.st_mode):
    return
  if stat.S_ISLNK(st.st_mode):
    why = "is a link"
  elif not stat.S_ISREG(st.st_mode):  # a FIFO would block the read below
    why = "is not a regular file"
  else:
    why = _unsafe(st)
  if why is None and not _decompresses(path):
    why = "does not decompress (a write cut short?)"
  if why:
    logging.warning("Compilation cache entry %s %s; deleted it (compiled again)", path, why)
    os.remove(path)


def enable(directory: str | None) -> None:
  """Caches every compiled program under `directory` (None: leaves the cache off), after the
  checks of the module docstring. The directory is checked even when another one is already set
  in this process (and stays in use).

  Raises:
    ValueError: `directory` is not a directory, is not owned by this user, or is writable by
      its group or others.
  """
  if directory is None:
    return
  try:
    try:
      os.makedirs(directory, mode=0o700)
    except FileExistsError:  # also when the processes of one run create it at once
      pass
    st = os.stat(directory)
  except OSError as e:
    raise ValueError(
      f"train.compile_cache_dir {directory}: {e.strerror}; give a directory "
      f"this user may write, or '{OFF}'"
    ) from None
  why = "is not a directory" if not stat.S_ISDIR(st.st_mode) else _unsafe(st)
  if why:
    raise ValueError(
      f"train.compile_cache_dir {directory} {why}: a compiled program read "
      "from it runs as this user; use a directory only this user can write "
      f"(chmod go-w), or '{OFF}'"
    )
  current = jax.config.jax_compilation_cache_dir
  if current and os.path.abspath(current) != directory:
    logging.info(
      "Compilation cache %s already set in this process; %s is not used", current, directory
    )
    return
  check_entries(directory)
  jax.config.update("jax_compilation_cache_dir", directory)
  # Defaults skip programs compiled in under 1 s; the small step programs matter here too.
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  logging.info("Persistent compilation cache: %s", directory)
