"""Host side of the sandbox: runs one command with resource limits, no network, a minimal root.

Isolation (probed once per process, reported with every result):
  * "namespaces": `unshare --user --map-root-user --net --mount --pid --fork --kill-child`, then
    launcher.py builds a tmpfs root (read-only system + interpreter, hidden site-packages,
    read-write workspace/report/home only) and chroots. The network namespace holds only its
    own loopback (up, so tests may use local sockets): there is no route out, 192.0.2.1 and
    every other address fail with ENETUNREACH, and the host's 127.0.0.1 is not reachable.
    RLIMIT_NPROC is enforced even for root because the processes live in a child user
    namespace (kernel ucounts). stdout/stderr go to host files, bounded by RLIMIT_FSIZE.
  * "rlimits-only" (no user namespaces): CPU/memory/process/file-size limits and the wall
    timeout still hold; network and filesystem are NOT isolated. Refused for root, where
    RLIMIT_NPROC would not apply (fail closed rather than risk a fork bomb).
The wall timeout kills the whole process group; in namespace mode killing `unshare` also kills
the namespace's PID 1 (--kill-child) and thereby every process inside it.
"""

import dataclasses
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

_LAUNCHER = Path(__file__).with_name("launcher.py")
_SYSTEM_RO = ("/usr", "/bin", "/lib", "/lib64", "/etc")
_NS_ARGS = ("--user", "--map-root-user", "--net", "--mount", "--pid", "--fork", "--kill-child")


@dataclasses.dataclass(frozen=True)
class Limits:
  """Resource limits for one sandboxed command."""

  cpu_s: int = 120
  wall_s: float = 180.0
  mem_bytes: int = 2 << 30
  nproc: int = 64
  fsize_bytes: int = 64 << 20
  nofile: int = 1024
  tmp_bytes: int = 256 << 20

  def as_dict(self):
    return dataclasses.asdict(self)


DEFAULT_LIMITS = Limits()


@dataclasses.dataclass
class Result:
  returncode: int
  stdout: str
  stderr: str
  timed_out: bool
  wall_s: float
  isolation: dict


def real_python() -> str:
  """The base interpreter binary (a venv's python is a symlink to it)."""
  return os.path.realpath(getattr(sys, "_base_executable", sys.executable))


def _site_dirs() -> list[str]:
  """Every site-packages directory of this interpreter and its base (hidden in the sandbox)."""
  dirs = {
    sysconfig.get_paths(vars={"base": p, "platbase": p})[k]
    for p in (sys.prefix, sys.base_prefix)
    for k in ("purelib", "platlib")
  }
  return sorted(d for d in dirs if os.path.isdir(d))


@functools.cache
def isolation_mode() -> str:
  """'namespaces' if unprivileged namespaces + chroot work here, else 'rlimits-only'."""
  unshare = shutil.which("unshare")
  if unshare is None:
    return "rlimits-only"
  probe = [unshare, *_NS_ARGS, "--", "true"]
  ok = subprocess.run(probe, capture_output=True, timeout=30).returncode == 0
  return "namespaces" if ok else "rlimits-only"


def usable() -> bool:
  """Whether run() may execute untrusted code here (see the module docstring)."""
  return isolation_mode() == "namespaces" or os.geteuid() != 0


def isolation_report() -> dict:
  ns = isolation_mode() == "namespaces"
  return {
    "mode": isolation_mode(),
    "network": ns,
    "filesystem": ns,
    "pid_namespace": ns,
    "rlimits": ["cpu", "as", "nproc", "fsize", "nofile", "core"],
    "wall_timeout": True,
  }


def base_env(home: str, tmp: str) -> dict:
  """The whole environment of a sandboxed process: pinned hash seed, timezone and locale."""
  return {
    "HOME": home,
    "TMPDIR": tmp,
    "PATH": "/usr/bin:/bin",
    "PYTHONHASHSEED": "0",
    "TZ": "UTC",
    "LC_ALL": "C.UTF-8",
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONNOUSERSITE": "1",
    "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
  }


def run(
  argv: list[str], *, cwd: str, rw: list[str], ro: list[str] = (), limits: Limits = DEFAULT_LIMITS
) -> Result:
  """Runs `argv` (absolute executable) in the sandbox; `rw` dirs are the only writable places.

  A private home and /tmp are created per call. Output is captured through files so a flood of
  output cannot block the pipe.
  """
  mode = isolation_mode()
  if not usable():
    raise RuntimeError(
      "sandbox: user namespaces unavailable and running as root, so "
      "RLIMIT_NPROC cannot be enforced; refusing to run untrusted code"
    )
  scratch = Path(tempfile.mkdtemp(prefix="cj-sbx-"))
  try:
    home, tmp, root = scratch / "home", scratch / "tmp", scratch / "root"
    for d in (home, tmp, root):
      d.mkdir()
    cfg = {
      "isolate": mode == "namespaces",
      "root": str(root),
      "cwd": cwd,
      "argv": list(argv),
      "ro": [*_SYSTEM_RO, sys.base_prefix, *ro],
      "rw": [*rw, str(home), str(tmp)],
      "hide": _site_dirs(),
      "tmp_bytes": limits.tmp_bytes,
      "env": base_env(str(home), str(tmp)),
      "limits": limits.as_dict(),
    }
    cmd = [real_python(), "-I", "-S", "-B", str(_LAUNCHER), json.dumps(cfg)]
    if mode == "namespaces":
      cmd = [shutil.which("unshare"), *_NS_ARGS, "--", *cmd]
    out_path, err_path = scratch / "stdout", scratch / "stderr"
    start = time.monotonic()
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
      proc = subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env={}, start_new_session=True
      )
      timed_out = False
      try:
        proc.wait(timeout=limits.wall_s)
      except subprocess.TimeoutExpired:
        timed_out = True
      finally:
        try:
          os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
          pass
        proc.wait()
    read = lambda p: p.read_bytes()[-(1 << 20) :].decode("utf-8", "replace")
    return Result(
      proc.returncode,
      read(out_path),
      read(err_path),
      timed_out,
      time.monotonic() - start,
      isolation_report(),
    )
  finally:
    shutil.rmtree(scratch, ignore_errors=True)
