"""`host.files`: nothing is written through a link; output paths checked at start."""

import os

import pytest

from composer_jax.host import files


def test_create_new_refuses_links_and_existing_names(tmp_path):
  target = tmp_path / "target"
  target.write_text("kept")
  os.symlink(target, tmp_path / "link")
  os.symlink(tmp_path / "nowhere", tmp_path / "dangling")
  for name in ("link", "dangling"):
    with pytest.raises(files.LinkRefusedError, match=f"{name} is a symbolic link"):
      files.create_new(str(tmp_path / name))
  assert target.read_text() == "kept" and not (tmp_path / "nowhere").exists()
  with pytest.raises(FileExistsError):
    files.create_new(str(target))
  os.close(files.create_new(str(tmp_path / "fresh")))
  assert (tmp_path / "fresh").exists()


def test_write_append_and_read_refuse_links(tmp_path):
  target = tmp_path / "target"
  target.write_text("kept")
  os.symlink(target, tmp_path / "link")
  for op in (
    lambda p: files.write_bytes(p, b"x"),
    lambda p: files.open_append(p).write(b"x"),
    files.read_bytes,
  ):
    with pytest.raises(files.LinkRefusedError):
      op(str(tmp_path / "link"))
  assert target.read_text() == "kept"
  files.write_bytes(str(tmp_path / "plain"), b"ab")
  with files.open_append(str(tmp_path / "plain")) as f:
    f.write(b"c")
  assert files.read_bytes(str(tmp_path / "plain")) == b"abc"


def test_output_dir_that_is_or_is_under_a_file(tmp_path):
  (tmp_path / "f").write_text("")
  assert files.not_a_directory(str(tmp_path / "new" / "dir")) == ""
  assert files.not_a_directory(str(tmp_path)) == ""
  assert files.not_a_directory(str(tmp_path / "f")) == "it is a regular file, not a directory"
  assert files.not_a_directory(str(tmp_path / "f" / "a" / "b")) == (
    f"it is under {tmp_path / 'f'}, which is not a directory"
  )
