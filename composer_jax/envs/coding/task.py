"""Task records (one JSON object per line) and unified diffs between file snapshots."""

import dataclasses
import difflib
import json
from pathlib import Path


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
  return [Task(**json.loads(line)) for line in Path(path).read_text().splitlines() if line]


def load_jsonl(path: Path) -> list[Task]:
  """`read_jsonl`, with a one-line ValueError for a file that is not a task file."""
  try:
    return read_jsonl(path)
  except json.JSONDecodeError as e:
    raise ValueError(f"{path} is not JSONL (one task object per line): {e.msg}") from None
  except TypeError as e:
    raise ValueError(f"{path}: a line is not a task record ({e})") from None
  except UnicodeDecodeError:
    raise ValueError(f"{path} is not JSONL: not UTF-8 text") from None


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
