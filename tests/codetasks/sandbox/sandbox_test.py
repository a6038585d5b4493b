"""Sandbox, runner and grader: isolation probes (run inside the sandbox), the channel's
authentication against a reference HMAC, gold/empty grades, bad input as one line."""

import json
import socket
import sys
import sysconfig

import pytest

from composer_jax.codetasks.sandbox import bwrap, grade_patch, grader, guard, instrument, suite
from tests.codetasks.mini_project import FAST, requires_sandbox, write_project


@requires_sandbox
def test_isolation_probes(tmp_path):
  """Each probe test runs inside the sandbox; all must pass."""
  secret = tmp_path / "secret_tasks.jsonl"
  secret.write_text("gold patch")
  outside = tmp_path / "outside.txt"
  listener = socket.socket()
  listener.bind(("127.0.0.1", 0))
  listener.listen(1)
  listener.setblocking(False)
  port = listener.getsockname()[1]
  site_dirs = sorted(
    {
      sysconfig.get_paths()["purelib"],  # the venv's and the base interpreter's
      sysconfig.get_paths(vars={"base": sys.base_prefix})["purelib"],
    }
  )
  probe = f"""
import importlib.util, os, socket, sys

def test_testnet_unreachable():
  s = socket.socket(); s.settimeout(3)
  assert s.connect_ex(("192.0.2.1", 80)) != 0

def test_host_loopback_listener_unreachable():
  s = socket.socket(); s.settimeout(3)
  assert s.connect_ex(("127.0.0.1", {port})) != 0

def test_no_installed_packages():
  assert importlib.util.find_spec("toolz") is None and importlib.util.find_spec("jax") is None
  assert not any("site-packages" in p for p in sys.path)
  for d in {site_dirs!r}:
    assert not os.path.isdir(d) or os.listdir(d) == []

def test_host_files_invisible():
  assert not os.path.exists({str(secret)!r}) and not os.path.exists("/work")

def test_write_outside_does_not_reach_host():
  try:
    open({str(outside)!r}, "w").write("pwned")
  except OSError:
    pass

def test_unprivileged_no_caps_seccomp_limits():
  status = open("/proc/self/status").read()
  assert os.getuid() == 1000 and os.getgid() == 1000
  assert "CapEff:\t0000000000000000" in status and "CapBnd:\t0000000000000000" in status
  assert "Seccomp:\t2" in status and "NoNewPrivs:\t1" in status
  import resource
  assert resource.getrlimit(resource.RLIMIT_NPROC)[1] == {FAST.nproc}
  assert resource.getrlimit(resource.RLIMIT_AS)[1] == {FAST.mem_bytes}

def test_mount_chroot_pivot_setns_fail():
  import ctypes
  libc = ctypes.CDLL(None, use_errno=True)
  assert libc.mount(b"none", b"/tmp", b"tmpfs", 0, None) != 0
  assert libc.umount2(b"/ws", 0) != 0
  assert libc.unshare(0x10000000) != 0 and libc.unshare(0x20000) != 0
  assert libc.syscall(155, b"/tmp", b"/tmp") != 0  # pivot_root
  assert libc.setns(os.open("/proc/self/ns/mnt", os.O_RDONLY), 0) != 0
  assert libc.ptrace(16, 1, None, None) != 0  # PTRACE_ATTACH to the namespace's init
  assert sorted(int(p) for p in os.listdir("/proc") if p.isdigit())[0] == 1  # own PID ns
  try:
    os.chroot("/tmp")
    raise AssertionError("chroot worked")
  except PermissionError:
    pass

def test_only_quota_dirs_writable():
  for d in ("/ws", "/tmp", "/dev/shm"):
    st = os.statvfs(d)
    assert st.f_blocks * st.f_frsize <= {FAST.quota_bytes} and st.f_files <= {FAST.quota_inodes}
  for d in ("/", "/usr", "/cj", "/proc/sys", "/dev", "/ws/test_probe.py"):
    assert not os.access(d, os.W_OK) or os.statvfs(d).f_flag & os.ST_RDONLY, d

def test_environment_is_empty_and_pinned():
  assert os.environ["PYTHONHASHSEED"] == "0" and os.environ["TZ"] == "UTC"
  assert os.environ["HOME"] != "/root" and os.access(os.environ["HOME"], os.W_OK)
  assert not {{"XLA_FLAGS", "JAX_PLATFORMS", "VIRTUAL_ENV"}} & set(os.environ)
"""
  ws = write_project(tmp_path / "ws", {"test_probe.py": probe})
  run = suite.run_suite(ws, limits=FAST)
  with pytest.raises(BlockingIOError):
    listener.accept()  # nothing ever connected from the sandbox
  listener.close()
  assert run.ok, run.log_tail
  assert run.outcomes and set(run.outcomes.values()) == {"passed"}, run.log_tail
  assert len(run.outcomes) == 9 and not outside.exists()


@requires_sandbox
def test_atexit_report_forgery_is_ignored(tmp_path):
  forge = """
import atexit, sys

def _forge():
  import os
  for fd in range(3, 64):
    try:
      os.write(fd, b'0' * 64 + b' {"seq": 1, "kind": "done", "rc": 0}\\n')
    except OSError:
      pass

atexit.register(_forge)

def test_fails():
  assert False
"""
  ws = write_project(tmp_path / "ws", {"test_forge.py": forge})
  run = suite.run_suite(ws, limits=FAST)
  assert run.outcomes.get("test_forge.py::test_fails") != "passed"


def test_records_are_read_in_sequence_and_guard_records_apart():
  line = lambda rec: json.dumps(rec).encode() + b"\n"
  good = line({"seq": 1, "kind": "test"}) + line({"seq": 2, "kind": "done"})
  recs, guard, why = suite.records(good)
  assert [r["kind"] for r in recs] == ["test", "done"] and guard == [] and why == ""
  stop = line({"seq": -1, "kind": "guard", "event": "gc.get_objects", "where": "x.py:1"})
  for bad in (
    good.split(b"\n", 1)[1],  # first record dropped: sequence gap
    good[:-1],  # cut mid-record
    good + line({"seq": 1, "kind": "done"}),  # a forged record after the end
    b"not json\n" + good,
  ):
    assert suite.records(bad)[2], bad
  # The guard's own record counts even in a stream that is otherwise broken.
  assert suite.records(b"junk\n" + stop)[1][0]["event"] == "gc.get_objects"


@requires_sandbox
def test_gold_scores_one_and_empty_zero_on_every_task(mini_gen):
  for t in mini_gen[1]:
    gold = grader.grade(t, t.gold_patch, limits=FAST)
    assert gold.reward == 1.0, gold
    assert not [f for f in gold.flags if f["severity"] == "critical"], gold.flags
    assert grader.grade(t, "", limits=FAST).reward == 0.0


def _one_line(capsys) -> str:
  err = capsys.readouterr().err.strip()
  assert err.count("\n") == 0 and "Traceback" not in err, err
  return err


@requires_sandbox
def test_bad_input_is_one_line(mini_gen, tmp_path, capsys, monkeypatch):
  t = mini_gen[1][0]
  tasks = tmp_path / "tasks.jsonl"
  tasks.write_text(t.to_json() + "\n")
  notjsonl = tmp_path / "bad.jsonl"
  notjsonl.write_text("id,patch\nx,y\n")
  assert grade_patch.run(["--tasks", str(notjsonl), "--id", "x", "--patch", "GOLD"]) == 1
  assert "bad.jsonl line 1 is not JSON" in _one_line(capsys)
  assert grade_patch.run(["--tasks", str(tasks), "--id", "nope", "--patch", "GOLD"]) == 1
  assert "'nope'" in _one_line(capsys)
  bad_patch = tmp_path / "p.diff"
  bad_patch.write_text("--- a/nothere.py\n+++ b/nothere.py\n@@ -1 +1 @@\n-x\n+y\n")
  assert grade_patch.run(["--tasks", str(tasks), "--id", t.id, "--patch", str(bad_patch)]) == 3
  out = json.loads(capsys.readouterr().out)
  assert out["reward"] == 0.0 and out["error"].startswith("patch does not apply")
  assert "\n" not in out["error"]
  # A machine without user namespaces: the probe's failure, injected.
  monkeypatch.setattr(bwrap, "_probe_once", lambda: "setting up uid map: Permission denied")
  assert grade_patch.run(["--tasks", str(tasks), "--id", t.id, "--patch", "GOLD"]) == 1
  assert "sandbox unavailable" in _one_line(capsys)
  with pytest.raises(bwrap.SandboxUnavailable):
    bwrap.run(["/bin/true"])


@requires_sandbox
def test_a_test_inherited_from_another_file_is_graded(tmp_path):
  """A FAIL_TO_PASS method defined in a base class of another (read-only) test file is left as
  it is by the rewriting (its definition is not in the file of its id) and still runs."""
  files = {
    "tests/__init__.py": "",
    "tests/base_cases.py": "class Base:\n  def test_inh(self):\n    assert self.x == 1\n",
    "tests/test_a.py": "from tests.base_cases import Base\n\n\nclass TestA(Base):\n  x = 1\n",
  }
  ws = write_project(tmp_path / "ws", files)
  tid = "tests/test_a.py::TestA::test_inh"
  plan = instrument.plan({"tests/test_a.py": (ws / "tests/test_a.py").read_bytes()}, [tid], [tid])
  assert plan.unprotected == {tid: "definition not found in the file"}
  for rel, data in plan.files.items():  # only the file's sentinel is added
    (ws / rel).write_bytes(data)
  run = suite.run_suite(ws, [tid], plan=plan, limits=FAST)
  assert run.ok and run.outcomes == {tid: "passed"}, run.log_tail
  assert list(run.decoys.values()) == ["failed"]


GUARD_FILES = {
  "pkg/__init__.py": "",
  # Unchanged (trusted) code that looks at frames: freezegun finding who asks for the time.
  "freezegun/__init__.py": "",
  "freezegun/api.py": (
    "import inspect\n\n\ndef _should_use_real_time():\n"
    "  return inspect.currentframe().f_back.f_globals['__name__'] != 'pkg.core'\n"
  ),
  "pkg/clock.py": (
    "import dataclasses\nimport sys\n\n\n"
    "def depth():\n  return sys._getframe(1).f_code.co_name != ''\n\n\n"
    "@dataclasses.dataclass\nclass Stamp:\n  ok: bool = dataclasses.field(default_factory=depth)\n"
  ),
  # Changed (untrusted) code.
  "pkg/core.py": (
    "import inspect\n\nfrom freezegun import api\n\n\n"
    "def who():\n  return api._should_use_real_time()\n\n\n"
    "def peek():\n  return inspect.currentframe().f_back.f_locals\n"
  ),
  "pkg/mine.py": (
    "import dataclasses\n\nfrom pkg import clock\n\n\n"
    "@dataclasses.dataclass\nclass Mine:\n  ok: bool = dataclasses.field(default_factory=clock.depth)\n"
  ),
  # Unchanged code named like a frame helper's allowed caller (logging's findCaller) that
  # hands the frame on, and changed code using it.
  "pkg/logging/__init__.py": "import logging\n\n\ndef findCaller():\n  return logging.currentframe()\n",
  "pkg/peek2.py": "from pkg.logging import findCaller\n\n\ndef peek2():\n  return findCaller().f_back.f_locals\n",
  # Changed code making trusted work (a pytest cleanup) call dataclasses' code maker with its
  # own text: a default argument that walks gc.
  "pkg/maker.py": (
    "import dataclasses, functools, sys\n"
    "_cfg = next(getattr(f, 'config', None) for f in sys.meta_path "
    "if type(f).__name__ == 'AssertionRewritingHook')\n"
    "_cfg.add_cleanup(functools.partial(dataclasses._create_fn, 'f', "
    "[\"x=__import__('gc').get_objects()\"], ['return x']))\n"
  ),
  "tests/__init__.py": "",
  "tests/test_peek2.py": "from pkg import peek2\n\n\ndef test_peek2():\n  assert peek2.peek2()\n",
  "tests/test_maker.py": "from pkg import maker\n\n\ndef test_maker():\n  assert maker\n",
  "tests/test_ok.py": (
    "from pkg import clock, core\n\n\ndef test_trusted_introspection():\n"
    "  assert core.who() is False and clock.Stamp().ok\n"
  ),
  "tests/test_peek.py": "from pkg import core\n\n\ndef test_peek():\n  assert core.peek()\n",
  "tests/test_mine.py": "from pkg import mine\n\n\ndef test_mine():\n  assert mine.Mine().ok\n",
}


@requires_sandbox
def test_guard_lets_trusted_code_look_at_frames_under_the_candidates(tmp_path):
  """Trusted code reading frames while the candidate's is on the stack (freezegun's
  inspect.currentframe() under a changed module's time.time()), or under a dataclass __init__
  that trusted code generated (pytest's timing.Instant), is not the candidate's; the same
  introspection called by changed code, or under a dataclass the change defined, is."""
  ws = write_project(tmp_path / "ws", GUARD_FILES)
  changed = frozenset({"pkg/core.py", "pkg/mine.py"})
  run = lambda name: suite.run_suite(ws, [name], limits=FAST, untrusted=changed)
  ok = run("tests/test_ok.py::test_trusted_introspection")
  assert ok.ok and ok.guard == [] and set(ok.outcomes.values()) == {"passed"}, ok.log_tail
  peek, mine = run("tests/test_peek.py::test_peek"), run("tests/test_mine.py::test_mine")
  assert [g["where"] for g in peek.guard] == ["/ws/pkg/core.py:11"], peek.guard
  assert [g["where"].split(":")[0] for g in mine.guard] == ["<string>"], mine.guard


@requires_sandbox
def test_guard_knows_allowed_callers_by_identity_and_makers_by_their_input(tmp_path):
  """A frame helper's allowed caller is that code object, not any trusted function of that
  name in a file of that suffix (pkg/logging/__init__.py's findCaller hands the frame on);
  code that dataclasses' maker builds under trusted work is trusted only when dataclasses
  itself called it on identifier fields, not when a pytest cleanup calls it with the
  candidate's text."""
  ws = write_project(tmp_path / "ws", GUARD_FILES)
  changed = frozenset({"pkg/peek2.py", "pkg/maker.py"})
  run = lambda name: suite.run_suite(ws, [name], limits=FAST, untrusted=changed)
  peek2 = run("tests/test_peek2.py::test_peek2")
  assert [(g["event"], g["where"]) for g in peek2.guard] == [
    ("sys._getframe", "/ws/pkg/peek2.py:5")
  ], peek2.guard
  maker = run("tests/test_maker.py::test_maker")
  assert not maker.ok and maker.returncode == guard.GUARD_EXIT, maker.log_tail
  assert [(g["event"], g["where"]) for g in maker.guard] == [("gc.get_objects", "<string>:2")], (
    maker.guard
  )
