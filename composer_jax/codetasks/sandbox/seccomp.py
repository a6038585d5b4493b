"""The sandbox's seccomp filter: a BPF program built with libseccomp (pyseccomp bindings).

Default allow; the calls below fail with EPERM (ENOSYS for clone3, so glibc falls back to clone,
whose namespace flags are then checked). They are the ones a sandbox escape or a persistent
change needs — mount and the new mount API, chroot, pivot_root, setns, unshare and namespace
clones, ptrace and cross-process memory access — plus kernel attack surface no test needs
(bpf, perf, keyrings, userfaultfd, modules, kexec, reboot, swap, quotas, TIOCSTI). bwrap loads
the program (`--seccomp FD`) after setting up the sandbox, so its own mounts are unaffected.
"""

import errno
import functools
import tempfile

DENIED = (
  "mount", "umount2", "mount_setattr", "move_mount", "open_tree", "fsopen", "fsconfig",
  "fsmount", "fspick", "pivot_root", "chroot", "setns", "unshare", "ptrace",
  "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd", "bpf", "perf_event_open",
  "keyctl", "add_key", "request_key", "userfaultfd", "init_module", "finit_module",
  "delete_module", "kexec_load", "kexec_file_load", "reboot", "swapon", "swapoff", "syslog",
  "acct", "quotactl", "open_by_handle_at", "name_to_handle_at", "lookup_dcookie",
)  # fmt: skip
# CLONE_NEWUSER, NEWNS, NEWPID, NEWNET, NEWIPC, NEWUTS, NEWCGROUP, NEWTIME.
_NS_FLAGS = (0x10000000, 0x20000, 0x20000000, 0x40000000, 0x8000000, 0x4000000, 0x2000000, 0x80)
_TIOCSTI = 0x5412


@functools.cache
def program() -> bytes:
  """The compiled filter for the host architecture. Raises OSError without libseccomp."""
  try:
    import pyseccomp as sc
  except (ImportError, OSError, AttributeError) as e:  # pyseccomp dlopens libseccomp.so.2
    raise OSError(f"pyseccomp/libseccomp not loadable: {e}") from e
  f = sc.SyscallFilter(sc.ALLOW)
  for name in DENIED:
    f.add_rule(sc.ERRNO(errno.EPERM), name)
  # clone with any CLONE_NEW* flag (user, mount, pid, net, ipc, uts, cgroup namespaces).
  for flag in _NS_FLAGS:
    f.add_rule(sc.ERRNO(errno.EPERM), "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
  f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
  f.add_rule(sc.ERRNO(errno.EPERM), "ioctl", sc.Arg(1, sc.MASKED_EQ, 0xFFFFFFFF, _TIOCSTI))
  with tempfile.TemporaryFile() as tmp:
    f.export_bpf(tmp)
    tmp.seek(0)
    return tmp.read()
