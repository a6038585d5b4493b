"""What the coding commands share (`make_tasks`, `grade_patch`, `experiments.eval`): absl flags,
like the trainer, with one dialect for bad input and for long steps.

* `start`: runs a command (`app.run` with `parse_flags` as its flags parser); `run`: the same
  command called in-process (tests, drivers). A bad flag (unknown, of the wrong type,
  outside its `lower_bound`/`upper_bound`, failing a validator) exits `USAGE_ERROR` (2, as
  argparse did) with one line naming the flag, the value and what is valid; no traceback.
* `check_out`: a validator registered at definition time, so an output path that is a file
  (or a directory where a file is wanted), or lies under a file, fails at parse time, before
  any work. Ranges are absl's `lower_bound` / `upper_bound`.
* `Progress`: one line per update of a long step (tasks made, episodes played):
  `LABEL: DONE/TOTAL UNIT, RATE UNIT/s, elapsed E, ETA T`.

JAX-free (absl only), like the task system it serves.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable

from absl import app, flags

USAGE_ERROR = 2


Explain = Callable[[list[str], BaseException], str]


def _first_line(argv: list[str], e: BaseException) -> str:
  return str(e).strip().splitlines()[0]


def _parse(define, fv: flags.FlagValues, argv: list[str], explain: Explain | None):
  """Defines the flags in `fv` and parses `argv`: (the arguments left, None) or (None, the
  one-line error). `explain`: words every error, also those a flag's own parser raises (a
  `--config` file's code, an override naming a field it lacks: config flags parse their
  overrides when defined)."""
  try:
    define(fv)
    return fv(argv), None
  except flags.Error as e:
    return None, f"error: {(explain or _first_line)(argv, e)}"
  except Exception as e:
    if explain is None:
      raise
    return None, f"error: {explain(argv, e)}"


def parse_flags(
  define: Callable[[flags.FlagValues], None], explain: Explain | None = None
) -> Callable[[list[str]], list[str]]:
  """The `flags_parser` of `app.run` for a command whose flags `define(flag_values)` defines
  (flags are defined when the command runs, so several commands import side by side): a bad
  flag exits `USAGE_ERROR` with one line on stderr."""

  def parse(argv: list[str]) -> list[str]:
    rest, error = _parse(define, flags.FLAGS, argv, explain)
    if error:
      print(error, file=sys.stderr)
      sys.exit(USAGE_ERROR)
    return rest

  return parse


def run(
  define: Callable[[flags.FlagValues], None],
  work: Callable[[flags.FlagValues], int],
  argv: list[str],
  explain: Explain | None = None,
) -> int:
  """`work(flag_values)` on `argv` (the flags only, no program name) parsed into fresh flags
  `define` defines: a command called in-process (tests, a driver) with the command line's
  exit status; a bad flag is one line on stderr and `USAGE_ERROR`, as on the command line."""
  fv = flags.FlagValues()
  rest, error = _parse(define, fv, ["prog", *argv], explain)
  if error or len(rest) > 1:
    print(error or f"error: unexpected arguments {rest[1:]}", file=sys.stderr)
    return USAGE_ERROR
  return work(fv)


def start(
  define: Callable[[flags.FlagValues], None],
  work: Callable[[flags.FlagValues], int],
  explain: Explain | None = None,
) -> None:
  """Runs the command from the command line: `app.run` with `parse_flags`, then
  `work(flags.FLAGS)`; its result is the exit status."""

  def main(argv):
    if len(argv) > 1:
      raise app.UsageError(f"unexpected arguments {argv[1:]}")
    return work(flags.FLAGS)

  app.run(main, flags_parser=parse_flags(define, explain))


def out_problem(path: str | None, *, directory: bool) -> str | None:
  """Why `path` cannot be written as an output directory (`directory`) or file, else None:
  an existing file where a directory is wanted (or the reverse), or an ancestor that exists
  and is not a directory (the output would lie under a file)."""
  if not path:
    return None
  real = os.path.abspath(os.path.expanduser(path))
  if os.path.exists(real) and directory != os.path.isdir(real):
    return f"it is a {'file' if directory else 'directory'}, not a {'directory' if directory else 'file'}"
  parent = os.path.dirname(real)
  while parent and not os.path.exists(parent):
    parent = os.path.dirname(parent)
  if parent and not os.path.isdir(parent):
    return f"{parent} is a file, so nothing can be written under it"
  return None


def check_out(name: str, fv: flags.FlagValues, *, directory: bool = True) -> None:
  """Registers `out_problem` on path flag `name` (message: the flag, its value and why)."""

  def check(value):
    problem = out_problem(value, directory=directory)
    if problem:
      raise flags.ValidationError(problem)
    return True

  flags.register_validator(name, check, flag_values=fv)


def _duration(seconds: float) -> str:
  if not math.isfinite(seconds):
    return "?"
  if seconds < 90:
    return f"{seconds:.0f}s"
  if seconds < 5400:
    return f"{seconds / 60:.1f}min"
  return f"{seconds / 3600:.1f}h"


class Progress:
  """Prints `LABEL: DONE/TOTAL UNIT, RATE UNIT/s, elapsed E, ETA T[; NOTE]` per `update`.

  The rate is over this run's items only (`done - start`, e.g. after a resume skipped the
  finished ones), so the ETA is the time the remaining items take at that rate.
  """

  def __init__(self, label: str, total: int, unit: str, start: int = 0, out=None, clock=None):
    self.label, self.total, self.unit, self._start = label, total, unit, start
    self._out, self._clock = out, clock or time.monotonic
    self._t0 = self._clock()

  def line(self, done: int, note: str = "") -> str:
    elapsed = self._clock() - self._t0
    rate = (done - self._start) / elapsed if elapsed > 0 else 0.0  # 0: no rate yet
    eta = (self.total - done) / rate if rate > 0 else math.inf
    text = (
      f"{self.label}: {done}/{self.total} {self.unit}, {rate:.3g} {self.unit}/s, "
      f"elapsed {_duration(elapsed)}, ETA {_duration(eta)}"
    )
    return f"{text}; {note}" if note else text

  def update(self, done: int, note: str = "") -> None:
    print(self.line(done, note), file=self._out or sys.stderr, flush=True)
