"""CLI: python -m composer_jax.codetasks.sandbox.grade_patch --tasks F.jsonl --id ID --patch FILE

Prints the reward, partial score and per-test results as JSON. Exit status: 0 graded (any
reward), 2 if the grade carries an error (patch does not apply, unsound run, rejected patch),
1 for bad input (task file not JSONL, unknown task id, unreadable patch) or a machine where the
sandbox cannot run — each reported as one line.
"""

import argparse
import json
import sys
from pathlib import Path

from composer_jax.codetasks import task
from composer_jax.codetasks.sandbox import bwrap, grader


def load(path: Path, task_id: str) -> task.Task:
  """The task `task_id` of a JSONL file; ValueError (one line) for a file that is not one."""
  return task.find(path, task_id)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--tasks", required=True, type=Path)
  p.add_argument("--id", required=True)
  p.add_argument("--patch", required=True, help="patch file, '-' for stdin, 'GOLD' for the gold")
  args = p.parse_args(argv)
  try:
    t = load(args.tasks, args.id)
    if args.patch == "GOLD":
      patch = t.gold_patch
    else:
      patch = sys.stdin.read() if args.patch == "-" else Path(args.patch).read_text()
    g = grader.grade(t, patch)
  except (OSError, ValueError, bwrap.SandboxUnavailable) as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  print(json.dumps({"id": t.id, **g.as_dict()}, indent=1, sort_keys=True))
  return 2 if g.error else 0


if __name__ == "__main__":
  sys.exit(main())
