"""Test helpers for multi-process runs through `launch/local.py` (shared by tests/parallel and
tests/rl): a free coordinator port (the launcher's own), a launch, and waiting for several
launches."""

import os
import subprocess
import sys

from launch.local import free_port
from tests.compile_options import CHEAP_XLA_FLAGS

__all__ = ["free_port", "launch", "wait_ok"]

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def launch(num_processes: int, devices_per_process: int, args, **kw) -> subprocess.Popen:
  """`launch/local.py` with `args` for `experiments.run`, stdout and stderr merged."""
  # Not pytest's 8 devices (the launcher sets them); the cheap flags, the same for every run
  # compared.
  env = dict(os.environ, XLA_FLAGS=CHEAP_XLA_FLAGS)
  return subprocess.Popen(
    [
      sys.executable,
      "launch/local.py",
      f"--num_processes={num_processes}",
      f"--devices_per_process={devices_per_process}",
      "--",
      *args,
    ],
    cwd=REPO,
    env=env,
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
    **kw,
  )


def wait_ok(runs, timeout: float) -> list[str]:
  """Waits for every launch; each must exit 0 (the assertion shows its output's tail).
  Returns their outputs."""
  outs = []
  for run in runs:
    out, _ = run.communicate(timeout=timeout)
    assert run.returncode == 0, out[-5000:]
    outs.append(out)
  return outs
