"""Task records (one JSON object per line) and unified diffs between file snapshots."""

import dataclasses
import difflib
import json
import typing
from pathlib import Path

from composer_jax.codetasks import project


@dataclasses.dataclass
class Task:
  """One validated re-implementation task.

  workspace / hidden_files are project.pack() blobs: the scrubbed visible workspace (with its
  single-commit .git) and the original test + runner-config files restored at grading (plus the
  project's dependency runtime, if it has one).
  F2P_direct: the FAIL_TO_PASS tests that executed the changed code (coverage map); the rest
  are collateral (they fail through an import of a deleted name). direct_partial() scores them.
  """

  id: str
  source: dict  # name, version, archive_sha256
  features: list[dict]  # kind, path, qualname
  problem_statement: str
  deletion_diff: str  # original -> broken (the gold patch is its reverse)
  gold_patch: str
  workspace: str
  hidden_files: str
  FAIL_TO_PASS: list[str]
  PASS_TO_PASS: list[str]
  provenance: dict  # seed, coverage_map_sha256, validation_runs, git_head, ...
  method: str = "deletion"  # or "bug" (generator.METHODS)
  F2P_direct: list[str] = dataclasses.field(default_factory=list)
  difficulty: dict = dataclasses.field(default_factory=dict)  # difficulty.fields()

  def to_json(self) -> str:
    return json.dumps(dataclasses.asdict(self), sort_keys=True)


def direct_partial(task: Task, outcomes: dict[str, str]) -> float:
  """Partial score on the direct FAIL_TO_PASS tests: passed fraction x PASS_TO_PASS fraction.

  Collateral tests pass as soon as the deleted name imports again, so they say little about the
  feature; tasks without the tag (older records) fall back to all of FAIL_TO_PASS.
  """
  frac = lambda ids: sum(outcomes.get(t) == "passed" for t in ids) / len(ids) if ids else 1.0
  return frac(task.F2P_direct or task.FAIL_TO_PASS) * frac(task.PASS_TO_PASS)


def write_jsonl(path: Path, tasks: list[Task]) -> None:
  """Writes atomically (temp file + rename) so a failed run leaves no partial records."""
  path = Path(path)
  tmp = path.with_name(path.name + ".partial")
  tmp.write_text("".join(t.to_json() + "\n" for t in tasks))
  tmp.replace(path)


def read_jsonl(path: Path) -> list[Task]:
  """The tasks of a file this code wrote (no checks: `load_jsonl` reads a user's file)."""
  return [Task(**json.loads(line)) for line in Path(path).read_text().splitlines() if line]


_FIELDS = {f.name: f for f in dataclasses.fields(Task)}
_TYPES = typing.get_type_hints(Task)
_WORDS = {str: "a string", dict: "a JSON object", list: "a list"}


def _record_error(record) -> str:
  """'' for a well-formed task record (JSON-decoded), else what is wrong (one line)."""
  if not isinstance(record, dict):
    return f"a task record is a JSON object, got {type(record).__name__}"
  missing = [
    n
    for n, f in _FIELDS.items()
    if n not in record
    and f.default is dataclasses.MISSING
    and f.default_factory is dataclasses.MISSING
  ]
  unknown = sorted(set(record) - set(_FIELDS))
  if missing or unknown:
    return f"task record {'lacks ' + str(missing) if missing else 'has unknown ' + str(unknown)}"
  for name, value in record.items():
    kind = typing.get_origin(_TYPES[name]) or _TYPES[name]
    item = (typing.get_args(_TYPES[name]) or (object,))[0]
    if not isinstance(value, kind) or kind is list and not all(isinstance(v, item) for v in value):
      need = _WORDS[kind] + (f" of {_WORDS[item].split(' ', 1)[1]}s" if kind is list else "")
      return f"task field {name!r} must be {need}, got {json.dumps(value)[:40]}"
  if not isinstance(record["source"].get("name"), str):
    return "task field 'source' needs a string 'name' (the project)"
  for name in ("workspace", "hidden_files"):
    if err := project.blob_error(record[name]):
      return f"task field {name!r}: {err}"
  return ""


def load_jsonl(path: Path) -> list[Task]:
  """The tasks of a user's task file, every record checked (field types, packed projects
  that unpack, ids unique) before any is used: a one-line ValueError naming the file (and
  line) for a missing file, a directory, FIFO or device (only regular files are read: a FIFO
  would block), non-UTF-8 or non-JSON text, a bad record, a repeated id (it would be run
  twice and weigh double) or a file without tasks."""
  path = Path(path)
  if not path.is_file():
    what = "does not exist" if not path.exists() else "is not a regular file"
    raise ValueError(f"tasks file {path} {what}; give a make_tasks JSONL (one task per line)")
  try:
    lines = path.read_text().splitlines()
  except UnicodeDecodeError:
    raise ValueError(f"{path} is not JSONL: not UTF-8 text") from None
  tasks, seen = [], {}
  for n, line in enumerate(lines, 1):
    if not line.strip():
      continue
    try:
      record = json.loads(line)
    except json.JSONDecodeError as e:
      raise ValueError(f"{path} line {n} is not JSON (one task object per line): {e.msg}") from None
    if err := _record_error(record):
      raise ValueError(f"{path} line {n}: {err}")
    if record["id"] in seen:
      raise ValueError(
        f"{path} line {n}: task id {record['id']!r} is also on line {seen[record['id']]}; "
        "ids must be unique (a repeated task would be run twice and weigh double)"
      )
    seen[record["id"]] = n
    tasks.append(Task(**record))
  if not tasks:
    raise ValueError(f"tasks file {path} holds no tasks (one task JSON object per line)")
  return tasks


def find(path: Path, task_id: str) -> Task:
  tasks = load_jsonl(path)
  for t in tasks:
    if t.id == task_id:
      return t
  raise ValueError(f"task id {task_id!r} not in {path}; known ids: {[t.id for t in tasks][:5]}...")


def unified_diff(old: dict[str, str | None], new: dict[str, str | None]) -> str:
  """A `git apply`-able diff from old to new text snapshots (None = file absent)."""
  chunks = []
  for rel in sorted(set(old) | set(new)):
    a, b = old.get(rel), new.get(rel)
    if a == b:
      continue
    a_lines = (a or "").splitlines(keepends=True)
    b_lines = (b or "").splitlines(keepends=True)
    lines = list(
      difflib.unified_diff(
        a_lines,
        b_lines,
        "a/" + rel if a is not None else "/dev/null",
        "b/" + rel if b is not None else "/dev/null",
      )
    )
    header = f"diff --git a/{rel} b/{rel}\n"
    if a is None:
      header += "new file mode 100644\n"
    elif b is None:
      header += "deleted file mode 100644\n"
    body = []
    for ln in lines:
      if not ln.endswith("\n"):
        ln += "\n\\ No newline at end of file\n"
      body.append(ln)
    chunks.append(header + "".join(body))
  return "".join(chunks)
