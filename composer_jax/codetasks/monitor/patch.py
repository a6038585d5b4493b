"""Unified/git diffs -> the before/after file texts the change rules judge.

With the base files (`base`: path -> text) a diff is applied exactly. Without them only the hunks
are known: a new file is whole, an edited one is reconstructed from its hunks (context + removed
lines before, context + added lines after), each hunk dedented, and a hunk that still does not
parse is reduced to its single lines that do. That is a best effort; callers holding the
workspace should use change.scan_change.
"""

import ast
import dataclasses
import hashlib
import re
import textwrap

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


@dataclasses.dataclass
class FileDiff:
  old: str | None  # None: the file is created
  new: str | None  # None: the file is deleted
  hunks: list[tuple[int, list[str]]] = dataclasses.field(default_factory=list)  # (old start, lines)
  binary: bool = False
  symlink: bool = False


def _path(p: str) -> str | None:
  p = p.split("\t")[0].strip()
  if p == "/dev/null":
    return None
  return p[2:] if p[:2] in ("a/", "b/") else p


def parse(patch: str) -> list[FileDiff]:
  files, cur = [], None
  lines = patch.splitlines()
  for i, ln in enumerate(lines):
    if ln.startswith("diff --git "):
      parts = ln.split(" ")
      cur = FileDiff(_path(parts[2]) if len(parts) > 3 else None, _path(parts[-1]))
      files.append(cur)
    elif ln.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
      old, new = _path(ln[4:]), _path(lines[i + 1][4:])
      if cur is None or cur.hunks:
        cur = FileDiff(old, new)
        files.append(cur)
      else:
        cur.old, cur.new = old, new
    elif ln.startswith("+++ ") and cur is not None:
      continue
    elif cur is not None and ln.startswith(("new file mode", "deleted file mode", "new mode")):
      cur.symlink = cur.symlink or ln.endswith(" 120000")
      if ln.startswith("new file"):
        cur.old = None
      else:
        cur.new = None
    elif cur is not None and ln.startswith(("rename to ", "copy to ")):
      cur.new = ln.split(" ", 2)[2]
    elif cur is not None and ln.startswith(("rename from ", "copy from ")):
      cur.old = ln.split(" ", 2)[2]
    elif cur is not None and (ln.startswith("GIT binary patch") or ln.startswith("Binary files")):
      cur.binary = True
    elif (m := _HUNK.match(ln)) and cur is not None:
      cur.hunks.append((int(m.group(1)), []))
    elif cur is not None and cur.hunks and ln[:1] in (" ", "+", "-", "\\", ""):
      cur.hunks[-1][1].append(ln)
  return files


def _side(lines: list[str], keep: str) -> list[str]:
  return [ln[1:] if ln else "" for ln in lines if ln[:1] in (" ", keep) or ln == ""]


def apply(text: str, fd: FileDiff) -> str | None:
  """The file after fd's hunks, or None if the context does not match."""
  src = text.splitlines()
  out, pos = [], 0
  for start, lines in fd.hunks:
    begin = max(start - 1, 0)
    old = _side(lines, "-")
    if src[begin : begin + len(old)] != old or begin < pos:
      return None
    out += src[pos:begin] + _side(lines, "+")
    pos = begin + len(old)
  return "\n".join(out + src[pos:]) + "\n"


def _fragment(lines: list[str]) -> str:
  text = textwrap.dedent("\n".join(lines))
  try:
    ast.parse(text)
    return text
  except (SyntaxError, ValueError):
    pass
  kept = []
  for ln in lines:
    s = ln.strip()
    s = s + " pass" if s.endswith(":") else s
    try:
      ast.parse(s)
    except (SyntaxError, ValueError):
      continue
    kept.append(s)
  return "\n".join(kept) + "\n"


def _reconstruct(fd: FileDiff, side: str) -> str:
  """One side of an edited file from its hunks alone (see the module docstring)."""
  raw = [_side(ln, side) for _, ln in fd.hunks]
  if not (fd.new or fd.old).endswith((".py", ".pyw")):
    return "\n".join("\n".join(r) for r in raw) + "\n"
  # The trailing comment keeps two sides apart whose parseable lines happen to agree.
  digest = hashlib.sha256(repr(raw).encode()).hexdigest()[:16]
  return "\n".join(_fragment(r) for r in raw) + f"\n# hunks {digest}\n"


def texts(patch: str, base=None) -> tuple[dict, dict, dict[str, str]]:
  """(before, after, {path: why unreadable}) of a diff (see the module docstring)."""
  before, after, unreadable = {}, {}, {}
  for fd in parse(patch):
    path = fd.new or fd.old
    if fd.binary or fd.symlink:
      target = "".join(_side(ln, "+")[0] for _, ln in fd.hunks if _side(ln, "+"))
      unreadable[path] = f"creates a symlink to {target}" if fd.symlink else "binary hunk"
      continue
    old_text = base.get(fd.old) if base is not None and fd.old else None
    applied = apply(old_text, fd) if old_text is not None else None
    if fd.old is None:
      after[path] = "\n".join(x for _, ln in fd.hunks for x in _side(ln, "+")) + "\n"
    elif applied is not None:
      before[fd.old], after[path] = old_text, applied
      if fd.new is None:
        del after[path]
    else:
      before[fd.old] = _reconstruct(fd, "-")
      if fd.new is not None:
        after[path] = _reconstruct(fd, "+")
  return before, after, unreadable
