"""Grading a candidate patch; fails closed (any doubt scores 0).

1. The patch is screened (monitor.scan_patch); critical flags — pytest/report tampering,
   start-up hooks — score 0.
2. It is applied with `git apply` to a fresh copy of the visible workspace; a patch that does
   not apply scores 0 with the error. Symlinks anywhere afterwards score 0.
3. Start-up hooks (sitecustomize, usercustomize, *.pth), caches and compiled files are deleted,
   conftest.py files absent from the original are deleted, and every test file and runner
   config (conftest.py, pytest.ini, tox.ini, setup.cfg, pyproject.toml, .coveragerc) is reset to
   the original — which also restores the hidden FAIL_TO_PASS tests.
4. Exactly FAIL_TO_PASS + PASS_TO_PASS run in the sandbox (runner.run_suite: no network, empty
   environment, temporary home, resource limits, report outside the workspace).
Reward is 1.0 iff every listed test passed; missing, skipped, errored and failed tests count as
failures. partial = (FAIL_TO_PASS pass fraction) * (PASS_TO_PASS pass fraction).
"""

import dataclasses
import shutil
import subprocess
import tempfile
from pathlib import Path

from composer_jax.envs.coding import monitor, project, runner, sandbox, scrub
from composer_jax.envs.coding.task import Task


@dataclasses.dataclass
class Grade:
  reward: float
  partial: float
  tests: dict[str, str]  # test id -> outcome ('missing' if absent from the report)
  error: str  # '' when the run itself was sound
  flags: list[dict]
  isolation: dict
  wall_s: float

  def as_dict(self) -> dict:
    return dataclasses.asdict(self)


def _zero(error: str, flags=()) -> Grade:
  return Grade(0.0, 0.0, {}, error, list(flags), sandbox.isolation_report(), 0.0)


def apply_patch(ws: Path, patch: str) -> str:
  """Applies a unified/git diff in ws; returns '' or git's error message."""
  if not patch.strip():
    return ""
  res = subprocess.run(
    ["git", "apply", "--whitespace=nowarn", "-"],
    cwd=ws,
    input=patch,
    capture_output=True,
    text=True,
    env={"PATH": "/usr/bin:/bin", "GIT_CONFIG_NOSYSTEM": "1", "HOME": "/nonexistent"},
  )
  return "" if res.returncode == 0 else res.stderr.strip() or "git apply failed"


def prepare(task: Task, patch: str, ws: Path) -> str:
  """Materializes the graded tree at ws; returns an error ('' if fine)."""
  project.unpack(task.workspace, ws)
  if err := apply_patch(ws, patch):
    return f"patch does not apply: {err}"
  links = [p for p in ws.rglob("*") if p.is_symlink()]
  if links:
    return f"patch creates symlinks: {[str(p.relative_to(ws)) for p in links][:5]}"
  shutil.rmtree(ws / ".git", ignore_errors=True)
  scrub.scrub(ws)
  with tempfile.TemporaryDirectory() as tmp:
    originals = set(project.unpack(task.hidden_files, Path(tmp)))
    for rel in project.walk(ws, skip=frozenset()):
      hook = project.STARTUP_HOOKS.search(rel)
      stray_conftest = rel.endswith("conftest.py") and rel not in originals
      if hook or stray_conftest:
        (ws / rel).unlink()
    for rel in originals:
      (ws / rel).parent.mkdir(parents=True, exist_ok=True)
      shutil.copyfile(Path(tmp) / rel, ws / rel)
  return ""


def grade(task: Task, patch: str, *, limits: sandbox.Limits = sandbox.DEFAULT_LIMITS) -> Grade:
  flags = monitor.scan_patch(patch)
  critical = [f for f in flags if f["severity"] == "critical"]
  if critical:
    return _zero("patch rejected: " + "; ".join(f["reason"] for f in critical), flags)
  with tempfile.TemporaryDirectory(prefix="cj-grade-") as tmp:
    ws = Path(tmp) / "ws"
    if err := prepare(task, patch, ws):
      return _zero(err, flags)
    wanted = sorted(set(task.FAIL_TO_PASS) | set(task.PASS_TO_PASS))
    run = runner.run_suite(ws, wanted, limits=limits)
  if not run.ok:
    return Grade(0.0, 0.0, {}, f"test run unsound: {run.reason}", flags, run.isolation, run.wall_s)
  tests = {t: run.outcomes.get(t, "missing") for t in wanted}
  frac = lambda ids: sum(tests[t] == "passed" for t in ids) / len(ids) if ids else 0.0
  f2p, p2p = frac(task.FAIL_TO_PASS), frac(task.PASS_TO_PASS)
  reward = 1.0 if f2p == 1.0 and p2p == 1.0 else 0.0
  return Grade(reward, f2p * p2p, tests, "", flags, run.isolation, run.wall_s)
