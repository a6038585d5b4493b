"""The monitor with a deadline: host-side reading of a change cannot be made to run forever.

The code rules are linear in practice, but they are host-side work on input the candidate
chose, and one super-linear path (or a future rule's) would stop grading altogether. So the
grader and the agent harness never call them in their own process: `scan_change` and
`scan_trajectory` here send the input to a worker process (`python -m` this module, started
once and reused, address space capped at WORKER_MEM_BYTES) and wait at most `timeout_s`. A
worker that misses the deadline, runs out of memory or dies is killed (a fresh one starts on
the next call) and the scan returns one critical flag, `monitor_timeout` or `monitor_failed`:
what the monitor cannot read in time scores 0.
"""

import base64
import json
import os
import resource
import select
import signal
import subprocess
import sys
import threading
import time

DEADLINE_S = 30.0
WORKER_MEM_BYTES = 2 << 30


def _flag(kind: str, reason: str) -> dict:
  return {
    "kind": kind,
    "severity": "critical",
    "reason": reason,
    "path": None,
    "line": None,
    "event": None,
  }


def _b(text) -> str:
  data = text if isinstance(text, bytes) else text.encode("utf-8", "surrogateescape")
  return base64.b64encode(data).decode()


class _Worker:
  """One monitor process; `ask` sends a request and waits for its answer until a deadline."""

  def __init__(self):
    self.proc, self.lock = None, threading.Lock()

  def _start(self):
    self.proc = subprocess.Popen(
      [sys.executable, "-m", __name__],
      stdin=subprocess.PIPE,
      stdout=subprocess.PIPE,
      stderr=subprocess.DEVNULL,
      env={**os.environ, "PYTHONHASHSEED": "0"},
    )
    try:
      resource.prlimit(self.proc.pid, resource.RLIMIT_AS, (WORKER_MEM_BYTES, WORKER_MEM_BYTES))
    except (OSError, ValueError):
      pass

  def _kill(self):
    if self.proc is not None:
      try:
        os.kill(self.proc.pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
      self.proc.wait()
      for f in (self.proc.stdin, self.proc.stdout):
        f.close()
    self.proc = None

  def ask(self, request: dict, timeout_s: float) -> dict:
    with self.lock:
      if self.proc is None or self.proc.poll() is not None:
        self._kill()
        self._start()
      deadline = time.monotonic() + timeout_s
      try:
        self.proc.stdin.write(json.dumps(request).encode() + b"\n")
        self.proc.stdin.flush()
      except (BrokenPipeError, OSError):
        self._kill()
        return {"error": "the monitor worker died"}
      out, fd = bytearray(), self.proc.stdout.fileno()
      while not out.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
          self._kill()
          return {"timeout": True}
        chunk = os.read(fd, 1 << 20)
        if not chunk:
          self._kill()
          return {"error": "the monitor worker died (out of memory?)"}
        out += chunk
      try:
        return json.loads(out)
      except ValueError:
        self._kill()
        return {"error": "the monitor worker answered garbage"}


_WORKER = _Worker()


def _answer(reply: dict, timeout_s: float) -> list[dict]:
  if reply.get("timeout"):
    return [_flag("monitor_timeout", f"the monitor did not finish within {timeout_s:g} s")]
  if "flags" not in reply:
    return [_flag("monitor_failed", reply.get("error", "the monitor failed"))]
  return reply["flags"]


def scan_change(before: dict, after: dict, timeout_s: float | None = None) -> list[dict]:
  """monitor.scan_change(before, after) in the worker, with a deadline (module docstring)."""
  timeout_s = DEADLINE_S if timeout_s is None else timeout_s
  req = {
    "op": "change",
    "before": {k: _b(v) for k, v in before.items()},
    "after": {k: _b(v) for k, v in after.items()},
  }
  return _answer(_WORKER.ask(req, timeout_s), timeout_s)


def scan_trajectory(events: list, workspace: str, timeout_s: float | None = None) -> list[dict]:
  """monitor.scan_trajectory(events, workspace) in the worker, with a deadline."""
  timeout_s = DEADLINE_S if timeout_s is None else timeout_s
  req = {"op": "trajectory", "events": events, "workspace": workspace}
  return _answer(_WORKER.ask(req, timeout_s), timeout_s)


def _serve() -> None:
  from composer_jax.codetasks import monitor

  for line in sys.stdin.buffer:
    try:
      req = json.loads(line)
      if req["op"] == "change":
        decode = lambda m: {k: base64.b64decode(v) for k, v in m.items()}
        flags = monitor.scan_change(decode(req["before"]), decode(req["after"]))
      else:
        flags = monitor.scan_trajectory(req["events"], req["workspace"])
      reply = {"flags": flags}
    except (Exception, RecursionError, MemoryError) as e:
      reply = {"error": f"the monitor failed: {type(e).__name__}: {e}"[:300]}
    sys.stdout.buffer.write(json.dumps(reply, default=str).encode() + b"\n")
    sys.stdout.buffer.flush()


if __name__ == "__main__":
  _serve()
