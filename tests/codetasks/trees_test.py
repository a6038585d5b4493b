"""Bounded host-side walks and removals (composer_jax/envs/coding/trees.py) on hostile trees:
1000 directories deep, 10k entries, chmod 000, link loops, FIFOs, hard links, long names."""

import os
import tempfile

import pytest

from composer_jax.codetasks import project, trees
from composer_jax.codetasks.sandbox import bwrap


def _deep(root, depth: int) -> None:
  """`root`/a/a/.../a/f, `depth` directories down (made through fds: no long paths)."""
  os.makedirs(root)
  fd = os.open(root, os.O_RDONLY)
  for _ in range(depth):
    os.mkdir("a", dir_fd=fd)
    nxt = os.open("a", os.O_RDONLY, dir_fd=fd)
    os.close(fd)
    fd = nxt
  os.close(os.open("f.py", os.O_CREAT | os.O_WRONLY, dir_fd=fd))
  os.close(fd)


def test_a_tree_1000_deep_is_refused_in_one_line_and_removed(tmp_path):
  _deep(tmp_path / "t", 1000)
  with pytest.raises(trees.TreeError, match=r"deeper than 64 directories$") as e:
    project.walk(tmp_path / "t", skip=frozenset())
  assert "\n" not in str(e.value) and len(str(e.value)) < 200
  assert trees.remove(tmp_path / "t") == ""
  assert not (tmp_path / "t").exists()


def test_a_wide_tree_is_bounded_by_its_entry_count(tmp_path):
  for i in range(10_000):
    (tmp_path / f"{i:05d}.py").touch()
  assert len(project.walk(tmp_path, skip=frozenset())) == 10_000
  with pytest.raises(trees.TreeError, match="more than 100 entries"):
    trees.scan(tmp_path, trees.Bounds(max_entries=100))
  assert trees.remove(tmp_path) == "" and not tmp_path.exists()


def test_unreadable_and_unwritable_directories_are_removed(tmp_path):
  (tmp_path / "t/locked/inner").mkdir(parents=True)
  (tmp_path / "t/locked/inner/x").write_text("x")
  os.chmod(tmp_path / "t/locked/inner", 0)
  os.chmod(tmp_path / "t/locked", 0o500)
  if os.geteuid() != 0:  # root reads everything: this half needs an ordinary user
    with pytest.raises(trees.TreeError, match="cannot be read"):
      trees.scan(tmp_path / "t")
  assert trees.remove(tmp_path / "t") == "" and not (tmp_path / "t").exists()


def test_links_fifos_and_long_names(tmp_path):
  outside = tmp_path / "outside.txt"
  outside.write_text("host secret")
  t = tmp_path / "t"
  (t / "d").mkdir(parents=True)
  os.symlink("loop", t / "loop")
  os.symlink("..", t / "d/up")
  os.symlink(outside, t / "out")
  os.mkfifo(t / "fifo")
  os.link(outside, t / "hard")
  got = trees.scan(t)  # candidate trees: listed, never followed
  assert got.odd == ["d/up", "fifo", "loop", "out"] and list(got.files) == ["hard"]
  for name in ("fifo", "loop", "out", "d/up"):  # sources: links resolved, none left here
    os.unlink(t / name)
  with pytest.raises(trees.TreeError, match="hard link to a file outside the tree"):
    trees.scan(t, links="resolve")
  (t / ("x" * 250)).mkdir()
  with pytest.raises(trees.TreeError, match="a path over 100 bytes"):
    trees.scan(t, trees.Bounds(max_path_bytes=100))
  assert trees.remove(t) == "" and outside.read_text() == "host secret"


def test_remove_never_raises():
  assert trees.remove("/nonexistent/cj-trees-test") == ""
  with tempfile.NamedTemporaryFile(delete=False) as f:
    pass
  assert trees.remove(f.name) == "" and not os.path.exists(f.name)


def test_reap_removes_a_hostile_leftover_without_raising(tmp_path, monkeypatch):
  """The clean-up every grade runs first: a dead grader's scratch copy 1000 directories deep,
  with a chmod 000 directory and a link loop, goes, and reap returns."""
  monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
  left = tmp_path / f"cj-grade-{os.getpid()}-0-dead"  # start time 0: not this process's
  _deep(left / "ws", 1000)
  os.symlink("loop", left / "loop")
  (left / "locked").mkdir()
  os.chmod(left / "locked", 0)
  assert bwrap.reap() == [left.name]
  assert list(tmp_path.iterdir()) == []
