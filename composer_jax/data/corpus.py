"""Local text corpus: file discovery, a stable train/validation split, one token stream.

The default corpus is the Python standard library's own `.py` sources (no network, present on
every machine, ~730 files / 12 MB for CPython 3.11 once tests are left out). A corpus is one
flat stream `[BOS doc_0 EOS][BOS doc_1 EOS]...` plus document boundaries; `packing.py` cuts
it into rows.
"""

import dataclasses
import functools
import hashlib
import os
import stat
import sysconfig
from collections.abc import Sequence

import numpy as np
from absl import logging

TEXT_SUFFIXES = (".py", ".txt", ".md")
# Never descended into: tests and their data (deliberately broken/odd files), third-party
# installs, caches and hidden directories such as .git or .venv.
SKIPPED_DIRS = frozenset(
  {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}
)


@dataclasses.dataclass(frozen=True)
class SourceFile:
  path: str  # Absolute path, used to read the file.
  key: str  # Path relative to the root it was found under: hashed for the split.


@dataclasses.dataclass(frozen=True)
class Corpus:
  """Documents concatenated with BOS/EOS.

  tokens: [T] int32, the stream; doc d occupies tokens[starts[d]:starts[d + 1]], starting with
    BOS and ending with EOS.
  starts: [D + 1] int64, document start offsets followed by T.
  """

  tokens: np.ndarray
  starts: np.ndarray


def _is_regular(path: str) -> bool:
  """A regular file (through links): FIFOs, sockets and devices are no corpus text (reading a
  FIFO would block the pipeline forever, a device never ends)."""
  try:
    return stat.S_ISREG(os.stat(path).st_mode)
  except OSError:  # a dangling link, or gone
    return False


def _walk(root: str, suffixes: Sequence[str]) -> list[SourceFile]:
  found, skipped = [], []
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames[:] = [d for d in dirnames if d not in SKIPPED_DIRS and not d.startswith(".")]
    for name in filenames:
      if name.endswith(tuple(suffixes)):
        path = os.path.join(dirpath, name)
        if _is_regular(path):
          found.append(SourceFile(path, os.path.relpath(path, root)))
        else:
          skipped.append(path)
  if skipped:
    logging.warning(
      "data path %s: skipped %d entries that are not regular files (FIFOs, devices, sockets, "
      "dangling links), e.g. %s",
      root,
      len(skipped),
      skipped[0],
    )
  return found


def parse_paths(paths: str | Sequence[str]) -> list[str]:
  """'a,b' or ['a', 'b'] -> ['a', 'b']; '' -> [] (the stdlib default)."""
  if isinstance(paths, str):
    paths = paths.split(",") if paths.strip() else []
  parsed = [str(p).strip() for p in paths]
  for p in parsed:
    if not p:
      raise ValueError(f"data paths {paths!r} contain an empty entry")
  return parsed


def discover_files(paths: str | Sequence[str]) -> list[SourceFile]:
  """Lists the corpus files in a deterministic (sorted by key, then path) order.

  Args:
    paths: '' for the stdlib `.py` sources; else files (taken as given) and directories
      (searched recursively for *.py, *.txt, *.md), comma-separated or as a list.
  """
  roots = parse_paths(paths)
  if not roots:
    stdlib = sysconfig.get_paths()["stdlib"]
    files = _walk(stdlib, (".py",))
    if not files:
      raise ValueError(f"no .py files found in the Python stdlib at {stdlib!r}")
    return sorted(files, key=lambda f: (f.key, f.path))
  files = []
  for root in roots:
    path = os.path.abspath(os.path.expanduser(root))
    if _is_regular(path):
      found = [SourceFile(path, os.path.basename(path))]
    elif os.path.isdir(path):
      found = _walk(path, TEXT_SUFFIXES)
    elif os.path.lexists(path):
      raise ValueError(
        f"data path {root!r} is neither a regular file nor a directory (a FIFO, device or "
        "dangling link); give text files or directories of them"
      )
    else:
      raise ValueError(f"data path {root!r} does not exist")
    if not found:
      raise ValueError(f"data path {root!r} has no {'/'.join(TEXT_SUFFIXES)} files")
    files.extend(found)
  return sorted(set(files), key=lambda f: (f.key, f.path))


def stable_fraction(key: str) -> float:
  """Maps a file key to [0, 1) via sha256, identical across processes, runs and machines."""
  return int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big") / 2**64


def split_files(
  files: Sequence[SourceFile], split: str, validation_fraction: float
) -> list[SourceFile]:
  """Keeps the files of one split: validation iff stable_fraction(key) < validation_fraction."""
  if not 0.0 <= validation_fraction < 1.0:
    raise ValueError(f"validation_fraction={validation_fraction} must be in [0, 1)")
  if split not in ("train", "validation"):
    raise ValueError(f"split={split!r}; valid: 'train', 'validation'")
  want_validation = split == "validation"
  return [f for f in files if (stable_fraction(f.key) < validation_fraction) == want_validation]


def _read(path: str) -> bytes:
  # O_NONBLOCK: a file swapped for a FIFO since discovery fails to read instead of blocking.
  with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), "rb") as f:
    if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
      raise ValueError(f"data file {path} is no longer a regular file")
    return f.read()


def build_corpus(files: Sequence[SourceFile], tokenizer) -> Corpus:
  """Reads and tokenizes `files` in order; empty files are skipped (they hold no text)."""
  texts = [text for text in map(_read, (f.path for f in files)) if text]
  docs = tokenizer.encode_documents(texts)
  lengths = np.array([len(d) + 2 for d in docs], dtype=np.int64)
  starts = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
  tokens = np.empty([int(starts[-1])], dtype=np.int32)
  for start, doc in zip(starts[:-1], docs):
    tokens[start] = tokenizer.bos_id
    tokens[start + 1 : start + 1 + len(doc)] = doc
    tokens[start + 1 + len(doc)] = tokenizer.eos_id
  return Corpus(tokens, starts)


def permute_documents(corpus: Corpus, order: np.ndarray) -> Corpus:
  """Reorders whole documents: doc i of the result is doc order[i] of `corpus`."""
  starts, ends = corpus.starts[:-1][order], corpus.starts[1:][order]
  tokens = np.concatenate([corpus.tokens[s:e] for s, e in zip(starts, ends)] or [corpus.tokens])
  return Corpus(tokens, np.concatenate([[0], np.cumsum(ends - starts, dtype=np.int64)]))


@functools.lru_cache(maxsize=4)
def _cached_corpus(files: tuple[SourceFile, ...], stamps: tuple, tokenizer) -> Corpus:
  del stamps  # Only part of the cache key: a changed file misses the cache.
  return build_corpus(files, tokenizer)


def load_corpus(files: Sequence[SourceFile], tokenizer) -> Corpus:
  """build_corpus, cached per process by (files, sizes, mtimes, tokenizer).

  Train and validation iterators, evaluation and restarts in one process share one read.
  """
  stamps = tuple((s.st_size, s.st_mtime_ns) for s in (os.stat(f.path) for f in files))
  return _cached_corpus(tuple(files), stamps, tokenizer)
