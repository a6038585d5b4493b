"""The coding commands' shared dialect (`codetasks/cli.py`): one-line flag errors with exit
status 2 on the command line (subprocesses), `--help` with defaults, progress lines with ETA."""

import re
import subprocess
import sys

import pytest

from composer_jax.codetasks import cli

MAKE_TASKS = "composer_jax.codetasks.synthesis.make_tasks"
GRADE_PATCH = "composer_jax.codetasks.sandbox.grade_patch"


def _command(module, *args):
  return subprocess.run(
    [sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=120
  )


@pytest.mark.parametrize(
  "module, args, expected",
  [
    (MAKE_TASKS, ["--micro=3", "--max_tasks=0"], "flag --max_tasks=0: 0 is not a positive integer"),
    (MAKE_TASKS, ["--micro=3", "--n_features=-2"], "flag --n_features=-2: -2 is not a positive"),
    (MAKE_TASKS, ["--micro=3", "--max_attempts=0"], "flag --max_attempts=0: 0 is not a positive"),
    (MAKE_TASKS, ["--micro=3", "--baseline_runs=-1"], "--baseline_runs=-1: -1 is not a non-neg"),
    (MAKE_TASKS, ["--micro=3", "--workers=0"], "flag --workers=0: 0 is not a positive integer"),
    (MAKE_TASKS, ["--micro=3:1"], "--micro '3:1': give START:STOP or N, with 0 <= START < STOP"),
    (MAKE_TASKS, ["--micro=3", "--backend=slurm"], "value should be one of <local|ray>"),
    (MAKE_TASKS, ["--micro=3", "--max-tasks=5"], "Unknown command line flag 'max-tasks'"),
    (MAKE_TASKS, ["--micro=3", "--source=x"], "Exactly one of (source, manifest, micro)"),
    (MAKE_TASKS, ["--micro=3", "--out=FILE"], "it is a file, not a directory"),
    (MAKE_TASKS, ["--source=x", "--out=FILE/t.jsonl"], "FILE is a file, so nothing can be written"),
    (
      GRADE_PATCH,
      ["--tasks=t.jsonl", "--patch=GOLD"],
      "Flag --id must have a value other than None",
    ),
  ],
)
def test_bad_flag_is_one_line_and_exit_2(module, args, expected, tmp_path):
  (tmp_path / "FILE").write_text("")
  if module == MAKE_TASKS and not any(a.startswith("--out") for a in args):
    args = [*args, f"--out={tmp_path / 'out'}"]
  args = [a.replace("FILE", str(tmp_path / "FILE")) for a in args]
  expected = expected.replace("FILE", str(tmp_path / "FILE"))
  p = _command(module, *args)
  lines = p.stderr.strip().splitlines()
  assert p.returncode == 2, p.stderr
  assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], p.stderr
  assert not (tmp_path / "out").exists()  # nothing made


@pytest.mark.parametrize(
  "module, defaults",
  [
    (MAKE_TASKS, {"max_attempts": "30", "n_features": "1", "backend": "local", "verify": "true"}),
    (GRADE_PATCH, {"tasks": None, "id": None}),
  ],
)
def test_help_lists_each_flag_with_its_default(module, defaults):
  out = _command(module, "--helpshort").stdout
  for name, default in defaults.items():
    block = re.search(rf"\n  --(\[no\])?{name}: (.*\n)(    .*\n)*", out)
    assert block, (name, out)
    if default is not None:
      assert f"(default: '{default}')" in block.group(0), block.group(0)


def test_progress_line_has_done_total_rate_and_eta():
  now = [100.0]
  lines = []

  class Out:
    def write(self, text):
      lines.append(text)

    def flush(self):
      pass

  progress = cli.Progress("make_tasks", 10, "projects", start=2, out=Out(), clock=lambda: now[0])
  now[0] = 140.0  # 2 of the 8 left done in 40 s: 0.05/s, 6 more take 120 s
  progress.update(4, "proj-1.0: 3 tasks")
  assert lines[0] == (
    "make_tasks: 4/10 projects, 0.05 projects/s, elapsed 40s, ETA 2.0min; proj-1.0: 3 tasks"
  )
  now[0] = 100.0 + 3 * 3600  # 2 done in 3 h: the 6 left take 9 h
  assert (
    progress.line(4) == "make_tasks: 4/10 projects, 0.000185 projects/s, elapsed 3.0h, ETA 9.0h"
  )
  assert (
    cli.Progress("x", 5, "u", out=Out(), clock=lambda: 0.0).line(0)
    == "x: 0/5 u, 0 u/s, elapsed 0s, ETA ?"
  )
