"""Host memory: keep freed heap memory in the process for the next step (glibc `mallopt`).

XLA:CPU gives each run of an executable one temporary buffer for all its intermediates (the
`tiny` train step's is 61 MB, `small`'s at 2 layers 599 MB:
`compiled.memory_analysis().temp_size_in_bytes`) and frees it when the run ends. glibc's
default mmap threshold (128 KiB, raised towards at most 32 MiB as mapped blocks are freed)
makes it serve a block that large with `mmap` and hand it back with `munmap`, so every step
faulted the same memory in again, page by page, each page zero-filled by the kernel: 15,000
faults and 30 ms of system time in a 90 ms `tiny` step on one CPU, 147,000 in a 1.6 s `small`
step (RESULTS.md, 2026-12-06). Two settings keep it:

* `keep_freed_memory()`: no `mmap` for any block (`M_MMAP_MAX` 0) and no trimming of the
  heap's free top (`M_TRIM_THRESHOLD` -1), so such blocks come from the heap and freed ones
  stay there for the next step, whatever their size. (An mmap threshold cannot do it: a
  C int, so at most 2 GiB; `small`'s buffer at 12 layers is 3.25 GiB and faulted 850,000
  pages, 1.9 s of system time, a step.) The cost is that the process keeps its peak heap,
  which a training process holds anyway.
* `run_on_calling_thread()`: JAX's synchronous CPU dispatch, so a single-device executable
  runs on the thread that calls it. Run asynchronously, it runs on a thread of XLA's, whose
  glibc arena is a mapped heap of at most 64 MiB (a glibc constant) that serves anything
  larger with `mmap` whatever the settings above: `small`'s buffer. (Putting every thread on the
  main arena, `M_ARENA_MAX` 1, was slower: the default 2-thread run 61 s instead of 42.)
  On CPU the caller has nothing to overlap with the step anyway; the default run takes the
  same time either way. JAX reads it when its CPU backend starts, so it must come first, and
  applies it only to executables XLA:CPU does not split over its threads: on one CPU all of
  them; with more, a split step is still dispatched to XLA's threads.

`experiments.run` sets both first; the training driver calls `keep_freed_memory()` again (for
programs started from Python). Other C libraries (macOS, musl) have no `mallopt`: nothing is
changed there, and the call says so.
"""

from __future__ import annotations

import ctypes
import ctypes.util

from absl import logging

# glibc <malloc.h>: parameter -> value (mallopt(3): 0 disables mmap, -1 disables trimming)
_KEEP = {-4: 0, -1: -1}  # M_MMAP_MAX, M_TRIM_THRESHOLD


def keep_freed_memory() -> bool:
  """Makes glibc serve blocks of any size from its heap and keep freed ones for reuse;
  returns whether it did (False where the C library has no `mallopt`). Idempotent;
  process-wide."""
  name = ctypes.util.find_library("c")
  mallopt = getattr(ctypes.CDLL(name), "mallopt", None) if name else None
  if mallopt is None:
    logging.info("host_memory: no mallopt in the C library %r; its defaults stay", name)
    return False
  mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
  refused = {p: v for p, v in _KEEP.items() if mallopt(p, v) != 1}
  if refused:
    logging.warning("host_memory: mallopt refused (param: value) %s", refused)
  return not refused


def run_on_calling_thread() -> None:
  """Makes XLA:CPU run single-device executables on the calling thread (no async dispatch).

  Raises:
    RuntimeError: a JAX backend has already started (the setting would have no effect).
  """
  import jax  # here, not above: `keep_freed_memory` also serves processes without JAX
  from jax._src import xla_bridge  # no public way to ask whether a backend has started

  if xla_bridge.backends_are_initialized():
    raise RuntimeError(
      "host_memory.run_on_calling_thread() must run before JAX starts a backend "
      "(first thing in the program); JAX reads jax_cpu_enable_async_dispatch only then"
    )
  jax.config.update("jax_cpu_enable_async_dispatch", False)
