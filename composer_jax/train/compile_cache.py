"""JAX's persistent compilation cache: compiled programs are reused across runs.

A second run of the same config (or a resumed one) loads its executables from disk instead
of recompiling them (the `tiny` train step: seconds of XLA compile time). Only the first
directory set in a process takes effect: JAX opens the cache once, at the first compile.
"""

import os

import jax
from absl import logging

OFF = "none"


def cache_dir(setting: str, workdir: str) -> str | None:
  """`train.compile_cache_dir` -> a directory: '' = `<workdir>/compile_cache`, 'none' = off."""
  if setting == OFF:
    return None
  return os.path.abspath(setting or os.path.join(workdir, "compile_cache"))


def enable(directory: str | None) -> None:
  """Caches every compiled program under `directory` (None: leaves the cache off)."""
  if directory is None:
    return
  os.makedirs(directory, exist_ok=True)
  jax.config.update("jax_compilation_cache_dir", directory)
  # Defaults skip programs compiled in under 1 s; the small step programs matter here too.
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  logging.info("Persistent compilation cache: %s", directory)
