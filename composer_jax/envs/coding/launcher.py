"""In-sandbox launcher: builds a minimal root, applies resource limits, execs the command.

Runs as PID 1 of fresh user/mount/net/pid namespaces created by `unshare` (see sandbox.py),
or without namespaces in the rlimits-only fallback. Standard library only: it executes with
`python -I -S` before anything else is importable.

Network (namespace mode): only the namespace's own loopback, brought up here; no route out.

Filesystem view (namespace mode): a tmpfs root holding read-only binds of the system and
interpreter directories, empty read-only tmpfs over every site-packages directory (so no
installed copy of a task's package is reachable), a private tmpfs /tmp and read-write binds of
only the workspace, the report directory and a temporary home. Nothing else on the host — task
files, source caches, the venv, other users' homes — exists inside.

Usage: python -I -S launcher.py CONFIG_JSON
  CONFIG_JSON keys: isolate (bool), root (mountpoint dir), ro (paths), rw (paths), hide (paths),
  tmp_bytes, cwd, argv, env, limits {cpu_s, mem_bytes, nproc, fsize_bytes, nofile}.
"""

import ctypes
import fcntl
import json
import os
import resource
import socket
import struct
import sys

_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_BIND, _MS_PRIVATE, _MS_REC = 32, 4096, 1 << 18, 1 << 14
_MS_NOATIME, _MS_NODIRATIME, _MS_RELATIME = 1024, 2048, 1 << 21
# statvfs f_flag bits -> mount flags; a user namespace may not clear these "locked" flags on
# remount, so they are carried over.
_ST_TO_MS = (
  (1, _MS_RDONLY),
  (2, _MS_NOSUID),
  (4, _MS_NODEV),
  (8, _MS_NOEXEC),
  (1024, _MS_NOATIME),
  (2048, _MS_NODIRATIME),
  (4096, _MS_RELATIME),
)
_DEVICES = ("null", "zero", "random", "urandom")

_libc = ctypes.CDLL(None, use_errno=True)


def _mount(src, target, fstype, flags, data=None):
  args = [s.encode() if s is not None else None for s in (src, target, fstype, data)]
  if _libc.mount(args[0], args[1], args[2], ctypes.c_ulong(flags), args[3]) != 0:
    err = ctypes.get_errno()
    raise OSError(err, f"mount {src} -> {target}: {os.strerror(err)}")


def _bind(src, target, readonly):
  _mount(src, target, None, _MS_BIND)
  if readonly:
    st_flags = os.statvfs(target).f_flag
    locked = 0
    for st_bit, ms_bit in _ST_TO_MS:
      if st_flags & st_bit:
        locked |= ms_bit
    _mount(None, target, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | locked)


def _prepare(root, path, is_dir=True):
  """Creates `path` inside `root` (parents too) and returns its location."""
  inside = os.path.join(root, path.lstrip("/"))
  if is_dir:
    os.makedirs(inside, exist_ok=True)
  else:
    os.makedirs(os.path.dirname(inside), exist_ok=True)
    open(inside, "a").close()
  return inside


def _build_root(cfg):
  root = cfg["root"]
  _mount(None, "/", None, _MS_REC | _MS_PRIVATE)
  _mount("tmpfs", root, "tmpfs", _MS_NOSUID, "size=16m,mode=755")
  _mount(
    "tmpfs",
    _prepare(root, "/tmp"),
    "tmpfs",
    _MS_NOSUID | _MS_NODEV,
    f"size={cfg['tmp_bytes']},mode=1777",
  )
  for path in cfg["ro"]:
    if os.path.islink(path):  # merged-/usr symlinks such as /lib -> usr/lib
      link = os.path.join(root, path.lstrip("/"))
      os.makedirs(os.path.dirname(link), exist_ok=True)
      os.symlink(os.readlink(path), link)
    elif os.path.isdir(path):
      _bind(path, _prepare(root, path), readonly=True)
  for path in cfg["rw"]:
    _bind(path, _prepare(root, path), readonly=False)
  for path in cfg["hide"]:
    if os.path.isdir(os.path.join(root, path.lstrip("/"))):
      _mount("tmpfs", os.path.join(root, path.lstrip("/")), "tmpfs", _MS_RDONLY, "size=4k")
  for dev in _DEVICES:
    _bind(f"/dev/{dev}", _prepare(root, f"/dev/{dev}", is_dir=False), readonly=False)
  try:  # a fresh /proc of the new PID namespace; some hosts forbid it, pytest does not need it
    _mount("proc", _prepare(root, "/proc"), "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
  except OSError:
    pass
  os.chroot(root)


def _loopback_up():
  """Brings up the namespace's own loopback (tests may use local sockets; no route leaves)."""
  with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
    ifr = fcntl.ioctl(s, 0x8913, struct.pack("16sH", b"lo", 0))  # SIOCGIFFLAGS
    flags = struct.unpack("16sH", ifr[:18])[1]
    fcntl.ioctl(s, 0x8914, struct.pack("16sH", b"lo", flags | 1))  # SIOCSIFFLAGS, IFF_UP


def _set_limits(limits):
  pairs = (
    (resource.RLIMIT_CPU, limits["cpu_s"], limits["cpu_s"] + 5),
    (resource.RLIMIT_AS, limits["mem_bytes"], limits["mem_bytes"]),
    (resource.RLIMIT_NPROC, limits["nproc"], limits["nproc"]),
    (resource.RLIMIT_FSIZE, limits["fsize_bytes"], limits["fsize_bytes"]),
    (resource.RLIMIT_NOFILE, limits["nofile"], limits["nofile"]),
    (resource.RLIMIT_CORE, 0, 0),
  )
  for which, soft, hard in pairs:
    resource.setrlimit(which, (soft, hard))


def main(argv):
  cfg = json.loads(argv[1])
  if cfg["isolate"]:
    _loopback_up()
    _build_root(cfg)
  os.chdir(cfg["cwd"])
  _set_limits(cfg["limits"])
  os.execve(cfg["argv"][0], cfg["argv"], cfg["env"])


if __name__ == "__main__":
  main(sys.argv)
