"""A user's tasks file: every way it can be wrong is one line naming the file."""

import os
from pathlib import Path

import pytest

from composer_jax.codetasks import project, task


def _task(task_id: str) -> task.Task:
  empty = project.pack(Path("."), [])
  return task.Task(task_id, {"name": "alpha"}, [], "", "", "", empty, empty, [], [], {})


def _bad(tmp_path, kind: str) -> Path:
  path = tmp_path / "tasks.jsonl"
  if kind == "directory":
    path.mkdir()
  elif kind == "fifo":
    os.mkfifo(path)  # reading it would block forever
  elif kind == "empty":
    path.write_text("")
  elif kind == "blank_lines":
    path.write_text("\n  \n")
  elif kind == "not_jsonl":
    path.write_text("id,source\nx,y\n")
  elif kind == "duplicate_id":
    task.write_jsonl(path, [_task("a"), _task("b"), _task("a")])
  return path


@pytest.mark.parametrize(
  "kind, message",
  [
    ("missing", "tasks.jsonl does not exist; give a make_tasks JSONL"),
    ("directory", "tasks.jsonl is not a regular file"),
    ("fifo", "tasks.jsonl is not a regular file"),
    ("empty", "tasks.jsonl holds no tasks"),
    ("blank_lines", "tasks.jsonl holds no tasks"),
    ("not_jsonl", "tasks.jsonl line 1 is not JSON (one task object per line)"),
    ("duplicate_id", "tasks.jsonl line 3: task id 'a' is also on line 1; ids must be unique"),
  ],
)
def test_bad_tasks_file_is_one_line(tmp_path, kind, message):
  with pytest.raises(ValueError) as e:
    task.load_jsonl(_bad(tmp_path, kind))
  assert message in str(e.value) and "\n" not in str(e.value)


def test_good_file_loads_in_order(tmp_path):
  path = tmp_path / "tasks.jsonl"
  task.write_jsonl(path, [_task("a"), _task("b")])
  assert [t.id for t in task.load_jsonl(path)] == ["a", "b"]
