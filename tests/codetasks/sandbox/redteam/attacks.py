"""Shared pieces of the red-team suite: attack patches on the mini project's hypot_scaled task.

Every attack tries to score without implementing hypot_scaled, or to reach the grader's host.
Unless an attack is one only the monitor can stop, it is graded with the monitor switched off
(`grade(..., monitor=False)`), so its zero must come from the sandbox, the workspace reset, the
runner configuration or the harness. The folder's conftest asserts after every attack that
nothing was written outside the sandbox (marker paths, the grader's temp root left empty).
"""

import contextlib
import functools
import tempfile
from pathlib import Path
from unittest import mock

from composer_jax.codetasks import project
from composer_jax.codetasks.sandbox import bwrap, grader
from composer_jax.codetasks.task import unified_diff

# Attacks must score 0 whatever happens, so tight limits cannot make them flaky; runs that must
# succeed (the control, gold after poisoning) use the mini project's FAST limits.
RED = bwrap.Limits(
  cpu_s=2, wall_s=5.0, mem_bytes=1 << 30, nproc=32, quota_bytes=64 << 20, quota_inodes=4096
)
CORE = "minipkg/core.py"
# Host paths an escaping attack would write; the conftest asserts none of them appears.
MARKERS = (
  "/tmp/cj-redteam-pwned",
  str(Path.home() / "cj-redteam-pwned"),
  str(Path(project.__file__).parent / "cj_redteam_pwned.py"),
)
TOUCH = "".join(
  f"try:\n  open({m!r}, 'w').write('pwned')\nexcept OSError:\n  pass\n" for m in MARKERS
)


@functools.cache
def _visible(blob: str) -> dict[str, str]:
  with tempfile.TemporaryDirectory() as tmp:
    names = project.unpack(blob, Path(tmp))
    return {n: (Path(tmp) / n).read_text() for n in names if not n.startswith(".git/")}


def patch(task, edits: dict[str, str | None], append=True) -> str:
  """A diff against the task's visible workspace: append to (or replace/delete) files."""
  files = _visible(task.workspace)
  old = {rel: files.get(rel) for rel in edits}
  new = {
    rel: (old[rel] or "") + text if append and text is not None else text
    for rel, text in edits.items()
  }
  return unified_diff(old, new)


def impl(body: str, prelude: str = "") -> dict[str, str]:
  """Edits appending a hypot_scaled whose body is the attack (and module-level `prelude`)."""
  code = (
    prelude + "\n\ndef hypot_scaled(a, b):\n" + "".join(f"  {ln}\n" for ln in body.splitlines())
  )
  return {CORE: code}


def steal(read: str) -> str:
  """A body that evaluates `read` (an expression giving the original core.py source) and
  answers with the original hypot_scaled; 0.0 when the read fails."""
  return (
    f"try:\n  src = {read}\nexcept Exception:\n  return 0.0\n"
    "ns = {}\nexec(src, ns)\nreturn ns['hypot_scaled'](a, b)"
  )


def grade(task, diff: str, *, monitor: bool = False, limits=RED) -> grader.Grade:
  """Grades an attack: it must score 0, with some hidden test not passed or an error."""
  off = mock.patch.object(grader.deadline, "scan_change", lambda before, after: [])
  with off if not monitor else contextlib.nullcontext():
    g = grader.grade(task, diff, limits=limits)
  assert g.reward == 0.0, g
  assert not all(g.tests.get(t) == "passed" for t in task.FAIL_TO_PASS) or g.error, g
  return g


def critical(g: grader.Grade) -> set[str]:
  return {f["kind"] for f in g.flags if f["severity"] == "critical"}
