"""Child processes that die with their parent.

A program's children (stage processes, worker pools, launched ranks) must not outlive it: a
killed parent whose children keep writing into its output, while a re-run starts its own,
corrupts that output. Two mechanisms, both here:

* `popen(args, ...)`: `subprocess.Popen` whose child stays in the parent's process group (so a
  job system or a terminal signalling the group reaches it) and asks the kernel, before it
  executes anything, to SIGKILL it when its parent dies (`prctl(PR_SET_PDEATHSIG)`), however the
  parent dies: exit, exception, SIGTERM, `kill -9`, OOM kill. Children still running when the
  parent exits normally are stopped first with SIGTERM (a grace period, then SIGKILL), so they
  can save; `stop_children()` does that on demand (e.g. in a SIGTERM handler).
* `die_with_parent()`: the same request made by a Python child for itself (a worker pool's
  `initializer`; `workers.Pool` passes it).

The kernel sends the death signal when the *thread* that started the child ends, so start
children from a thread that lives as long as they do (the main thread). Linux only: elsewhere
both are no-ops and children are only stopped at a normal exit. A child started with its own
session (`start_new_session=True`, the sandbox) is its owner's to kill: bubblewrap's
`--die-with-parent` does there what `popen` does here.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
import time

_PR_SET_PDEATHSIG = 1
_children: list[subprocess.Popen] = []


def _prctl():
  """libc's prctl, resolved once in the parent (nothing is looked up after fork)."""
  if not sys.platform.startswith("linux"):
    return None
  try:
    return ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True).prctl
  except (OSError, AttributeError):
    return None


_PRCTL = _prctl()


def die_with_parent(parent_pid: int | None = None, sig: int = signal.SIGKILL) -> None:
  """Asks the kernel to send `sig` to this process when its parent dies.

  Args:
    parent_pid: the parent expected; if it already died (this process was re-parented before
      the request), this process exits now instead of running orphaned. None: `os.getppid()`.
    sig: the signal (default SIGKILL: a child cannot ignore it).
  """
  if _PRCTL is None:
    return
  expected = os.getppid() if parent_pid is None else parent_pid
  if _PRCTL(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
    raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
  if os.getppid() != expected:  # The parent died before the request: it would never fire.
    os._exit(128 + int(sig))


def popen(args, **kwargs) -> subprocess.Popen:
  """`subprocess.Popen(args, **kwargs)` whose child dies with this process (module docstring).

  `preexec_fn` and `start_new_session` are refused: the child must stay in this process group
  and the death request must be the last thing it does before `exec`.
  """
  for k in ("preexec_fn", "start_new_session", "process_group"):
    if k in kwargs:
      raise ValueError(f"processes.popen sets {k} itself; do not pass it")
  parent = os.getpid()
  proc = subprocess.Popen(args, preexec_fn=lambda: die_with_parent(parent), **kwargs)
  _children[:] = [p for p in _children if p.poll() is None] + [proc]
  return proc


def stop_children(grace_s: float = 10.0) -> None:
  """SIGTERM to every live child `popen` started, then SIGKILL to those alive after `grace_s`."""
  live = [p for p in _children if p.poll() is None]
  for p in live:
    with contextlib.suppress(ProcessLookupError):
      p.terminate()
  deadline = time.monotonic() + grace_s
  for p in live:
    try:
      p.wait(max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
      with contextlib.suppress(ProcessLookupError):
        p.kill()
      p.wait()
  _children.clear()


atexit.register(stop_children)


def start_ticks(pid: int) -> int | None:
  """When process `pid` started (clock ticks after boot, /proc/PID/stat field 22), None when no
  such process runs (a zombie counts as gone). Two records of one pid with different start
  times are two processes: the pid was reused."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      fields = f.read().rsplit(")", 1)[1].split()
  except (FileNotFoundError, ProcessLookupError, IndexError):
    return None
  return None if fields[0] == "Z" else int(fields[19])
