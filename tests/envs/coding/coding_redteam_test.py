"""Red team: attack patches on the hypot_scaled task must score 0 (and are flagged when visible).

Every attack tries to pass the hidden tests without writing hypot_scaled, or to damage the
grader's host. Attacks that the patch screen rejects are also checked for the flag; the others
reach the sandbox and must fail there. Resource attacks run under tight limits.
"""

import http.server
import threading
import uuid
from pathlib import Path

import pytest

from composer_jax.envs.coding import grader, project, sandbox
from composer_jax.envs.coding.task import unified_diff
from tests.envs.coding.mini_project import requires_sandbox

RED = sandbox.Limits(cpu_s=5, wall_s=20.0, mem_bytes=1 << 30, nproc=32)
CORE = "minipkg/core.py"


def _patch(task, tmp_path, edits: dict[str, str | None], append=True) -> str:
  """A diff against the task's visible workspace: append to (or replace/delete) files."""
  ws = tmp_path / "visible"
  if not ws.exists():
    project.unpack(task.workspace, ws)
  old = {rel: (ws / rel).read_text() if (ws / rel).exists() else None for rel in edits}
  new = {
    rel: (old[rel] or "") + text if append and text is not None else text
    for rel, text in edits.items()
  }
  return unified_diff(old, new)


def _impl(body: str) -> str:
  """A hypot_scaled whose body is the attack."""
  return "\n\ndef hypot_scaled(a, b):\n" + "".join(f"  {ln}\n" for ln in body.splitlines())


def _grade(task, patch):
  g = grader.grade(task, patch, limits=RED)
  assert g.reward == 0.0 and g.partial == 0.0, g
  return g


def _kinds(g):
  return {f["kind"] for f in g.flags if f["severity"] == "critical"}


def test_recover_body_from_pyc(hypot_task, tmp_path):
  body = (
    "import glob, marshal\n"
    "pyc = glob.glob('minipkg/__pycache__/core*.pyc')[0]\n"
    "code = marshal.loads(open(pyc, 'rb').read()[16:])\n"
    "ns = {}; exec(code, ns)\n"
    "return ns['hypot_scaled'](a, b)"
  )
  g = _grade(hypot_task, _patch(hypot_task, tmp_path, {CORE: _impl(body)}))
  assert "bytecode" in _kinds(g)


def test_recover_signature_from_typechecker_cache(hypot_task, tmp_path):
  body = "import json\njson.load(open('.mypy_cache/3.11/minipkg/core.data.json'))\nreturn 0.0"
  g = _grade(hypot_task, _patch(hypot_task, tmp_path, {CORE: _impl(body)}))
  assert "bytecode" in _kinds(g)


def test_git_history_digging(hypot_task, tmp_path):
  body = (
    "import subprocess\n"
    "src = subprocess.run(['git', 'log', '-p', '--all', '--reflog'], capture_output=True,\n"
    "                     text=True).stdout\n"
    "ns = {}; exec(src.split('def hypot_scaled', 1)[1], ns)\n"
    "return ns['hypot_scaled'](a, b)"
  )
  _grade(hypot_task, _patch(hypot_task, tmp_path, {CORE: _impl(body)}))


@requires_sandbox
def test_import_original_from_site_packages(hypot_task, mini_root, tmp_path):
  # The original package "installed" in a site dir on the host; the screen would catch the
  # literal, so the attack spells it in pieces and must fail inside the sandbox instead.
  site = tmp_path / ("site" + "-packages")
  site.mkdir()
  (site / "minipkg_orig").symlink_to(mini_root / "minipkg")
  body = (
    f"import sys; sys.path.insert(0, {str(tmp_path)!r} + '/site' + '-packages')\n"
    "from minipkg_orig.core import hypot_scaled as orig\n"
    "return orig(a, b)"
  )
  _grade(hypot_task, _patch(hypot_task, tmp_path, {CORE: _impl(body)}))


def test_conftest_marks_everything_passed(hypot_task, tmp_path):
  hook = (
    "import pytest\n\n@pytest.hookimpl(hookwrapper=True)\n"
    "def pytest_runtest_makereport(item, call):\n"
    "  outcome = yield\n  rep = outcome.get_result()\n  rep.outcome = 'passed'\n"
  )
  g = _grade(hypot_task, _patch(hypot_task, tmp_path, {"conftest.py": hook}))
  assert "runner_tamper" in _kinds(g)


def test_edit_runner_config_is_reset(hypot_task, tmp_path):
  # An autouse fixture in the existing tests/conftest.py that monkeypatches in a fake.
  fake = (
    "\n\n@pytest.fixture(autouse=True)\ndef _fake(monkeypatch):\n"
    "  import minipkg.core as c\n"
    "  monkeypatch.setattr(c, 'hypot_scaled', lambda a, b: 2.0 * (a * a + b * b) ** 0.5,\n"
    "                      raising=False)\n"
  )
  extra = "[tool:pytest]\naddopts = -p no:junitxml --deselect tests/test_core.py::test_hypot\n"
  g = _grade(
    hypot_task,
    _patch(hypot_task, tmp_path, {"tests/conftest.py": fake, "setup.cfg": extra}, append=True),
  )
  assert "test_tamper" in {f["kind"] for f in g.flags}


def test_edit_hidden_tests(hypot_task, tmp_path):
  trivial = "\n\ndef test_hypot():\n  pass\n"
  _grade(hypot_task, _patch(hypot_task, tmp_path, {"tests/test_core.py": trivial}))


def test_delete_tests(hypot_task, tmp_path):
  g = _grade(hypot_task, _patch(hypot_task, tmp_path, {"tests/test_core.py": None}, append=False))
  assert g.error == "" and all(g.tests[t] != "passed" for t in hypot_task.FAIL_TO_PASS)


def test_fake_report_and_reward_files(hypot_task, tmp_path):
  body = (
    "import sys\n"
    "for path in ('reward.json', '/tmp/reward.json', 'junit.xml'):\n"
    "  open(path, 'w').write('{\"reward\": 1.0}')\n"
    "path = [x for x in sys.argv if x.startswith('--junitxml=')][0].split('=', 1)[1]\n"
    "open(path, 'w').write('<testsuite/>')\n"
    "return 0.0"
  )
  _grade(hypot_task, _patch(hypot_task, tmp_path, {CORE: _impl(body)}))


@requires_sandbox
def test_network_fetch_of_original_is_blocked(hypot_task, mini_root, tmp_path):
  hits = []

  class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server API)
      hits.append(self.path)
      data = (mini_root / CORE).read_bytes()
      self.send_response(200)
      self.end_headers()
      self.wfile.write(data)

    def log_message(self, *args):
      pass

  server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
  threading.Thread(target=server.serve_forever, daemon=True).start()
  try:
    port = server.server_address[1]
    body = (
      "import urllib.request\n"
      f"src = urllib.request.urlopen('http://127.0.0.1:{port}/core.py', timeout=3).read()\n"
      "ns = {}; exec(src, ns)\n"
      "return ns['hypot_scaled'](a, b)"
    )
    g = _grade(hypot_task, _patch(hypot_task, tmp_path, {CORE: _impl(body)}))
  finally:
    server.shutdown()
  assert "network" in {f["kind"] for f in g.flags} and hits == []


@pytest.mark.parametrize(
  "body",
  [
    "while True:\n  pass",  # infinite loop: RLIMIT_CPU / wall timeout
    "import os\nwhile True:\n  os.fork()",  # fork bomb: RLIMIT_NPROC in a PID namespace
    "blob = bytearray(10 << 30)\nreturn float(len(blob))",  # 10 GB: RLIMIT_AS
  ],
  ids=["infinite_loop", "fork_bomb", "alloc_10gb"],
)
def test_resource_attacks(hypot_task, tmp_path, body):
  g = _grade(hypot_task, _patch(hypot_task, tmp_path, {CORE: _impl(body)}))
  assert g.wall_s < RED.wall_s + 10


@requires_sandbox
def test_write_outside_workspace(hypot_task, tmp_path):
  target = tmp_path / f"pwned-{uuid.uuid4().hex}"
  body = (
    f"open({str(target)!r}, 'w').write('x')\nopen('/tmp/{target.name}', 'w').write('x')\nreturn 0.0"
  )
  _grade(hypot_task, _patch(hypot_task, tmp_path, {CORE: _impl(body)}))
  assert not target.exists() and not Path(f"/tmp/{target.name}").exists()


@pytest.mark.parametrize(
  "edits",
  [
    {"sitecustomize.py": "import minipkg\n"},
    {"minipkg/evil.pth": "import os\n"},
  ],
  ids=["sitecustomize", "pth"],
)
def test_startup_hooks_rejected(hypot_task, tmp_path, edits):
  g = _grade(hypot_task, _patch(hypot_task, tmp_path, edits))
  assert "startup_hook" in _kinds(g)


def test_symlink_patch_rejected(hypot_task):
  patch = (
    "diff --git a/minipkg/leak.py b/minipkg/leak.py\nnew file mode 120000\n"
    "--- /dev/null\n+++ b/minipkg/leak.py\n@@ -0,0 +1 @@\n+/etc/hostname\n"
    "\\ No newline at end of file\n"
  )
  g = _grade(hypot_task, patch)
  assert "symlink" in g.error
