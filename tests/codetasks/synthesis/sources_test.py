"""Sources are hostile input (issue 42 item 2): a source directory's links are resolved and
refused when they leave the tree, special files and hard links out are refused, sdists go
through the standard library's data filter, and every bad source gets one line saying what
is wrong with it; nothing outside the source is ever copied into the work tree."""

import io
import os
import tarfile
import textwrap
import zipfile

import pytest

from composer_jax.codetasks.synthesis import generator, sources
from tests.codetasks.mini_project import FAST, MINI, requires_sandbox, write_project

SECRET = "cj-host-secret-b4f1"


@pytest.fixture
def secret(tmp_path):
  p = tmp_path / "host" / "secret.txt"
  p.parent.mkdir()
  p.write_text(SECRET)
  return p


def _project(root):
  (root / "pkg").mkdir(parents=True)
  (root / "pkg/__init__.py").write_text("X = 1\n")
  return root


def _no_secret(work):
  for dirpath, _, files in os.walk(work):
    for f in files:
      p = os.path.join(dirpath, f)
      assert os.path.islink(p) or SECRET not in open(p, errors="replace").read(), p


DIR_CASES = {
  "absolute link out": (lambda r, s: os.symlink(s, r / "pkg/s.txt"), "outside the source tree"),
  "relative link out": (
    lambda r, s: os.symlink(os.path.relpath(s, r / "pkg"), r / "pkg/s.txt"),
    "outside the source tree",
  ),
  "directory link out": (lambda r, s: os.symlink(s.parent, r / "pkg/host"), "outside"),
  "dangling link": (lambda r, s: os.symlink("nowhere", r / "pkg/n.py"), "dangling symlink"),
  "link loop": (
    lambda r, s: (os.symlink("b", r / "pkg/a"), os.symlink("a", r / "pkg/b")),
    "symlink loop",
  ),
  "link to an ancestor": (lambda r, s: os.symlink("..", r / "pkg/up"), "symlink loop"),
  "fifo": (lambda r, s: os.mkfifo(r / "pkg/f"), "pkg/f: a FIFO"),
  "hard link out": (lambda r, s: os.link(s, r / "pkg/h.txt"), "hard link to a file outside"),
  "1 GiB file (sparse)": (
    lambda r, s: os.truncate(_touch(r / "pkg/big.bin"), 1 << 30),
    "pkg/big.bin: a file of 1.0 GiB, over the 64.0 MiB limit",
  ),
  "latin-1 without a declaration": (
    lambda r, s: (r / "pkg/l.py").write_bytes("S = 'caf\xe9'\n".encode("latin-1")),
    r"pkg/l.py is not UTF-8 \(byte 0xe9 at offset 8\) and declares no encoding",
  ),
  "latin-1 declared": (
    lambda r, s: (r / "pkg/c.py").write_bytes(b"# -*- coding: latin-1 -*-\nS = 'caf\xe9'\n"),
    "pkg/c.py declares encoding 'iso-8859-1'; only UTF-8",
  ),
}


def _touch(p):
  p.touch()
  return p


@pytest.mark.parametrize("case", sorted(DIR_CASES))
def test_a_hostile_source_directory_gets_one_line(tmp_path, secret, case):
  make, why = DIR_CASES[case]
  root = _project(tmp_path / "proj")
  make(root, secret)
  work = tmp_path / "work"
  work.mkdir()
  with pytest.raises(ValueError, match=why) as e:
    sources.resolve(str(root), work)
  assert "\n" not in str(e.value)
  _no_secret(work)


def test_links_inside_the_tree_are_copied_as_their_targets(tmp_path):
  root = _project(tmp_path / "proj")
  os.symlink("__init__.py", root / "pkg/alias.py")
  os.symlink("pkg", root / "pkg2")
  src = sources.resolve(str(root), tmp_path / "work")
  for rel in ("pkg/alias.py", "pkg2/__init__.py"):
    assert not (src.path / rel).is_symlink() and (src.path / rel).read_text() == "X = 1\n"


def _tar(path, *members):
  with tarfile.open(path, "w:gz") as t:
    for name, kind, link in members:
      info = tarfile.TarInfo(name)
      info.type, info.linkname = kind, link
      data = b"X = 1\n" if kind == tarfile.REGTYPE else b""
      info.size = len(data)
      t.addfile(info, io.BytesIO(data) if data else None)
  return path


REG, SYM, HARD = tarfile.REGTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE
OK = ("p-1.0/pkg/__init__.py", REG, "")
ARCHIVES = {
  "traversal member": ([OK, ("p-1.0/../../evil.py", REG, "")], "OutsideDestinationError"),
  "absolute member": ([OK, ("/etc/cj-evil.py", REG, "")], "an absolute path"),
  "absolute link": ([OK, ("p-1.0/l", SYM, "/etc/passwd")], "AbsoluteLinkError"),
  "relative link out": ([OK, ("p-1.0/l", SYM, "../../x")], "LinkOutsideDestinationError"),
  "hard link out": ([OK, ("p-1.0/h", HARD, "../../etc/passwd")], "LinkOutsideDestination"),
  "device file": ([OK, ("p-1.0/d", tarfile.CHRTYPE, "")], "SpecialFileError"),
  "two top-level directories": (
    [OK, ("q-1.0/x.py", REG, "")],
    r"holds 2 top-level entries \(p-1.0, q-1.0\); an sdist holds exactly one",
  ),
}


@pytest.mark.parametrize("case", sorted(ARCHIVES))
def test_a_hostile_sdist_gets_one_line(tmp_path, case):
  members, why = ARCHIVES[case]
  archive = _tar(tmp_path / "p-1.0.tar.gz", *members)
  with pytest.raises(ValueError, match=why) as e:
    sources.resolve(str(archive), tmp_path / "work")
  assert str(e.value).startswith("source archive p-1.0.tar.gz: ") and "\n" not in str(e.value)
  assert not (tmp_path / "evil.py").exists() and not os.path.exists("/etc/cj-evil.py")


@pytest.mark.parametrize(
  "data,why",
  [
    (os.urandom(4096), "not a tar archive"),
    (b"", "an empty file, not an archive"),
  ],
  ids=["random bytes", "zero bytes"],
)
def test_an_sdist_that_is_no_archive_gets_one_line(tmp_path, data, why):
  (tmp_path / "p-1.0.tar.gz").write_bytes(data)
  with pytest.raises(ValueError, match=why) as e:
    sources.resolve(str(tmp_path / "p-1.0.tar.gz"), tmp_path / "work")
  assert "\n" not in str(e.value)


def test_a_zip_with_a_traversal_member_is_refused(tmp_path):
  with zipfile.ZipFile(tmp_path / "p-1.0.zip", "w") as z:
    z.writestr("p-1.0/pkg/__init__.py", "X = 1\n")
    z.writestr("p-1.0/../../evil.py", "pwned\n")
  with pytest.raises(ValueError, match="'p-1.0/../../evil.py' refused: a path outside"):
    sources.resolve(str(tmp_path / "p-1.0.zip"), tmp_path / "work")


def test_a_good_sdist_still_resolves(tmp_path):
  archive = _tar(tmp_path / "p-1.0.tar.gz", OK, ("p-1.0/pkg/alias.py", SYM, "__init__.py"))
  src = sources.resolve(str(archive), tmp_path / "work")
  assert (src.name, src.version, src.path.name) == ("p", "1.0", "p-1.0")
  assert (src.path / "pkg/__init__.py").read_text() == "X = 1\n"


@requires_sandbox
def test_a_missing_dependency_is_named(tmp_path):
  """A project whose modules import something neither it nor its pins provide: the baseline
  collects nothing, and the message names the missing module (it said 'has no tests')."""
  text = "import cj_missing_dependency\n" + textwrap.dedent(MINI["minipkg/text.py"])
  files = {**MINI, "minipkg/text.py": text}
  root = write_project(tmp_path / "minipkg-1.0", files)
  src = sources.resolve(str(root), tmp_path / "work")
  cfg = generator.Config(seed=0, max_tasks=1, baseline_runs=1, validation_runs=1, limits=FAST)
  with pytest.raises(ValueError, match="cannot import module 'cj_missing_dependency'") as e:
    generator.Generator(src, tmp_path / "work", cfg).prepare()
  assert "a dependency missing from the source's pinned deps" in str(e.value)
