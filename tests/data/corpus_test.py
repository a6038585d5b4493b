"""File discovery, the stable split and the token stream."""

import hashlib
import os
import sysconfig

import numpy as np
import pytest

from composer_jax.data import corpus as corpus_lib
from composer_jax.data.tokenizer import ByteTokenizer


def _tree(root):
  for rel, text in {
    "b.py": "b",
    "a.txt": "a",
    "notes.md": "n",
    "data.json": "{}",
    "pkg/z.py": "z",
    "pkg/tests/t.py": "t",
    ".venv/v.py": "v",
    "pkg/__pycache__/c.py": "c",
  }.items():
    (root / rel).parent.mkdir(parents=True, exist_ok=True)
    (root / rel).write_text(text)


def test_discovers_text_files_recursively_in_sorted_order(tmp_path):
  _tree(tmp_path)
  keys = [f.key for f in corpus_lib.discover_files(str(tmp_path))]
  assert keys == ["a.txt", "b.py", "notes.md", "pkg/z.py"]


def test_comma_string_list_and_plain_file(tmp_path):
  _tree(tmp_path)
  as_string = corpus_lib.discover_files(f"{tmp_path / 'pkg'}, {tmp_path / 'data.json'}")
  as_list = corpus_lib.discover_files([str(tmp_path / "data.json"), str(tmp_path / "pkg")])
  assert as_string == as_list
  assert [f.key for f in as_list] == ["data.json", "z.py"]  # A plain file is taken as given.


def test_default_is_the_stdlib():
  files = corpus_lib.discover_files("")
  keys = [f.key for f in files]
  assert {"os.py", "json/decoder.py", "asyncio/tasks.py"} <= set(keys)
  assert keys == sorted(keys)
  assert all(f.path.startswith(sysconfig.get_paths()["stdlib"]) for f in files)
  assert not any(
    part in ("test", "tests", "site-packages") for k in keys for part in k.split("/")[:-1]
  )


@pytest.mark.parametrize(
  "paths, match",
  [
    ("{d}/missing", "missing.*does not exist"),
    ("{d}/empty_dir", "empty_dir.*has no"),
    ("{d}/empty_dir,,{d}/b.py", "empty entry"),
    (["{d}/b.py", " "], "empty entry"),
  ],
)
def test_bad_paths(tmp_path, paths, match):
  _tree(tmp_path)
  (tmp_path / "empty_dir").mkdir()
  fmt = lambda p: p.format(d=tmp_path)
  paths = fmt(paths) if isinstance(paths, str) else [fmt(p) for p in paths]
  with pytest.raises(ValueError, match=match):
    corpus_lib.discover_files(paths)


def test_split_is_disjoint_covering_and_stable():
  files = [corpus_lib.SourceFile(f"/anywhere/f{i}.py", f"f{i}.py") for i in range(12)]
  val = corpus_lib.split_files(files, "validation", 0.3)
  train = corpus_lib.split_files(files, "train", 0.3)
  # Golden split: sha256 of the relative path, so it never depends on PYTHONHASHSEED or host.
  assert [f.key for f in val] == ["f2.py", "f3.py", "f5.py"]
  assert sorted(val + train, key=lambda f: int(f.key[1:-3])) == files
  frac = int.from_bytes(hashlib.sha256(b"f2.py").digest()[:8], "big") / 2**64
  assert corpus_lib.stable_fraction("f2.py") == frac < 0.3


@pytest.mark.parametrize(
  "split, fraction, match",
  [
    ("train", 1.0, "validation_fraction"),
    ("train", -0.1, "validation_fraction"),
    ("test", 0.1, "split='test'"),
  ],
)
def test_bad_split_arguments(split, fraction, match):
  with pytest.raises(ValueError, match=match):
    corpus_lib.split_files([], split, fraction)


def test_build_corpus_byte_stream(tmp_path):
  for name, text in {"a.py": "ab", "b.py": "", "c.py": "c"}.items():
    (tmp_path / name).write_text(text)
  tok = ByteTokenizer()
  corpus = corpus_lib.load_corpus(corpus_lib.discover_files(str(tmp_path)), tok)
  # The empty file is skipped.
  np.testing.assert_array_equal(corpus.tokens, [256, 97, 98, 257, 256, 99, 257])
  np.testing.assert_array_equal(corpus.starts, [0, 4, 7])
  (tmp_path / "c.py").write_text("cd")  # A changed file is re-read, not served from cache.
  corpus = corpus_lib.load_corpus(corpus_lib.discover_files(str(tmp_path)), tok)
  np.testing.assert_array_equal(corpus.tokens[4:], [256, 99, 100, 257])


def test_permute_documents():
  corpus = corpus_lib.Corpus(np.array([1, 2, 3, 4, 5, 6], np.int32), np.array([0, 2, 3, 6]))
  permuted = corpus_lib.permute_documents(corpus, np.array([2, 0, 1]))
  np.testing.assert_array_equal(permuted.tokens, [4, 5, 6, 1, 2, 3])
  np.testing.assert_array_equal(permuted.starts, [0, 3, 5, 6])


def _bounded(fn, seconds=10):
  """fn() or a failure after `seconds` (a FIFO read would block the test forever)."""
  import signal

  def stuck(*_):
    raise AssertionError(f"blocked for {seconds} s")

  previous = signal.signal(signal.SIGALRM, stuck)
  signal.alarm(seconds)
  try:
    return fn()
  finally:
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def test_fifos_and_devices_in_a_corpus_dir_are_skipped_with_a_line(tmp_path, caplog):
  (tmp_path / "a.py").write_text("x = 1\n")
  os.mkfifo(tmp_path / "pipe.txt")  # no writer: a read blocks forever
  os.symlink("/dev/zero", tmp_path / "zeros.txt")  # a read never ends
  os.symlink(tmp_path / "gone.py", tmp_path / "dangling.py")
  with caplog.at_level("WARNING"):
    files = _bounded(lambda: corpus_lib.discover_files(str(tmp_path)))
  assert [f.key for f in files] == ["a.py"]
  assert "skipped 3 entries that are not regular files" in caplog.text
  corpus = _bounded(lambda: corpus_lib.build_corpus(files, ByteTokenizer()))
  assert len(corpus.starts) == 2


def test_a_fifo_given_as_the_data_path_is_one_line(tmp_path):
  os.mkfifo(tmp_path / "pipe.txt")
  with pytest.raises(ValueError, match="is neither a regular file nor a directory"):
    _bounded(lambda: corpus_lib.discover_files(str(tmp_path / "pipe.txt")))
