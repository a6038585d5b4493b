"""Host memory: keep freed heap memory in the process for the next step (glibc `mallopt`).

XLA:CPU gives each run of an executable one temporary buffer for all its intermediates (the
`tiny` train step's is 61 MB: `compiled.memory_analysis().temp_size_in_bytes`) and frees it
when the run ends. glibc serves a block that large with `mmap` and hands it back with
`munmap` when freed (and trims the top of its heap past `M_TRIM_THRESHOLD`), so every step
faulted the same memory in again, page by page, each page zero-filled by the kernel: 15,000
page faults and 30 ms of system time in a 90 ms `tiny` step on one CPU (RESULTS.md,
2026-12-06). `keep_freed_memory()` raises both thresholds, so a freed buffer stays in the heap
and the next step reuses it: 0-2,400 faults and 55-62 ms. The cost is that the process keeps
its peak heap (nothing is returned to the OS) — what a training process holds anyway.

`mallopt` takes a C int, so a temporary buffer above `_MAX_BYTES` (2 GiB) is still mapped
afresh at every run. Other C libraries (macOS, musl) have no `mallopt`: nothing is changed
there, and the call says so.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

_M_TRIM_THRESHOLD = -1  # glibc malloc.h
_M_MMAP_THRESHOLD = -3
_MAX_BYTES = 2**31 - 1  # mallopt's value is an int


def keep_freed_memory() -> bool:
  """Makes glibc keep freed blocks up to 2 GiB for reuse; returns whether it did (False
  where the C library is not glibc). Idempotent; process-wide."""
  name = ctypes.util.find_library("c")
  mallopt = getattr(ctypes.CDLL(name), "mallopt", None) if name else None
  if mallopt is None:
    logging.info("host_memory: no glibc mallopt in %r; the allocator's defaults stay", name)
    return False
  mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
  # mmap threshold first: setting it also turns off glibc's dynamic threshold adjustment.
  ok = mallopt(_M_MMAP_THRESHOLD, _MAX_BYTES) == 1 and mallopt(_M_TRIM_THRESHOLD, _MAX_BYTES) == 1
  if not ok:
    logging.warning("host_memory: mallopt refused %d bytes; freed memory may be unmapped", _MAX_BYTES)
  return ok
