"""`host_memory`: a freed large block is reused, not faulted in again page by page.

Each case runs in a fresh process (the settings are process-wide, and one must precede JAX's
backend) on one CPU with one JAX device, and counts the minor page faults of a second
identical run.
"""

import os
import subprocess
import sys

import pytest

from composer_jax.train import host_memory

# A block filled and freed twice (like XLA:CPU's per-run temporary buffer).
_MALLOC = """
import ctypes, ctypes.util
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)
def run():
  block = libc.malloc({size})
  ctypes.memset(block, 1, {size})
  libc.free(block)
"""
# An executable whose temporary buffer (the 80 MB cumsum) is above a glibc thread arena's 64 MiB.
_JAX = """
import jax, jax.numpy as jnp
f = jax.jit(lambda x: jnp.sum(jnp.cumsum(x) ** 2))
x = jnp.ones((20 << 20,), jnp.float32)
run = lambda: f(x).block_until_ready()
"""
_COUNT = """
import resource
run()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
run()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(setup: str, workload: str) -> int:
  program = "import os\nos.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\n"
  program += f"from composer_jax.train import host_memory\n{setup}\n{workload}\n{_COUNT}"
  env = dict(os.environ, XLA_FLAGS="")  # one CPU device and XLA's defaults, as a run has
  out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, env=env)
  assert out.returncode == 0, out.stderr[-2000:]
  return int(out.stdout.split()[-1])


def test_a_freed_block_is_reused_without_page_faults():
  pages = (60 << 20) // 4096
  block = _MALLOC.format(size=60 << 20)
  assert _faults("", block) > pages // 2  # glibc's default: mapped afresh, faulted in
  assert _faults("assert host_memory.keep_freed_memory()", block) < pages // 20


def test_a_freed_block_over_2_gib_is_reused_without_page_faults():
  # Past what any mmap threshold can be set to (a C int).
  size = (5 << 30) // 2
  block = _MALLOC.format(size=size)
  assert _faults("assert host_memory.keep_freed_memory()", block) < (size // 4096) // 20


def test_xla_temporaries_over_64_mib_are_reused_when_run_on_the_calling_thread():
  pages = (80 << 20) // 4096
  keep = "assert host_memory.keep_freed_memory()"
  # On XLA's own thread the buffer comes from its arena, which maps anything over 64 MiB.
  assert _faults(keep, _JAX) > pages // 2
  assert _faults(f"{keep}\nhost_memory.run_on_calling_thread()", _JAX) < pages // 4


def test_run_on_calling_thread_refuses_once_a_backend_started():
  import jax

  jax.devices()
  with pytest.raises(RuntimeError, match="must run before JAX starts a backend"):
    host_memory.run_on_calling_thread()
