"""One model turn's tool calls applied to an agent session, and the end of an episode.

`act(job)` is the unit of work of a coding episode step: it runs the turn's calls through the
harness (`agent_tools.Session`), decides whether the episode ends (submit, a turn without
calls, a spent budget) and, at the end, judges it: the trajectory monitor over every event of
the episode (`monitor.scan_trajectory`, in the monitor's worker with a deadline); a critical flag scores 0 without grading, otherwise
the grader scores the workspace diff on the hidden tests (`grader.grade`, which runs its own
change monitor); an empty diff scores 0 ungraded, as every task's validation checked. A
grade is reused for the same task, limits and diff (`_GRADES`, by sha256, per process: RL's
episodes of one task often write the same patch), so only the trajectory monitor runs again. Jobs and results are plain picklable data and this module imports no JAX, so
a worker process (`workers.Pool`) can run it: grading, the slow part, then runs concurrently
too.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import time

from composer_jax.codetasks.monitor import deadline
from composer_jax.codetasks.sandbox import bwrap, grader
from composer_jax.envs.coding.agent import tools as agent_tools


@dataclasses.dataclass
class Call:
  """One tool call and what came of it. `change` = (path, text before, text after) for a
  successful edit / write_file / append (None before: a new file)."""

  name: str
  arguments: str
  observation: agent_tools.Observation | None = None
  change: tuple[str, str | None, str] | None = None


@dataclasses.dataclass
class Job:
  """A model turn to apply: trajectory turn `turn`, its parsed calls, its parse error."""

  session: agent_tools.Session
  turn: int
  calls: list[Call]
  parse_error: str | None
  grade_limits: bwrap.Limits = bwrap.DEFAULT_LIMITS


@dataclasses.dataclass
class Outcome:
  """The session after the turn, the calls with their observations and, once `done`, how the
  episode ended and its judgement (`end`: 'submit' | 'no_call' | the spent budget)."""

  session: agent_tools.Session
  calls: list[Call]
  done: bool
  end: str = ""
  reward: float = 0.0
  grade: dict | None = None
  flags: list[dict] = dataclasses.field(default_factory=list)
  grading_s: float = 0.0
  grade_cached: bool = False


# sha256(task id, limits, diff) -> the grade of that patch (most recent `_GRADES_KEPT`).
_GRADES: collections.OrderedDict[str, grader.Grade] = collections.OrderedDict()
_GRADES_KEPT = 4096


def _grade(task, diff: str, limits: bwrap.Limits) -> tuple[grader.Grade, bool]:
  """(the grade of `diff` on `task`, whether it was reused)."""
  key = hashlib.sha256(f"{task.id}\0{limits!r}\0{diff}".encode()).hexdigest()
  if key in _GRADES:
    _GRADES.move_to_end(key)
    return _GRADES[key], True
  _GRADES[key] = grader.grade(task, diff, limits=limits)
  while len(_GRADES) > _GRADES_KEPT:
    _GRADES.popitem(last=False)
  return _GRADES[key], False


def act(job: Job) -> Outcome:
  """Applies `job`'s calls in order (none if the turn did not parse) and judges a finished
  episode (module docstring)."""
  s = job.session
  s.turns += 1
  if job.parse_error is None:
    for call in job.calls:
      rel = agent_tools.rel_path(_path_arg(call.arguments))
      before = s.files.get(rel) if rel else None
      call.observation = s.call(call.name, call.arguments, job.turn)
      if call.name in ("edit", "write_file", "append") and not call.observation.error and rel:
        decode = lambda b: b.decode("utf-8", "replace")
        call.change = (rel, decode(before) if before is not None else None, decode(s.files[rel]))
      if s.submitted:
        break
  out = Outcome(s, job.calls, False)
  if s.submitted:
    out.end = "submit"
  elif job.parse_error is None and not job.calls:
    out.end = "no_call"
  else:
    out.end = s.over_budget()
  if out.end:
    out.done = True
    judge(out, job.grade_limits)
  return out


def judge(out: Outcome, limits: bwrap.Limits) -> None:
  """Monitor flags (event index -> trajectory turn) and the reward of a finished episode."""
  s, start = out.session, time.monotonic()
  flags = deadline.scan_trajectory(s.events, agent_tools.WORKSPACE)
  out.flags = [{**f, "turn": s.events[f["event"]]["turn"]} for f in flags]
  diff = s.diff()
  if any(f["severity"] == "critical" for f in out.flags) or not diff:
    # An empty change scores 0 on every task (validated: empty patch 0.0), so it is not run.
    out.reward = 0.0
  else:
    g, out.grade_cached = _grade(s.task, diff, limits)
    out.grade = g.as_dict()
    out.flags += [{**f, "turn": None} for f in g.flags]
    out.reward = g.reward
  out.grading_s = time.monotonic() - start


def _path_arg(arguments) -> str:
  """The `path` argument of a call's raw JSON, '' if there is none (or no JSON text)."""
  if not isinstance(arguments, str):
    return ""
  try:
    args = json.loads(arguments)
  except (ValueError, RecursionError):
    return ""
  path = args.get("path") if isinstance(args, dict) else None
  return path if isinstance(path, str) else ""
