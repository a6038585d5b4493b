"""Multi-process JAX: `initialize(settings)` joins this process to a multi-host run.

It must run before anything touches a JAX backend (`experiments.run` calls it first). Where
the process layout comes from, first match wins (`resolve`):

1. Explicit settings (`experiments.run` flags `--coordinator=HOST:PORT --num_processes=N
   --process_id=I`, all three; `launch/local.py` passes them). `--num_processes=1` alone
   forces a single process, skipping detection.
2. SLURM: inside an `srun` step with SLURM_NTASKS > 1. JAX reads the coordinator (first node
   of SLURM_STEP_NODELIST, a port derived from SLURM_JOB_ID), SLURM_NTASKS and SLURM_PROCID
   itself, and gives each process the GPU numbered SLURM_LOCALID (one process per GPU). With
   one task per node, every GPU of the node is given to its process instead
   (SLURM_GPUS_ON_NODE of them), unless `--local_device_ids` says otherwise.
3. TPU VM (libtpu installed and a Google PCI device present): `jax.distributed.initialize()`
   with no arguments; JAX asks the VM metadata server for the worker list and its own index
   (`launch/tpu_pod.sh` starts one process per worker).
4. Otherwise a single process: nothing to do.

Start-up has a deadline, `Settings.timeout_s` (`--init_timeout_s`, default 300 s): a process
whose peers or coordinator never come stops with one line saying so, naming the deadline, and
exit code 1 (JAX itself would abort with a C++ stack trace, or wait out its own timeout). The
coordinator address is checked before JAX is called: a host that does not resolve, or (on
process 0, which serves it) a port another program holds, is one line at once.

`--local_device_ids=0,1` limits the accelerators a process uses (JAX sets the visible
CUDA/ROCm devices); it only applies to multi-process runs.

A multi-process run also puts orbax's checkpoint barriers on JAX's coordination service (a
wait with orbax's deadline, 5 min, that builds no communicator) instead of orbax's default, a
device all-gather: on XLA:CPU that all-gather builds a gloo communicator for each pair of
same-index devices, all at once, each connected under a fixed 30 s deadline inside XLA. A CI
run of 2026-12-05 failed there (`Gloo context initialization failed: DEADLINE_EXCEEDED` in
`CheckpointManager` creation); a rank merely arriving 40 s late does not fail, so what
triggered it is not known.
"""

from __future__ import annotations

import dataclasses
import errno
import glob
import importlib.util
import os
import socket
import sys
import threading
from collections.abc import Mapping, Sequence

import jax
import orbax.checkpoint  # noqa: F401  (defines the absl flag below)
from absl import flags

_SLURM_STEP_VARS = (
  "SLURM_JOB_ID",
  "SLURM_STEP_NODELIST",
  "SLURM_NTASKS",
  "SLURM_PROCID",
  "SLURM_LOCALID",
)  # What JAX's SLURM detection reads: set inside `srun`.
_GOOGLE_PCI_VENDOR = "0x1ae0"
_PCI_DEVICES = "/sys/bus/pci/devices"
_ORBAX_BARRIER_FLAG = "experimental_orbax_use_distributed_barrier"


@dataclasses.dataclass(frozen=True)
class Settings:
  """The `experiments.run` flags; None = not given."""

  coordinator: str | None = None
  num_processes: int | None = None
  process_id: int | None = None
  local_device_ids: Sequence[int] | None = None
  timeout_s: float = 300.0  # start-up deadline: every process joined, or one line and exit 1


# JAX's own start-up timeout is left this much later than ours, so ours is the one that fires.
_JAX_TIMEOUT_MARGIN_S = 60


@dataclasses.dataclass(frozen=True)
class Plan:
  """What `initialize` does.

  Attributes:
    source: 'explicit', 'slurm', 'tpu' or 'single' (no-op).
    kwargs: arguments of `jax.distributed.initialize`; those left out JAX detects itself.
  """

  source: str
  kwargs: dict


def _env_int(environ: Mapping[str, str], name: str) -> int:
  try:
    return int(environ[name])
  except ValueError:
    raise ValueError(f"SLURM environment {name}={environ[name]!r} is not an integer") from None


def _check_coordinator(address: str) -> None:
  host, sep, port = address.rpartition(":")
  if not (sep and host and port.isdigit() and 0 < int(port) < 65536):
    raise ValueError(
      f"--coordinator={address!r} must be HOST:PORT with PORT in [1, 65535], "
      "e.g. 10.0.0.1:1234 (the address of process 0)"
    )


def parse_device_ids(text: str | None) -> tuple[int, ...] | None:
  """`'0,1,2'` -> `(0, 1, 2)`; None -> None."""
  if text is None:
    return None
  try:
    return tuple(int(i) for i in text.split(","))
  except ValueError:
    raise ValueError(
      f"--local_device_ids={text!r} must be comma-separated device numbers, e.g. 0,1,2,3"
    ) from None


def _check_ids(ids: Sequence[int]) -> None:
  if not ids or any(i < 0 for i in ids) or len(set(ids)) != len(ids):
    raise ValueError(
      f"--local_device_ids={','.join(map(str, ids))} must be distinct "
      "non-negative device numbers, e.g. 0,1,2,3"
    )


def _explicit(s: Settings) -> Plan:
  given = {
    "--coordinator": s.coordinator,
    "--num_processes": s.num_processes,
    "--process_id": s.process_id,
  }
  missing = [k for k, v in given.items() if v is None]
  if missing:
    shown = ", ".join(f"{k}={v}" for k, v in given.items() if v is not None)
    raise ValueError(
      f"{' and '.join(missing)} missing (given: {shown}): a multi-process run "
      "needs all of --coordinator=HOST:PORT, --num_processes and --process_id, "
      "or none of them under SLURM (srun) or on a TPU VM"
    )
  _check_coordinator(s.coordinator)
  if not 0 <= s.process_id < s.num_processes:
    raise ValueError(
      f"--process_id={s.process_id} must be in [0, --num_processes={s.num_processes})"
    )
  # 'deactivate': exactly what was asked, even inside a SLURM job.
  return Plan(
    "explicit",
    dict(
      coordinator_address=s.coordinator,
      num_processes=s.num_processes,
      process_id=s.process_id,
      local_device_ids=s.local_device_ids,
      cluster_detection_method="deactivate",
    ),
  )


def _slurm(s: Settings, environ: Mapping[str, str]) -> Plan:
  ntasks, procid = _env_int(environ, "SLURM_NTASKS"), _env_int(environ, "SLURM_PROCID")
  if not 0 <= procid < ntasks:
    raise ValueError(
      f"SLURM environment SLURM_PROCID={procid} must be in [0, SLURM_NTASKS={ntasks})"
    )
  ids = s.local_device_ids
  per_node = (
    "SLURM_STEP_NUM_NODES" in environ and _env_int(environ, "SLURM_STEP_NUM_NODES") == ntasks
  )
  if ids is None and per_node and "SLURM_GPUS_ON_NODE" in environ:
    # JAX would give the process only GPU SLURM_LOCALID = 0; it drives the whole node.
    ids = tuple(range(_env_int(environ, "SLURM_GPUS_ON_NODE")))
  return Plan("slurm", {} if ids is None else {"local_device_ids": ids})


def on_tpu_vm(pci_devices: str = _PCI_DEVICES) -> bool:
  """libtpu is installed and the PCI bus has a Google device (TPU chips are Google's)."""
  if importlib.util.find_spec("libtpu") is None:
    return False
  for path in glob.glob(os.path.join(pci_devices, "*", "vendor")):
    with open(path) as f:
      if f.read().strip() == _GOOGLE_PCI_VENDOR:
        return True
  return False


def resolve(
  settings: Settings, environ: Mapping[str, str] | None = None, tpu_vm: bool | None = None
) -> Plan:
  """The plan for `settings` in `environ` (default `os.environ`); see the module docstring.

  Args:
    settings: the explicit flags.
    environ: environment variables (SLURM_* are read).
    tpu_vm: whether this is a TPU VM; None = `on_tpu_vm()`.

  Raises:
    ValueError: inconsistent or partial settings, or a malformed SLURM environment.
  """
  environ = os.environ if environ is None else environ
  s = settings
  if s.num_processes is not None and s.num_processes < 1:
    raise ValueError(f"--num_processes={s.num_processes} must be >= 1")
  if s.local_device_ids is not None:
    _check_ids(s.local_device_ids)
  if s.num_processes == 1:
    if s.process_id not in (None, 0):
      raise ValueError(f"--process_id={s.process_id} must be 0 with --num_processes=1")
    plan = Plan("single", {})
  elif (s.coordinator, s.num_processes, s.process_id) != (None, None, None):
    plan = _explicit(s)
  elif all(v in environ for v in _SLURM_STEP_VARS) and _env_int(environ, "SLURM_NTASKS") > 1:
    plan = _slurm(s, environ)
  elif on_tpu_vm() if tpu_vm is None else tpu_vm:
    plan = Plan(
      "tpu", {} if s.local_device_ids is None else {"local_device_ids": s.local_device_ids}
    )
  else:
    plan = Plan("single", {})
  if plan.source == "single" and s.local_device_ids is not None:
    raise ValueError(
      f"--local_device_ids={','.join(map(str, s.local_device_ids))} applies to "
      "multi-process runs only; this is a single process"
    )
  return plan


def check_coordinator_reachable(address: str, process_id: int) -> None:
  """One-line ValueError, before JAX is called, for a coordinator `HOST:PORT` whose host does
  not resolve, or whose port another program holds on process 0 (which serves it: JAX would
  fail to start its RPC server, or crash)."""
  host, _, port = address.rpartition(":")
  host = host.strip("[]")
  try:
    socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
  except (socket.gaierror, UnicodeError) as e:
    raise ValueError(
      f"--coordinator={address}: host {host!r} does not resolve ({e}); give the address "
      "of process 0 that every process can resolve"
    ) from None
  if process_id != 0:
    return
  probe = socket.socket(socket.AF_INET6 if socket.has_ipv6 else socket.AF_INET)
  try:
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is no holder
    probe.bind(("::" if socket.has_ipv6 else "0.0.0.0", int(port)))
  except OSError as e:
    if e.errno != errno.EADDRINUSE:
      raise
    raise ValueError(
      f"--coordinator={address}: port {port} is in use by another program on this host "
      "(process 0 serves the coordinator there); pick a free port for every process"
    ) from None
  finally:
    probe.close()


def _give_up(plan: Plan, timeout_s: float) -> None:
  """Start-up overran its deadline: one line, then exit (the JAX call cannot be interrupted)."""
  kw = plan.kwargs
  who = (
    f"process {kw['process_id']} of {kw['num_processes']} (coordinator {kw['coordinator_address']})"
    if plan.source == "explicit"
    else f"this process ({plan.source} start-up)"
  )
  sys.stderr.write(
    f"error: multi-process start-up: {who} did not meet all its peers within {timeout_s:g} s "
    f"(--init_timeout_s={timeout_s:g}): start every process with the same --coordinator and "
    "--num_processes, check process 0 is running and reachable, or raise --init_timeout_s\n"
  )
  sys.stderr.flush()
  os._exit(1)


def initialize(settings: Settings = Settings()) -> Plan:
  """Joins the multi-process run `resolve(settings)` describes (no-op for one process).

  Must come before any JAX computation or device query. Returns the plan it followed.
  Raises ValueError for a coordinator that cannot work (`check_coordinator_reachable`); a
  start-up that overruns `settings.timeout_s` writes one line to stderr and exits with 1.
  """
  if not settings.timeout_s > 0:
    raise ValueError(f"--init_timeout_s={settings.timeout_s} must be > 0 (seconds)")
  plan = resolve(settings)
  if plan.source != "single":
    if plan.source == "explicit":
      check_coordinator_reachable(plan.kwargs["coordinator_address"], plan.kwargs["process_id"])
    # Cross-process collectives on XLA:CPU (the local launcher, CPU clusters) go through
    # gloo over TCP; it is the default in recent JAX, set here for older versions.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    watchdog = threading.Timer(settings.timeout_s, _give_up, (plan, settings.timeout_s))
    watchdog.daemon = True
    watchdog.start()
    try:
      jax.distributed.initialize(
        **plan.kwargs,
        initialization_timeout=int(settings.timeout_s) + _JAX_TIMEOUT_MARGIN_S,
      )
    finally:
      watchdog.cancel()
    barrier = flags.FLAGS[_ORBAX_BARRIER_FLAG]
    if not barrier.present:  # Given on the command line: as given.
      barrier.parse("true")  # Also read when absl has not parsed argv (a notebook, a script).
  return plan
