"""The stage processes of `experiments.coding.learn`: each stage is a subprocess that dies with
the run, with its log and wall time in the run's output directory.

    with Stages(out, planned=N) as stages:   # takes OUT's lock: one live run per OUT
      stages.run(cmd, log, label)            # raises StageFailed with a one-line message

* One live run per output directory: `train.workdir_lock` on OUT (a second run while the first
  lives, or while any of its stages lives, is refused in one line naming the holder's pid; a
  run whose process died leaves no lock behind, so a re-run resumes).
* Stage processes die with the run: started by `host.processes.popen` (the parent's process
  group, `PR_SET_PDEATHSIG`), so SIGTERM to the run, `kill -9` of it, or its exit stops
  every stage; on SIGTERM the stages get SIGTERM first (they save a checkpoint) and the run
  exits 143.
* Progress: the stage lines that match `progress` are echoed with the minutes since start,
  and after each stage one ETA line from the mean wall time of the stages done so far
  (`planned` stages, `parallel` at once). Wall times go to OUT/stage_times.jsonl.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

from composer_jax.host import files, processes
from composer_jax.train import workdir_lock

_T0 = time.monotonic()


def say(text: str) -> None:
  print(f"[{(time.monotonic() - _T0) / 60:5.1f} min] {text}", flush=True)


class StageFailed(RuntimeError):
  """A stage exited non-zero (the message names it and its log)."""


class Stages:
  """Runs stage commands under OUT (module docstring)."""

  def __init__(self, out: Path, planned: int, parallel: int = 1, env: dict | None = None):
    self.out, self.planned, self.parallel = out, planned, max(1, parallel)
    self._env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    self._done: list[float] = []
    self._mutex = threading.Lock()
    self._lock = None
    self._stopping = threading.Event()  # SIGTERM came: no stage starts or counts as done

  def __enter__(self):
    self._lock = workdir_lock.acquire(str(self.out))  # one line if a live run holds OUT
    signal.signal(signal.SIGTERM, self._on_sigterm)
    return self

  def __exit__(self, *exc):
    processes.stop_children()
    workdir_lock.release(self._lock)

  def _on_sigterm(self, signum, frame):
    say("SIGTERM: stopping the stages (they save a checkpoint first)")
    self._stopping.set()
    processes.stop_children()
    sys.exit(128 + signum)

  def run(self, cmd: list[str], log: Path, label: str, progress: str = "] step ") -> None:
    """Runs `cmd` with stdout + stderr appended to `log`; echoes its lines containing
    `progress` (and `error` lines); raises StageFailed on a non-zero exit, and after SIGTERM
    (a stage that saved and exited 0 on it is not done: the re-run resumes it)."""
    if self._stopping.is_set():
      raise StageFailed(f"{label}: not started (SIGTERM)")
    say(f"{label}: started (log {log})")
    start = time.monotonic()
    fd = files.open_fd(str(log), os.O_WRONLY | os.O_CREAT | os.O_APPEND)  # never via a link
    with os.fdopen(fd, "a", buffering=1) as sink:  # line-buffered: the log is live
      proc = processes.popen(
        cmd,
        stdout=processes.subprocess.PIPE,
        stderr=processes.subprocess.STDOUT,
        text=True,
        env=self._env,
        cwd=Path(__file__).resolve().parents[2],
      )
      for line in proc.stdout:
        sink.write(line)
        if progress in line or line.startswith("error"):
          say(f"{label}: {line.split('] ', 1)[-1].strip()[:110]}")
    if proc.wait() or self._stopping.is_set():
      raise StageFailed(f"{label} failed (exit {proc.returncode}); see {log}")
    wall = time.monotonic() - start
    with self._mutex:
      self._done.append(wall)
      with files.open_append(str(self.out / "stage_times.jsonl")) as f:
        f.write((json.dumps({"stage": label, "wall_s": round(wall, 1)}) + "\n").encode())
      left = max(0, self.planned - len(self._done))
      eta = sum(self._done) / len(self._done) * left / self.parallel / 60
      say(f"ETA {eta:.0f} min ({len(self._done)} of ~{self.planned} stages done)")
