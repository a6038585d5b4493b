"""Red team, escape: chroot, mount, namespaces, ptrace, /proc, leaked fds, devices, signals.

Each attack tries to reach the host (read the original source of the task's project, write a
marker) from inside the sandbox; the monitor is off, so the sandbox alone must stop it.
"""

import os
import socket
import threading
import uuid

import pytest

from composer_jax.codetasks.sandbox import grader
from tests.codetasks.mini_project import FAST
from tests.codetasks.sandbox.redteam.attacks import CORE, TOUCH, grade, impl, patch, steal

LIBC = "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"


def _orig(mini_root):
  return str(mini_root / CORE)


ESCAPES = {
  "chroot_breakout": (
    "import os\n"
    "try:\n  os.makedirs('/tmp/jail', exist_ok=True)\n  os.chroot('/tmp/jail')\n"
    "  for _ in range(64):\n    os.chdir('..')\n  os.chroot('.')\nexcept OSError:\n  pass\n"
  ),
  "mount_host_root": (
    LIBC + "os.makedirs('/tmp/r', exist_ok=True)\n"
    "for src, fs in ((b'/', None), (b'/dev/vda1', b'ext4'), (b'/dev/sda1', b'ext4'),"
    " (b'none', b'proc')):\n"
    "  libc.mount(src, b'/tmp/r', fs, 4096 | 16384, None)\n"
    "os.system('mount --bind / /tmp/r 2>/dev/null; mount -t tmpfs x /ws 2>/dev/null')\n"
  ),
  "remount_runtime_writable": (
    LIBC + "for p in (b'/cj/site', b'/usr', b'/ws/tests', b'/'):\n"
    "  libc.mount(None, p, None, 32 | 4096, None)\n"
    "  try:\n    open(p.decode() + '/cj-written', 'w').write('x')\n  except OSError:\n    pass\n"
  ),
  "new_namespaces_and_setns": (
    LIBC + "for flags in (0x10000000, 0x20000, 0x10000000 | 0x20000):\n  libc.unshare(flags)\n"
    "for ns in ('mnt', 'user', 'pid', 'net'):\n"
    "  try:\n    fd = os.open('/proc/1/ns/' + ns, os.O_RDONLY)\n    libc.setns(fd, 0)\n"
    "  except OSError:\n    pass\n"
    "os.system('unshare -Urm sh -c \"mount --bind / /mnt\" 2>/dev/null')\n"
    "libc.syscall(155, b'/tmp', b'/tmp/old')  # pivot_root\n"
  ),
  "ptrace_and_memory_of_others": (
    LIBC + "for pid in [int(p) for p in os.listdir('/proc') if p.isdigit()] + [os.getppid()]:\n"
    "  libc.ptrace(16, pid, None, None)  # PTRACE_ATTACH\n"
    "  try:\n    open(f'/proc/{pid}/mem', 'rb').read(1)\n  except OSError:\n    pass\n"
  ),
  "proc_paths_to_host": (
    "import os, re\n"
    "txt = ''.join(open(f).read() for f in ('/proc/self/mountinfo', '/proc/1/cmdline'))\n"
    "for path in set(re.findall(r'(/[\\w./-]+)', txt)):\n"
    "  for root in ('/proc/1/root', '/proc/self/root', '/proc/1/cwd'):\n"
    "    try:\n      os.listdir(root + path)\n    except OSError:\n      pass\n"
  ),
  "leaked_fds": (
    "import os, stat\n"
    "for fd in range(3, 1024):\n"
    "  try:\n    st = os.fstat(fd)\n  except OSError:\n    continue\n"
    "  if stat.S_ISDIR(st.st_mode):\n"
    "    for up in ('..', '../..', '../../..'):\n"
    "      try:\n        os.listdir(os.open(up, os.O_RDONLY, dir_fd=fd))\n"
    "      except OSError:\n        pass\n"
  ),
  "devices_and_privileges": (
    "import os, fcntl\n"
    "for dev in ('/dev/sda', '/dev/vda', '/dev/mem', '/dev/kmsg', '/dev/port'):\n"
    "  try:\n    open(dev, 'rb').read(1)\n  except OSError:\n    pass\n"
    "try:\n  os.mknod('/tmp/disk', 0o600 | 0o60000, os.makedev(8, 0))\nexcept OSError:\n  pass\n"
    "for f in (lambda: os.setuid(0), lambda: os.setresuid(0, 0, 0), lambda: os.setgroups([0])):\n"
    "  try:\n    f()\n  except OSError:\n    pass\n"
    "try:\n  fcntl.ioctl(0, 0x5412, b'x')  # TIOCSTI\nexcept OSError:\n  pass\n"
  ),
  "kill_everything": "import os, signal\nfor pid in (-1, 1, os.getppid()):\n  try:\n    os.kill(pid, signal.SIGKILL)\n  except OSError:\n    pass\n",
}


@pytest.mark.parametrize("name", sorted(ESCAPES))
def test_escape_then_read_the_original(hypot_task, mini_root, name):
  prelude = ESCAPES[name] + TOUCH
  body = steal(f"open({_orig(mini_root)!r}).read()")
  g = grade(hypot_task, patch(hypot_task, impl(prelude + body)))
  assert g.tests or g.error  # graded (not skipped): the sandbox ran the attack


def test_abstract_unix_socket_to_host(hypot_task, mini_root):
  """Abstract unix sockets live in the network namespace: the host's is unreachable."""
  name = f"cj-redteam-{uuid.uuid4().hex}"
  srv = socket.socket(socket.AF_UNIX)
  srv.bind("\0" + name)
  srv.listen(1)
  served = []

  def serve():
    srv.settimeout(20)
    try:
      conn, _ = srv.accept()
    except OSError:
      return
    served.append(1)
    conn.sendall((mini_root / CORE).read_bytes())
    conn.close()

  t = threading.Thread(target=serve, daemon=True)
  t.start()
  read = (
    "(lambda s: (s.connect('\\0' + "
    f"{name!r}), b''.join(iter(lambda: s.recv(65536), b'')).decode())[1])"
    "(__import__('socket').socket(__import__('socket').AF_UNIX))"
  )
  grade(hypot_task, patch(hypot_task, impl(steal(read))))
  srv.close()
  assert served == []


def test_grader_process_survives_kill_all(hypot_task):
  grade(hypot_task, patch(hypot_task, impl("import os\nos.kill(-1, 9)\nreturn 0.0")))
  assert os.getpid() > 0  # still here


def test_control_the_same_attack_form_scores_when_the_source_is_reachable(hypot_task, mini_root):
  """The attacks above are real: with the original in reach, this form scores 1.0."""
  body = steal(repr((mini_root / CORE).read_text()))
  g = grader.grade(hypot_task, patch(hypot_task, impl(body)), limits=FAST)
  assert g.reward == 1.0, g
