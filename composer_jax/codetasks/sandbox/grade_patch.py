"""CLI: python -m composer_jax.codetasks.sandbox.grade_patch --tasks=F.jsonl --id=ID --patch=FILE

Prints the reward, partial score and per-test results as JSON. Exit status: 0 graded (any
reward), 3 if the grade carries an error (patch does not apply, unsound run, rejected patch),
2 for a bad flag (`codetasks.cli`), 1 for bad input (task file not JSONL, unknown task id,
unreadable patch) or a machine where the sandbox cannot run — each reported as one line.
"""

import json
import sys
from pathlib import Path

from absl import flags

from composer_jax.codetasks import cli, task
from composer_jax.codetasks.sandbox import bwrap, grader

GRADE_ERROR = 3  # graded, and the grade carries an error (2 is a bad flag, as for every CLI)


def define_flags(fv: flags.FlagValues) -> None:
  flags.DEFINE_string(
    "tasks", None, "task JSONL (make_tasks output)", required=True, flag_values=fv
  )
  flags.DEFINE_string("id", None, "the task's id", required=True, flag_values=fv)
  flags.DEFINE_string(
    "patch", None, "patch file, '-' for stdin, 'GOLD' for the gold", required=True, flag_values=fv
  )


def load(path: Path, task_id: str) -> task.Task:
  """The task `task_id` of a JSONL file; ValueError (one line) for a file that is not one."""
  return task.find(path, task_id)


def grade(args: flags.FlagValues) -> int:
  """The command on parsed flags: its exit status (module docstring)."""
  try:
    t = load(Path(args.tasks), args.id)
    if args.patch == "GOLD":
      patch = t.gold_patch
    else:
      patch = sys.stdin.read() if args.patch == "-" else Path(args.patch).read_text()
    g = grader.grade(t, patch)
  except (OSError, ValueError, bwrap.SandboxUnavailable) as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  print(json.dumps({"id": t.id, **g.as_dict()}, indent=1, sort_keys=True))
  return GRADE_ERROR if g.error else 0


def run(argv: list[str]) -> int:
  """The command in-process on `argv` (flags only): its exit status (`cli.run`)."""
  return cli.run(define_flags, grade, argv)


_parse_flags = cli.parse_flags(define_flags)  # app.run's parser (and tests/docs_commands_test)

if __name__ == "__main__":
  cli.start(define_flags, grade)
