"""Red team, persistence across grades: poison what a later grade would use (the runtime, the
harness, pycache, /tmp, home caches, site dirs), then grade the empty patch and the gold patch
on the same machine: they must still score 0 and 1."""

from composer_jax.codetasks.sandbox import grader
from tests.codetasks.mini_project import FAST
from tests.codetasks.sandbox.redteam.attacks import TOUCH, grade, impl, patch

POISON = (
  "import glob, os\n"
  "ok = 'def hypot_scaled(a, b):\\n  return 2.0 * __import__(\"math\").hypot(a, b)\\n'\n"
  "targets = glob.glob('/cj/**/*.py', recursive=True) + glob.glob('/cj/pyc/**/*.pyc', "
  "recursive=True)[:50] + ['/tmp/minipkg/core.py', os.path.expanduser('~/.cache/x.py'), "
  "'/usr/lib/python3/dist-packages/minipkg.py', '/ws/minipkg/__pycache__/core.cpython-311.pyc']\n"
  "for t in targets:\n  try:\n    os.makedirs(os.path.dirname(t), exist_ok=True)\n"
  "    open(t, 'a').write('\\n' + ok)\n  except OSError:\n    pass\n" + TOUCH + "return 0.0"
)


def test_poisoned_grade_then_empty_and_gold(hypot_task):
  grade(hypot_task, patch(hypot_task, impl(POISON)))
  assert grader.grade(hypot_task, "", limits=FAST).reward == 0.0
  assert grader.grade(hypot_task, hypot_task.gold_patch, limits=FAST).reward == 1.0


def test_bytecode_smuggled_past_the_source(hypot_task, mini_root):
  """A .pyc with the real implementation beside a stub source: Python would load it if pycs
  were read from the workspace (sys.pycache_prefix points elsewhere, read-only)."""
  import importlib.util
  import marshal

  src = (mini_root / "minipkg/core.py").read_text()
  code = marshal.dumps(compile(src, "/ws/minipkg/impl.py", "exec")).hex()
  stub = "import math\n\ndef hypot_scaled(a, b):\n  return 0.0\n"
  writer = (
    "import os, struct, importlib.util\n"
    "p = '/ws/minipkg/impl.py'\nst = os.stat(p)\n"
    "pyc = importlib.util.cache_from_source(p)\nos.makedirs(os.path.dirname(pyc), exist_ok=True)\n"
    "open(pyc, 'wb').write(importlib.util.MAGIC_NUMBER + struct.pack('<III', 0, "
    f"int(st.st_mtime), st.st_size) + bytes.fromhex({code!r}))\n"
  )
  edits = {
    "minipkg/impl.py": stub,
    "minipkg/core.py": "\n" + writer + "from minipkg.impl import hypot_scaled\n",
  }
  assert importlib.util.MAGIC_NUMBER  # the harness's interpreter is this one
  grade(hypot_task, patch(hypot_task, edits))
