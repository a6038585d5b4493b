"""Red team, issue 41 class 3: candidate output that would break the host side of grading.

A patch that adds a file 1000 directories deep, or a scratch copy a killed grader left behind
full of such trees (chmod 000 directories, link loops), must fail one grade closed with a
one-line reason and never reach another: every host-side walk, copy and removal is bounded
and iterative (composer_jax/envs/coding/trees.py), and the clean-up every grade runs first is
inside the grade's error handling. The folder's conftest checks that no scratch is left.
"""

import os
import tempfile

from composer_jax.codetasks.sandbox import grader
from tests.codetasks.mini_project import FAST
from tests.codetasks.sandbox.redteam.attacks import grade, impl, patch

DEEP = "/".join(["d"] * 1000) + "/deep.py"


def test_a_file_1000_directories_deep_fails_its_grade_in_one_line(hypot_task):
  edits = {**impl("return 0.0"), DEEP: "X = 1\n"}
  g = grade(hypot_task, patch(hypot_task, edits))
  assert g.error.startswith("the patched tree is not graded: "), g.error
  assert "deeper than 64 directories" in g.error and "\n" not in g.error
  gold = grader.grade(hypot_task, hypot_task.gold_patch, limits=FAST)  # the next grade
  assert gold.reward == 1.0, gold


def test_a_hostile_leftover_scratch_never_reaches_a_later_grade(hypot_task):
  """A dead grader's scratch copy (start time 0: no live process) holding a tree 1000 deep, a
  chmod 000 directory and a link loop: the next grade removes it and scores gold 1.0."""
  left = os.path.join(tempfile.gettempdir(), f"cj-grade-{os.getpid()}-0-left")
  os.makedirs(left)
  fd = os.open(left, os.O_RDONLY)
  for _ in range(1000):
    os.mkdir("d", dir_fd=fd)
    nxt = os.open("d", os.O_RDONLY, dir_fd=fd)
    os.close(fd)
    fd = nxt
  os.close(fd)
  os.symlink("loop", os.path.join(left, "loop"))
  os.mkdir(os.path.join(left, "locked"), 0)
  gold = grader.grade(hypot_task, hypot_task.gold_patch, limits=FAST)
  assert gold.reward == 1.0, gold
  assert not os.path.exists(left)
