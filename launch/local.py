"""Local multi-process launcher: N CPU processes with K fake devices each, on this machine.

    python launch/local.py --num_processes=2 --devices_per_process=4 -- \
        --config=experiments/configs/default.py:fsdp_ep --workdir=/tmp/mp

Everything after `--` goes to `python -m experiments.run` in every process, which also gets
`--coordinator=localhost:PORT` (a free port), `--num_processes` and `--process_id`. Each
process sees `--devices_per_process` XLA:CPU devices (XLA_FLAGS), so the run has N x K
devices, as a pod of N hosts would; cross-process collectives go over gloo (TCP). For testing
multi-host code paths (per-process data, global arrays, cooperative checkpoints) without a
cluster. Output lines are prefixed with `[process I]`. Exits with the first failing process's
exit code after stopping the others (they would otherwise wait on the dead peer); SIGINT and
SIGTERM are passed on to every process (SIGTERM makes the trainer checkpoint and stop). The
processes die with the launcher, `kill -9` included (`composer_jax.host.processes.popen`).
"""

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from composer_jax.host import processes

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
  """A TCP port nothing listens on now (the OS picks it)."""
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _pump(stream, prefix: str) -> None:
  for line in stream:
    sys.stdout.write(f"{prefix}{line}")
    sys.stdout.flush()


def launch(num_processes: int, devices_per_process: int, run_args: list[str]) -> int:
  """Runs `experiments.run run_args` in `num_processes` processes; returns the exit code
  (0, or that of the first process to fail)."""
  if num_processes < 1 or devices_per_process < 1:
    raise ValueError(
      f"--num_processes={num_processes} and --devices_per_process="
      f"{devices_per_process} must be >= 1"
    )
  env = dict(
    os.environ,
    JAX_PLATFORMS="cpu",
    XLA_FLAGS=(
      os.environ.get("XLA_FLAGS", "")
      + f" --xla_force_host_platform_device_count={devices_per_process}"
    ).strip(),
  )
  coordinator = f"localhost:{free_port()}"
  procs, pumps = [], []
  for i in range(num_processes):
    cmd = [
      sys.executable,
      "-m",
      "experiments.run",
      *run_args,
      f"--coordinator={coordinator}",
      f"--num_processes={num_processes}",
      f"--process_id={i}",
    ]
    p = processes.popen(
      cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    procs.append(p)
    pumps.append(threading.Thread(target=_pump, args=(p.stdout, f"[process {i}] "), daemon=True))
    pumps[-1].start()

  def forward(signum, _):
    for p in procs:
      if p.poll() is None:
        p.send_signal(signum)

  previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
  try:
    code = 0
    while code == 0 and any(p.poll() is None for p in procs):
      time.sleep(0.1)
      code = next((p.returncode for p in procs if p.poll() not in (None, 0)), 0)
    if code:
      failed = next(i for i, p in enumerate(procs) if p.returncode == code)
      print(
        f"launch/local.py: process {failed} exited with {code}; stopping the others",
        file=sys.stderr,
      )
      for p in procs:
        if p.poll() is None:
          p.kill()
    for p in procs:
      p.wait()
    for t in pumps:
      t.join()
    return code
  finally:
    for s, handler in previous.items():
      signal.signal(s, handler)


def main() -> None:
  parser = argparse.ArgumentParser(
    description=__doc__.split("\n\n")[0],
    usage="%(prog)s [options] -- EXPERIMENTS_RUN_ARGS",
    allow_abbrev=False,
  )
  parser.add_argument("--num_processes", type=int, default=2)
  parser.add_argument("--devices_per_process", type=int, default=4)
  args, rest = parser.parse_known_args()
  if rest[:1] == ["--"]:
    rest = rest[1:]
  try:
    sys.exit(launch(args.num_processes, args.devices_per_process, rest))
  except ValueError as e:
    sys.exit(f"error: {e}")


if __name__ == "__main__":
  main()
