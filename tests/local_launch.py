"""Test helpers for multi-process runs (shared by tests/parallel and tests/rl): a free
coordinator port (the launcher's own), a launch of `experiments.run` through `launch/local.py`,
N processes of a test program that joins the run itself (`start_module`), and waiting for
them."""

import os
import subprocess
import sys

from launch.local import free_port
from tests.compile_options import CHEAP_XLA_FLAGS

__all__ = ["free_port", "launch", "start_module", "wait_ok"]

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


def start_module(module: str, num_processes: int, devices_per_process: int, args) -> list:
  """`python -m module *args(coordinator, i)` for i in [0, num_processes) on CPU, each process
  with `devices_per_process` devices and the cheap flags, a fresh coordinator address; stdout
  and stderr merged. For test programs that join the run themselves (`distributed.initialize`)."""
  coordinator = f"localhost:{free_port()}"
  env = dict(
    os.environ,
    JAX_PLATFORMS="cpu",
    XLA_FLAGS=f"{CHEAP_XLA_FLAGS} --xla_force_host_platform_device_count={devices_per_process}",
  )
  return [
    subprocess.Popen(
      [sys.executable, "-m", module, *map(str, args(coordinator, i))],
      cwd=REPO,
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
    )
    for i in range(num_processes)
  ]


def wait_ok(runs, timeout: float) -> list[str]:
  """Waits for every launch; each must exit 0 (the assertion shows its output's tail).
  Returns their outputs."""
  outs = []
  for run in runs:
    out, _ = run.communicate(timeout=timeout)
    assert run.returncode == 0, out[-5000:]
    outs.append(out)
  return outs
