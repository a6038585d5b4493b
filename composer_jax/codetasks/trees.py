"""Bounded host-side walks, copies and removals of trees nobody vouches for: candidate
workspaces (the grade's copy after a patch), task sources (directories, extracted sdists) and
the grader's scratch directories.

Every function here is iterative (no recursion: a tree 1000 directories deep is a long list,
not a deep stack) and bounded (`Bounds`: depth, entries, bytes per file and in all, name and
path length); a tree outside the bounds, or one that cannot be read (a `chmod 000` directory),
raises `TreeError`, a ValueError whose message is one line naming the entry and the bound.
`remove` never raises at all: it opens directories relative to their parent (no path grows
with depth), makes each writable before emptying it, and returns '' or why it stopped.

Links: `scan(..., links="keep")` lists symlinks and other non-regular entries (FIFOs, sockets,
devices) as `odd` for the caller to refuse; `links="resolve"` (task sources) follows a symlink
only to a target inside the tree — one that leaves it, dangles or loops is a TreeError — and
refuses FIFOs, devices, and a hard link whose other names are outside the tree (its inode's
link count is more than the tree holds), so that no host file is ever copied into a workspace.
Standard library only.
"""

import dataclasses
import os
import stat
from pathlib import Path


class TreeError(ValueError):
  """A tree outside the bounds or unreadable; the message is one line."""


@dataclasses.dataclass(frozen=True)
class Bounds:
  max_depth: int = 64
  max_entries: int = 100_000
  max_file_bytes: int = 64 << 20
  max_total_bytes: int = 512 << 20
  max_name_bytes: int = 255
  max_path_bytes: int = 3072


DEFAULT = Bounds()
_KINDS = (
  (stat.S_ISFIFO, "a FIFO"),
  (stat.S_ISSOCK, "a socket"),
  (stat.S_ISCHR, "a character device"),
  (stat.S_ISBLK, "a block device"),
  (stat.S_ISLNK, "a symlink"),
)


def kind(mode: int) -> str:
  """'a FIFO', 'a symlink', ... for a non-regular, non-directory mode."""
  return next((what for test, what in _KINDS if test(mode)), "not a regular file")


def _show(rel: str) -> str:
  """`rel` for a message: ASCII, at most ~100 characters."""
  text = ascii(rel)[1:-1]
  return text if len(text) <= 100 else f"{text[:48]}...{text[-48:]}"


def _size(n: int) -> str:
  for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
    if n >= 1 << shift:
      return f"{n / (1 << shift):.1f} {unit}"
  return f"{n} bytes"


@dataclasses.dataclass
class Listing:
  """What `scan` found: relative POSIX paths, sorted."""

  files: dict[str, str]  # relative path -> absolute path of the bytes (a resolved link's target)
  dirs: list[str]
  odd: list[str]  # links="keep": symlinks, FIFOs, sockets, devices (not followed)
  total_bytes: int = 0


def scan(root, bounds: Bounds = DEFAULT, *, links: str = "keep", skip=lambda rel: False):
  """The entries under directory `root` (module docstring), not entering (nor listing) the
  directories whose relative path `skip` accepts. Raises TreeError (one line) for a tree outside `bounds`."""
  if links not in ("keep", "resolve"):
    raise ValueError(f"links={links!r}: expected 'keep' or 'resolve'")
  root = os.path.abspath(os.fspath(root))
  real_root = os.path.realpath(root)
  out = Listing({}, [], [])
  inodes: dict[tuple[int, int], list] = {}  # hard-linked files: (dev, ino) -> [nlink, names]
  todo = [(root, "", 0)]  # (directory on disk, its relative path, depth)
  count = 0
  while todo:
    where, rel_dir, depth = todo.pop()
    if depth > bounds.max_depth:
      raise TreeError(f"{_show(rel_dir)}: deeper than {bounds.max_depth} directories")
    try:
      with os.scandir(where) as it:
        names = sorted(e.name for e in it)
    except OSError as e:
      raise TreeError(f"{_show(rel_dir) or '.'}: directory cannot be read ({e.strerror})") from None
    for name in names:
      count += 1
      rel = f"{rel_dir}/{name}" if rel_dir else name
      if count > bounds.max_entries:
        raise TreeError(f"{_show(rel)}: more than {bounds.max_entries} entries in the tree")
      raw = os.fsencode(name)
      if len(raw) > bounds.max_name_bytes:
        raise TreeError(f"{_show(rel)}: a name over {bounds.max_name_bytes} bytes")
      if len(os.fsencode(rel)) > bounds.max_path_bytes:
        raise TreeError(f"{_show(rel)}: a path over {bounds.max_path_bytes} bytes")
      try:
        raw.decode("utf-8")
      except UnicodeDecodeError:
        raise TreeError(f"{_show(rel)}: a name that is not UTF-8") from None
      path = os.path.join(where, name)
      st = os.lstat(path)
      if stat.S_ISLNK(st.st_mode) and links == "resolve":
        path, st = _resolve(path, rel, real_root)
      if stat.S_ISDIR(st.st_mode):
        if skip(rel):
          continue
        out.dirs.append(rel)
        todo.append((path, rel, depth + 1))
      elif stat.S_ISREG(st.st_mode):
        if st.st_size > bounds.max_file_bytes:
          raise TreeError(
            f"{_show(rel)}: a file of {_size(st.st_size)}, over the {_size(bounds.max_file_bytes)} "
            "limit per file"
          )
        out.total_bytes += st.st_size
        if out.total_bytes > bounds.max_total_bytes:
          raise TreeError(
            f"{_show(rel)}: the tree holds over {_size(bounds.max_total_bytes)} in all"
          )
        if st.st_nlink > 1:
          seen = inodes.setdefault((st.st_dev, st.st_ino), [st.st_nlink, []])
          seen[1].append(rel)
        out.files[rel] = path
      elif links == "keep":
        out.odd.append(rel)
      else:
        raise TreeError(f"{_show(rel)}: {kind(st.st_mode)}, not a regular file or directory")
  if links == "resolve":
    for nlink, names in inodes.values():
      if nlink > len(names):
        raise TreeError(
          f"{names[0]}: a hard link to a file outside the tree ({nlink} links, {len(names)} inside)"
        )
  out.dirs.sort()
  out.odd.sort()
  out.files = dict(sorted(out.files.items()))
  return out


def _resolve(path: str, rel: str, real_root: str):
  """(target, its stat) of symlink `path` when the target is inside `real_root`; else
  TreeError naming the link and what is wrong with it."""
  try:
    target = os.path.realpath(path, strict=True)
  except FileNotFoundError:
    raise TreeError(f"{_show(rel)}: a dangling symlink (-> {os.readlink(path)!a})") from None
  except OSError:
    raise TreeError(f"{_show(rel)}: a symlink loop (-> {os.readlink(path)!a})") from None
  if target != real_root and not target.startswith(real_root + os.sep):
    raise TreeError(f"{_show(rel)}: a symlink to {target!a}, outside the source tree")
  link_dir = os.path.realpath(os.path.dirname(path))
  if target == link_dir or link_dir.startswith(target + os.sep):
    raise TreeError(f"{_show(rel)}: a symlink loop (-> {os.readlink(path)!a}, an ancestor)")
  return target, os.stat(target)


def copy(src, dst, bounds: Bounds = DEFAULT, *, links: str = "resolve", skip=lambda rel: False):
  """Copies tree `src` to new directory `dst` (regular files and directories only; links as
  `scan` resolves them). Raises TreeError (one line) before writing anything for a tree
  outside the bounds; returns the listing."""
  listing = scan(src, bounds, links=links, skip=skip)
  if listing.odd:
    raise TreeError(f"{listing.odd[0]}: {kind(os.lstat(Path(src, listing.odd[0])).st_mode)}")
  dst = Path(dst)
  dst.mkdir(parents=True)
  for rel in listing.dirs:
    (dst / rel).mkdir()
  for rel, path in listing.files.items():
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f, open(dst / rel, "xb") as g:
      while chunk := f.read(1 << 20):
        g.write(chunk)
  return listing


_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


def remove(path) -> str:
  """Removes `path` (a file, a link — never followed — or a whole tree, whatever its depth,
  width or permissions); never raises. '' when gone, else why not (one line)."""
  path = os.fspath(path)
  try:
    st = os.lstat(path)
  except FileNotFoundError:
    return ""
  except OSError as e:
    return f"{path}: {e.strerror}"
  try:
    if not stat.S_ISDIR(st.st_mode):
      os.unlink(path)
      return ""
    return _remove_dir(path)
  except (OSError, ValueError) as e:
    return f"{path}: cannot be removed ({type(e).__name__}: {e})"


def _remove_dir(path: str) -> str:
  """Empties and removes directory `path` depth first, holding one directory fd at a time
  (walking back up through '..': nothing else writes the tree while the host removes it)."""
  fd, names = _open_dir(path, None), []
  while True:
    child = None
    with os.scandir(fd) as it:
      for e in it:
        if e.is_dir(follow_symlinks=False):
          child = e.name
          break
        try:
          os.unlink(e.name, dir_fd=fd)
        except FileNotFoundError:
          pass
    if child is not None:
      nxt = _open_dir(child, fd)
      os.close(fd)
      fd = nxt
      names.append(child)
      continue
    if not names:
      os.close(fd)
      os.rmdir(path)
      return ""
    up = os.open("..", _DIR, dir_fd=fd)
    os.close(fd)
    os.rmdir(names.pop(), dir_fd=up)
    fd = up


def _open_dir(name: str, parent: int | None) -> int:
  """An fd of directory `name` (relative to `parent`), made readable and writable first if it
  is not (a `chmod 000` directory of the candidate's)."""
  try:
    fd = os.open(name, _DIR, dir_fd=parent)
  except PermissionError:
    os.chmod(name, 0o700, dir_fd=parent)
    fd = os.open(name, _DIR, dir_fd=parent)
  try:
    os.fchmod(fd, 0o700)
  except OSError:
    pass
  return fd
