"""Byte-range edits of one source that keep the original line numbers, and random private
identifiers for the names a rewritten file adds."""

import random


class Splices:
  """Byte-range replacements in one source (ast offsets are UTF-8 byte columns)."""

  def __init__(self, src: bytes):
    self.src, self.edits = src, []
    self.starts = [0]
    for line in src.splitlines(keepends=True):
      self.starts.append(self.starts[-1] + len(line))

  def offset(self, line: int, col: int) -> int:
    return self.starts[line - 1] + col

  def span(self, node) -> tuple[int, int]:
    return (
      self.offset(node.lineno, node.col_offset),
      self.offset(node.end_lineno, node.end_col_offset),
    )

  def text(self, node) -> bytes:
    a, b = self.span(node)
    return self.src[a:b]

  def replace(self, a: int, b: int, new: bytes) -> None:
    self.edits.append((a, b, new))

  def apply(self) -> bytes:
    out, end = self.src, None
    for a, b, new in sorted(self.edits, reverse=True):
      if end is not None and b > end:
        raise ValueError("overlapping rewrites")
      out, end = out[:a] + new + out[b:], a
    return out


def ident(rng: random.Random) -> str:
  return "_" + "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(7))
