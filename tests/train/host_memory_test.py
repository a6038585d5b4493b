"""`host_memory.keep_freed_memory`: a freed large block is reused, not faulted in again."""

import subprocess
import sys

# Allocates and fills a 60 MB block (like XLA:CPU's per-run temporary buffer), frees it, and
# counts the page faults of doing it again.
_PROGRAM = """
import ctypes, ctypes.util, resource, sys
from composer_jax.train import host_memory
if sys.argv[1] == "keep":
  assert host_memory.keep_freed_memory()
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = (ctypes.c_void_p,)
size = 60 << 20
def fill():
  block = libc.malloc(size)
  ctypes.memset(block, 1, size)
  libc.free(block)
fill()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
fill()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> int:
  out = subprocess.run(
    [sys.executable, "-c", _PROGRAM, mode], capture_output=True, text=True, check=True
  )
  return int(out.stdout)


def test_a_freed_block_is_reused_without_page_faults():
  pages = (60 << 20) // 4096
  assert _faults("default") > pages // 2  # glibc's default: mapped afresh, faulted page by page
  assert _faults("keep") < pages // 20
