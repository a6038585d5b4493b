"""Output directories of the conversion CLIs (and experiments/eval.py): checked before any work,
written whole or not at all.

`check(out, inputs=...)` refuses, in one line and before any work, an `out` that
  * is a file, or lies under one;
  * is, holds or (unless `inside_inputs`) lies inside one of the `inputs` (a CLI never writes
    into what it reads: an export into its own checkpoint overwrote the checkpoint's config);
  * is a non-empty directory, unless everything in it is in `replaceable` (the CLI's own
    earlier output) or `overwrite` is given and `is_own(out)` says it holds what this CLI
    writes (an earlier export, say; `--overwrite` never replaces an arbitrary directory): new
    files would otherwise mix with old ones, e.g. another model's safetensors shards beside
    this one's.

`staged(out)` yields a new temporary directory beside `out` (same filesystem) to write into.
When the block succeeds, the temporary directory takes `out`'s place by rename (an existing
`out` is renamed aside first and deleted after); when it fails (disk full, bad input found
late, Ctrl-C) it is deleted and `out` is left as it was. A process killed mid-write leaves a
`.<name>.partial-*` directory beside `out` (delete it), never a half-written `out`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Collection, Iterator, Sequence

from composer_jax.host import files


def _within(path: str, root: str) -> bool:
  return os.path.commonpath([path, root]) == root


def check(
  out: str,
  *,
  inputs: Sequence[str] = (),
  overwrite: bool = False,
  is_own: tuple[Callable[[str], bool], str] | None = None,
  replaceable: Collection[str] = (),
  inside_inputs: bool = False,
  flag: str = "--out",
) -> str:
  """The real path of `out`, after the checks of the module docstring.

  Raises:
    ValueError: one line naming `flag`, `out` and what to pass instead.
  """
  real = os.path.realpath(os.path.expanduser(out))
  if os.path.exists(real) and not os.path.isdir(real):
    raise ValueError(f"{flag} {out} is a file, not a directory; pass a new or empty directory")
  if why := files.not_a_directory(real):  # under a file: nothing could be made there
    raise ValueError(f"{flag} {out}: {why}; pass a new or empty directory")
  for given in inputs:
    src = os.path.realpath(os.path.expanduser(given))
    if _within(src, real):
      what = "is" if src == real else "holds"
      raise ValueError(
        f"{flag} {out} {what} the input {given}: pass another directory (the "
        "input is never written)"
      )
    if _within(real, src) and not inside_inputs:
      raise ValueError(
        f"{flag} {out} is inside the input {given}: pass a directory outside it "
        "(the input is never written)"
      )
  foreign = sorted(set(os.listdir(real)) - set(replaceable)) if os.path.isdir(real) else []
  if foreign and overwrite and is_own:
    own, what = is_own
    if not own(real):
      raise ValueError(
        f"{flag} {out} is not {what}, so --overwrite does not replace it; pass a "
        "new or empty directory"
      )
  elif foreign:
    hint = " or --overwrite to replace it" if is_own else ""
    raise ValueError(
      f"{flag} {out} is not empty (it holds {foreign[0]!r}"
      f"{f' and {len(foreign) - 1} more' if len(foreign) > 1 else ''}); pass a "
      f"new or empty directory{hint}"
    )
  return real


@contextlib.contextmanager
def staged(out: str) -> Iterator[str]:
  """A temporary directory that becomes `out` when the block succeeds (module docstring).
  `out` should come from `check`."""
  parent, name = os.path.split(os.path.abspath(out))
  os.makedirs(parent, exist_ok=True)
  tmp = tempfile.mkdtemp(prefix=f".{name}.partial-", dir=parent)
  try:
    yield tmp
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes it 0700; `out` gets the usual mode
  aside = None
  if os.path.lexists(out):
    aside = tempfile.mkdtemp(prefix=f".{name}.replaced-", dir=parent)
    os.replace(out, aside)  # an empty directory is replaced by rename
  os.replace(tmp, out)
  if aside:
    shutil.rmtree(aside, ignore_errors=True)


def _umask() -> int:
  mask = os.umask(0)
  os.umask(mask)
  return mask
